"""The swarm on a real Ray: a three-node local cluster with device resources.

One swarm run (module fixture) is checked from several sides: the placement
Ray reports against the plan, every turn's tokens against the engine run
alone, the dashboard's HTTP API and a screenshot of its actor page, the
memory cap of a virtual worker. A second run loses a worker mid-turn.
Every Ray call has a timeout; the module leaves no Ray process behind.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # the dashboard is read without a token in these tests

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from swarm import planner, scheduler  # noqa: E402
from swarm.config import load_config  # noqa: E402
from swarm.launch import launch, rebuild_history  # noqa: E402
from swarm.runtime.agents import JOIN_CHECK_S  # noqa: E402

RAY_PROCESSES = ("raylet", "gcs_server", "dashboard.py", "dashboard_agent", "runtime_env_agent")
NODE_KV = 2 * 10**9
MAX_NEW = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_processes(session_dir: str | None = None) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10).stdout
    lines = [ln for ln in out.splitlines()[1:] if any(p in ln for p in RAY_PROCESSES) and "ps -eo" not in ln]
    return [ln for ln in lines if session_dir is None or session_dir in ln]


@pytest.fixture(scope="module")
def cluster():
    port = _free_port()
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"device:x86-host": 1, scheduler.KV_RESOURCE: NODE_KV},
                        "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port},
    )  # fmt: skip
    c.add_node(num_cpus=1, resources={"device:rk3588": 1, scheduler.KV_RESOURCE: NODE_KV})
    c.add_node(num_cpus=1, resources={"device:raspberry-pi-5": 1, scheduler.KV_RESOURCE: NODE_KV})
    c.wait_for_nodes(timeout=60)
    c.dashboard_port = port  # type: ignore[attr-defined]
    session = c.head_node.get_session_dir_path()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()
    deadline = time.monotonic() + 20
    while _ray_processes(session) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes(session), f"Ray processes left behind: {_ray_processes(session)}"


def _config(name: str, cap: int) -> Any:
    return load_config(
        {
            "name": name,
            "agents": [
                {"name": "researcher", "count": 3, "context": 256, "system_prompt": "You are terse.",
                 "tasks": ["Name one planet.", "Name one more."], "max_new_tokens": MAX_NEW},
                {"name": "critic", "count": 1, "context": 768, "inputs_from": "researcher",
                 "tasks": ["Which answer is best?"], "max_new_tokens": MAX_NEW},
                {"name": "long", "count": 1, "context": 4096, "tasks": ["Say hello."], "max_new_tokens": MAX_NEW},
            ],
            "workers": [
                {"name": "head", "kind": "cluster", "device": "x86-host", "calibration": "catalog"},
                {"name": "board", "kind": "cluster", "device": "rk3588", "calibration": "catalog"},
                {"name": "pi", "kind": "cluster", "device": "raspberry-pi-5", "calibration": "catalog"},
                {"name": "capped", "kind": "virtual", "device": "raspberry-pi-5", "memory": cap},
            ],
            "policy": {"formats": ["f16", "q8_0", "q4_0"]},
            "engine": {"threads": 1},
        }
    )  # fmt: skip


def _cap_bytes() -> int:
    """A memory cap that holds the weights, scratch and short agents' KV, not the 4,096-token agent."""
    from swarm.gguf_header import read_geometry
    from worker.models import default_model_path

    geom = read_geometry(default_model_path())
    per_token_q4 = geom.kv_bytes_per_token(("q4_0", "q4_0"))
    scratch = planner.scratch_bytes(geom, planner.EngineSettings(threads=1), 4, 4096)
    return geom.resident_bytes + scratch + 3000 * per_token_q4


def _snapshot(c: Cluster, swarm: str, out: dict[str, Any]) -> None:
    """What Ray, its dashboard and `swarm status` say while the swarm runs."""
    out["placement"] = scheduler.placement(swarm)
    out["nodes"] = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    url = f"http://127.0.0.1:{c.dashboard_port}"
    with urllib.request.urlopen(f"{url}/api/v0/actors?detail=1&limit=1000", timeout=30) as r:
        out["dashboard_actors"] = json.loads(r.read())["data"]["result"]["result"]
    with urllib.request.urlopen(f"{url}/api/v0/placement_groups?detail=1&limit=1000", timeout=30) as r:
        out["dashboard_pgs"] = json.loads(r.read())["data"]["result"]["result"]
    status = subprocess.run(
        [sys.executable, "-m", "swarm.cli", "status", "--address", c.address],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out["status"] = status.stdout + status.stderr
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        shot = Path(out["tmp"]) / "dashboard-actors.png"
        args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000",
                "--virtual-time-budget=15000"]  # fmt: skip
        subprocess.run(args + [f"--screenshot={shot}", f"{url}/#/actors"], capture_output=True, timeout=120)
        dom = subprocess.run(args + ["--dump-dom", f"{url}/#/actors"], capture_output=True, text=True, timeout=120)
        out["screenshot"], out["dom"] = shot, dom.stdout


@pytest.fixture(scope="module")
def swarm_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("swarm")
    cap = _cap_bytes()
    cfg = _config("t3", cap)
    snap: dict[str, Any] = {"tmp": str(tmp)}
    state: dict[str, Any] = {}

    def on_tick(run: Any) -> None:
        # Snapshot once every agent holds its reservation and a turn has begun (from a thread: it is slow).
        if "thread" not in state and run.plan is not None and any(a.tokens_generated for a in run.agents.values()):
            t = threading.Thread(target=_snapshot, args=(cluster, cfg.name, snap), daemon=True)
            t.start()
            state["thread"] = t
            state["plan"] = run.plan
            state["specs"] = {n: h.spec for n, h in run.sched.workers.items()}
        if "thread" in state and state["thread"].is_alive():
            time.sleep(0.2)  # keep the swarm up while the snapshot is taken

    summary = launch(cfg, address=cluster.address, out_dir=tmp / "out", live=False, timeout_s=600, on_tick=on_tick,
                     echo=lambda m: None)  # fmt: skip
    assert "thread" in state, "the swarm ended before any token was made"
    state["thread"].join(timeout=300)
    return {"summary": summary, "snap": snap, "cfg": cfg, "cap": cap, "out": tmp / "out", **state}


def test_workers_and_agent_bundles_sit_where_the_plan_says(cluster: Cluster, swarm_run: dict[str, Any]) -> None:
    snap, plan = swarm_run["snap"], swarm_run["plan"]
    nodes = snap["nodes"]
    device_node = {k: nid for nid, res in nodes.items() for k in res if k.startswith("device:")}
    head_node = device_node["device:x86-host"]
    workers = snap["placement"]["workers"]
    planned = {wp.worker: wp for wp in plan.workers if wp.agents > 0}
    assert set(workers) == {f"t3.{w}" for w in planned}
    for w in planned:
        kind = {"head": "x86-host", "board": "rk3588", "pi": "raspberry-pi-5", "capped": None}[w]
        expect_node = head_node if kind is None else device_node[f"device:{kind}"]  # virtual: the driver's node
        assert workers[f"t3.{w}"]["node_id"] == expect_node, w
    # Every agent's KV bundle is on its worker's node, in that worker's group, with the plan's count per group.
    bundles = {}
    for g in snap["placement"]["placement_groups"]:
        for b in g["bundles"]:
            if b["label"] != "worker" and not b["label"].endswith(".prefix"):
                bundles[b["label"]] = (g["worker"], b["node_id"])
    agents = swarm_run["summary"]["agents"]
    assert set(bundles) == set(agents)
    for name, (w, node) in bundles.items():
        assert node == workers[f"t3.{w}"]["node_id"]
        assert agents[name]["worker"] == w
    for wp in plan.workers:
        for g in wp.groups:
            assert sum(1 for n, (w, _) in bundles.items() if w == wp.worker and n.startswith(g.group + "-")) == g.agents


def test_every_turn_completes_with_the_tokens_the_engine_makes_alone(swarm_run: dict[str, Any]) -> None:
    from worker.engine import Engine, Sampling

    summary, out, specs = swarm_run["summary"], swarm_run["out"], swarm_run["specs"]
    cfg = swarm_run["cfg"]
    turns = {g.name: max(len(g.tasks), 1) for g in cfg.agents}
    engines: dict[tuple[str, str], Engine] = {}
    for name, a in summary["agents"].items():
        assert a["finish"] == "done" and a["turns"] == turns[a["group"]], name
        records = [json.loads(ln) for ln in (out / "agents" / f"{name}.jsonl").read_text().splitlines()]
        replies = [r for r in records if r["role"] == "assistant"]
        assert len(replies) == turns[a["group"]]
        spec = specs[a["worker"]]
        eng = engines.setdefault((spec.kv_k, spec.kv_v), Engine(kv_k=spec.kv_k, kv_v=spec.kv_v, threads=1))
        stop = tuple(sorted(eng.tokenizer.eot_ids))
        for r in replies:
            # The prompt of each turn is the history before its reply; the engine alone must reply the same.
            prompt = rebuild_history(out / "agents" / f"{name}.jsonl", upto_turn=r["turn"])
            assert len(prompt) == r["history_tokens"] - r["tokens"]
            seq = eng.add_sequence(prompt, Sampling(max_new_tokens=MAX_NEW, stop_tokens=stop))
            made: list[int] = []
            while eng.info(seq)["generating"]:
                made += [t for s, t in eng.step().items() if s == seq]
            eng.free(seq)
            assert r["token_ids"] == made, f"{name} turn {r['turn']}"
            assert len(made) == MAX_NEW or made[-1] in eng.tokenizer.eot_ids
        assert len(rebuild_history(out / "agents" / f"{name}.jsonl")) == replies[-1]["history_tokens"]


def test_dashboard_lists_the_named_workers_with_their_nodes(swarm_run: dict[str, Any]) -> None:
    snap = swarm_run["snap"]
    by_name = {a["name"]: a for a in snap["dashboard_actors"] if a.get("name", "").startswith("t3.")}
    assert set(by_name) == set(snap["placement"]["workers"])
    for name, a in by_name.items():
        assert a["state"] == "ALIVE"
        assert a["node_id"] == snap["placement"]["workers"][name]["node_id"]
        worker = name.split(".", 1)[1]
        assert a["repr_name"].startswith(f"EngineWorker({worker} on "), a["repr_name"]
    pg_names = [g["placement_group_name"] if "placement_group_name" in g else g.get("name") for g in
                snap["dashboard_pgs"]]  # fmt: skip
    assert any(n and n.startswith("kvswarm.t3/") and " kv1: " in n for n in pg_names)
    assert "t3." in snap["status"] and "KV used" in snap["status"], snap["status"]


def test_dashboard_actor_page_shows_the_workers(swarm_run: dict[str, Any]) -> None:
    snap = swarm_run["snap"]
    if "screenshot" not in snap:
        if os.environ.get("KVSWARM_REQUIRE_CHROMIUM"):
            pytest.fail("Chromium is required here (KVSWARM_REQUIRE_CHROMIUM) but is not installed")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    png = snap["screenshot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for name in snap["placement"]["workers"]:
        assert name in snap["dom"], f"{name} missing from the rendered actor page"
    keep = os.environ.get("KVSWARM_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(snap["screenshot"], Path(keep) / "dashboard-actors.png")


def test_virtual_memory_cap_is_enforced(swarm_run: dict[str, Any]) -> None:
    summary, snap, cap = swarm_run["summary"], swarm_run["snap"], swarm_run["cap"]
    assert summary["agents"]["long-0"]["worker"] != "capped"
    plan = swarm_run["plan"]
    for wp in plan.workers:
        if wp.worker == "capped":
            assert wp.memory_bytes <= cap
            assert all(g.group != "long" for g in wp.groups)
    spec = swarm_run["specs"].get("capped")
    if spec is not None:  # the plan used the capped worker: Ray holds no more KV for it than its budget
        held = [b for g in snap["placement"]["placement_groups"] if g["worker"] == "capped" for b in g["bundles"]]
        assert "long-0" not in [b["label"] for b in held]
        assert sum(b["kv_bytes"] for b in held) <= spec.kv_budget_bytes <= cap


def test_reservation_over_a_workers_budget_is_refused(cluster: Cluster) -> None:
    from worker.service import WorkerSpec

    conn = scheduler.connect(cluster.address, kv_bytes=0)
    try:
        sched = scheduler.Scheduler("cap", conn)
        spec = WorkerSpec(name="v", kind="virtual", device="raspberry-pi-5", model="default", kv_k="q4_0",
                          kv_v="q4_0", kv_budget_bytes=1 << 20, threads=1, swarm="cap")  # fmt: skip
        sched.start_workers([(spec, 200 << 20)])
        with pytest.raises(scheduler.SchedulerError, match="exceed its KV budget"):
            sched.reserve("v", [scheduler.Reservation("a-0", 1 << 20), scheduler.Reservation("a-1", 1)])
        sched.reserve("v", [scheduler.Reservation("a-0", 1 << 19), scheduler.Reservation("a-1", 1 << 19)])
        where = scheduler.placement("cap")
        held = [b for g in where["placement_groups"] if " kv" in g["name"] for b in g["bundles"]]
        assert [(b["label"], b["kv_bytes"]) for b in held] == [("a-0", 1 << 19), ("a-1", 1 << 19)]
        sched.shutdown()
        assert scheduler.placement("cap") == {"workers": {}, "placement_groups": []}
    finally:
        scheduler.disconnect(conn)


def test_a_lost_worker_moves_its_agents_and_no_token_is_lost(cluster: Cluster, tmp_path: Path) -> None:
    cfg = _config("t3loss", _cap_bytes())
    killed: dict[str, Any] = {}

    def on_tick(run: Any) -> None:
        if killed:
            return
        for a in run.agents.values():  # kill a worker while one of its agents is mid-turn
            if a.turn is not None and a.turn.reply and a.worker in run.sched.workers and a.worker != "head":
                killed.update(worker=a.worker, agent=a.name, made=len(a.turn.reply))
                run.sched.kill(a.worker)
                return

    summary = launch(cfg, address=cluster.address, out_dir=tmp_path, live=False, timeout_s=600, on_tick=on_tick,
                     echo=lambda m: None)  # fmt: skip
    assert killed, "no worker was mid-turn to kill"
    assert any(e["event"] == "worker_lost" and e["worker"] == killed["worker"] for e in summary["events"])
    moved = [e for e in summary["events"] if e["event"] == "moved" and e["agent"] == killed["agent"] and e["dst"]]
    assert moved, summary["events"]
    for name, a in summary["agents"].items():
        assert a["finish"] == "done", name
        assert a["worker"] != killed["worker"]
        records = [json.loads(ln) for ln in (tmp_path / "agents" / f"{name}.jsonl").read_text().splitlines()]
        for r in records:
            if r["role"] == "assistant":
                assert r["tokens"] == MAX_NEW or r["token_ids"][-1] in (0, 2), (name, r)
    rec = [json.loads(ln) for ln in (tmp_path / "agents" / f"{killed['agent']}.jsonl").read_text().splitlines()]
    resumed = [r for r in rec if r["role"] == "assistant" and r["resumed"]]
    assert resumed and len(resumed[0]["token_ids"]) >= killed["made"]


def test_metrics_reach_rays_prometheus_endpoint(cluster: Cluster) -> None:
    from worker.service import WorkerSpec

    conn = scheduler.connect(cluster.address, kv_bytes=0)
    try:
        sched = scheduler.Scheduler("metrics", conn)
        spec = WorkerSpec(name="m", kind="cluster", device="rk3588", model="default", kv_k="q8_0", kv_v="q8_0",
                          kv_budget_bytes=8 << 20, threads=1, swarm="metrics")  # fmt: skip
        sched.start_workers([(spec, 200 << 20)])
        sched.submit("m", "s", 0, [1, 2, 3, 4], {"max_new_tokens": 8}, True)
        node = sched.workers["m"].node_id
        port = next(n["MetricsExportPort"] for n in ray.nodes() if n["NodeID"] == node)
        deadline, text = time.monotonic() + 90, ""
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            if "kvswarm_tokens_generated" in text and 'worker="m"' in text:
                break
            time.sleep(2)
        lines = [ln for ln in text.splitlines() if "kvswarm_tokens_generated" in ln and not ln.startswith("#")]
        assert lines, "kvswarm_tokens_generated never appeared on the node's /metrics"
        assert any('kv_format="q8_0"' in ln and float(ln.rsplit(" ", 1)[1]) == 8 for ln in lines), lines
        for metric in ("kvswarm_kv_bytes_reserved", "kvswarm_active_agents", "kvswarm_queue_depth"):
            assert metric in text
        sched.shutdown()
    finally:
        scheduler.disconnect(conn)


def test_a_worker_that_joins_mid_run_is_planned_in(cluster: Cluster, tmp_path: Path) -> None:
    cfg = load_config(
        {
            "name": "t3join",
            "agents": [{"name": "a", "count": 4, "context": 256, "max_new_tokens": MAX_NEW,
                        "tasks": ["Name a color.", "Name another.", "And one more."]}],
            "workers": [
                {"name": "head", "kind": "cluster", "device": "x86-host", "calibration": "catalog"},
                {"name": "late", "kind": "cluster", "device": "apple-m2", "calibration": "catalog"},
            ],
            "policy": {"formats": ["q8_0"]},
            "engine": {"threads": 1},
        }
    )  # fmt: skip
    added: dict[str, Any] = {}

    # The node joins while the first turns run. Turns start only at the loop's ticks, and this hook holds the
    # loop until Ray lists the node and a join check is due (one every JOIN_CHECK_S), so the next tick starts
    # the second turns and sees the node in the same pass, whatever the engine's speed (waiting for tokens
    # instead let a fast engine finish every turn while the node was starting).
    def on_tick(run: Any) -> None:
        if not added and any(a.turn is not None for a in run.agents.values()):
            t0 = time.monotonic()
            added["node"] = cluster.add_node(
                num_cpus=1, resources={"device:apple-m2": 1, scheduler.KV_RESOURCE: NODE_KV}
            )
            cluster.wait_for_nodes(timeout=60)
            time.sleep(max(0.0, t0 + JOIN_CHECK_S + 0.1 - time.monotonic()))

    try:
        summary = launch(cfg, address=cluster.address, out_dir=tmp_path, live=False, timeout_s=600,
                         on_tick=on_tick, echo=lambda m: None)  # fmt: skip
    finally:
        if "node" in added:
            cluster.remove_node(added["node"])
    kinds = [e["event"] for e in summary["events"]]
    assert "worker_joined" in kinds, summary["events"]
    joined = kinds.index("worker_joined")
    assert summary["events"][joined + 1]["event"] in ("placed", "moved")
    placed_after = [e for e in summary["events"][joined:] if e["event"] == "placed"]
    assert placed_after and any(w["worker"] == "late" and w["agents"] for w in placed_after[0]["plan"])
    assert all(a["finish"] == "done" and a["turns"] == 3 for a in summary["agents"].values())
    assert any(a["worker"] == "late" for a in summary["agents"].values())


def test_a_removed_node_moves_its_agents_and_status_shows_it(cluster: Cluster, tmp_path: Path) -> None:
    node = cluster.add_node(num_cpus=1, resources={"device:apple-m4-max": 1, scheduler.KV_RESOURCE: NODE_KV})
    cluster.wait_for_nodes(timeout=60)
    cfg = load_config(
        {
            "name": "t3node",
            "agents": [{"name": "a", "count": 4, "context": 256, "max_new_tokens": MAX_NEW,
                        "tasks": ["Name a color.", "Name another.", "And one more."]}],
            "workers": [
                {"name": "head", "kind": "cluster", "device": "x86-host", "calibration": "catalog"},
                {"name": "doomed", "kind": "cluster", "device": "apple-m4-max", "calibration": "catalog"},
            ],
            "policy": {"formats": ["q8_0"]},
            "engine": {"threads": 1},
        }
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def on_tick(run: Any) -> None:
        if "removed" not in seen and any(a.worker == "doomed" and a.tokens_generated for a in run.agents.values()):
            seen["removed"] = [a.name for a in run.agents.values() if a.worker == "doomed"]
            cluster.remove_node(node)  # the machine goes away with its worker
        if "removed" in seen and "after" not in seen and any(e["event"] == "worker_lost" for e in run.events):
            seen["after"] = scheduler.placement("t3node")
            status = subprocess.run([sys.executable, "-m", "swarm.cli", "status", "--address", cluster.address],
                                    capture_output=True, text=True, timeout=120)  # fmt: skip
            seen["status"] = status.stdout
            url = f"http://127.0.0.1:{cluster.dashboard_port}/api/v0/actors?detail=1&limit=1000"
            with urllib.request.urlopen(url, timeout=30) as r:
                seen["dashboard"] = json.loads(r.read())["data"]["result"]["result"]

    summary = launch(cfg, address=cluster.address, out_dir=tmp_path, live=False, timeout_s=600, on_tick=on_tick,
                     echo=lambda m: None)  # fmt: skip
    assert seen.get("removed"), "no agent was placed on the node before it went away"
    assert all(a["finish"] == "done" and a["turns"] == 3 for a in summary["agents"].values())
    assert all(summary["agents"][n]["worker"] == "head" for n in seen["removed"])
    assert any(e["event"] == "worker_lost" and e["worker"] == "doomed" for e in summary["events"])
    assert {e["agent"] for e in summary["events"] if e["event"] == "moved" and e["src"] == "doomed"} == set(
        seen["removed"]
    )
    assert set(seen["after"]["workers"]) == {"t3node.head"}
    assert "t3node.head" in seen["status"] and "t3node.doomed" not in seen["status"]
    alive = {a["name"] for a in seen["dashboard"] if a["state"] == "ALIVE" and a.get("name", "").startswith("t3node")}
    assert alive == {"t3node.head"}
    bundles = [b for g in seen["after"]["placement_groups"] for b in g["bundles"]]
    assert {b["label"] for b in bundles if b["label"].startswith("a-")} <= set(summary["agents"])
    assert all(b["node_id"] == seen["after"]["workers"]["t3node.head"]["node_id"] for b in bundles)


def test_cluster_workers_measure_themselves_and_the_plan_uses_it(cluster: Cluster, tmp_path: Path) -> None:
    cfg = load_config(
        {
            "name": "t3cal",
            "agents": [{"name": "a", "count": 2, "context": 256, "max_new_tokens": MAX_NEW, "tasks": ["Say hi."]}],
            "workers": [
                {"name": "head", "kind": "cluster", "device": "x86-host", "calibration": "quick"},
                {"name": "board", "kind": "cluster", "device": "rk3588", "calibration": "catalog"},
            ],
            "policy": {"formats": ["q8_0", "f16"]},
            "engine": {"threads": 1},
        }
    )  # fmt: skip
    summary = launch(cfg, address=cluster.address, out_dir=tmp_path, live=False, timeout_s=900, echo=lambda m: None)
    measured = [e for e in summary["events"] if e["event"] == "measured"]
    assert measured and measured[0]["workers"] == ["head"], summary["events"]
    sources = {w["worker"]: w["source"] for w in summary["plan"]["workers"]}
    assert sources["board"] == "predicted from catalog"
    if "head" in summary["workers"]:  # still hosting agents after the re-plan
        profile = summary["workers"]["head"]["profile"]
        assert profile["source"] == "measured"
        # What the plan made of it depends on the measurement alone: a reliable one is used as measured;
        # an unreliable one (a busy machine) is planned from the node's bandwidth and says why.
        if profile["reliable"]:
            assert sources["head"] == "measured"
        else:
            assert sources["head"].startswith("predicted from catalog (this host's calibration is unreliable")
    else:
        assert sources["head"] == "measured" or "unreliable" in sources["head"]
    assert all(a["finish"] == "done" for a in summary["agents"].values())
