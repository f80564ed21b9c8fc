"""The session lifecycle seen from the swarm: the planner's byte accounting with parked agents (pure, bytes by
hand), a disk-parked session surviving a SIGKILL of its worker, and GetPlacement over a real gRPC server showing
each agent's state and where its KV lives.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from swarm_harness import two_worker_config, until  # noqa: E402 (tests/)

from swarm.errors import NoFeasiblePlan
from swarm.planner import (
    AgentGroup,
    Calibration,
    DeviceProfile,
    EngineSettings,
    ModelGeometry,
    ParkedAgent,
    Policy,
    all_pairs,
    parked_bytes,
    plan,
    scratch_bytes,
)

os.environ["RAY_AUTH_MODE"] = "disabled"

# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64 dimensions, no sliding layers.
SMOLLM = ModelGeometry("smollm2", 30, 9, 3, 64, 576, 1536, 49152, 8192, 96_436_224, 100_000_000)
# Bytes per token, by hand: layers x (K and V) x KV heads x one head's row.
F16_PER_TOKEN = 30 * 2 * 3 * (64 * 2)  # f16: 2 bytes per value -> 23,040
Q8_PER_TOKEN = 30 * 2 * 3 * (2 * 34)  # q8_0: a 64-value row is 2 blocks of 34 bytes -> 12,240
SETTINGS = EngineSettings(block_tokens=16)
Q8 = Policy.allow(["q8_0"], quality_floor=None)


def _device(name: str, usable: int) -> DeviceProfile:
    return DeviceProfile(name, name, "cpu", usable, Calibration.from_bandwidth(SMOLLM, 20e9, all_pairs()))


def _parked(name: str, worker: str, tokens: int, fmt: str, where: str, group: str = "r") -> ParkedAgent:
    return ParkedAgent(name=name, group=group, worker=worker, tokens=tokens, kv_k=fmt, kv_v=fmt, where=where)


# -- the planner's accounting (pure) ------------------------------------------------------------------


def test_parked_bytes_are_tokens_times_the_formats_bytes_per_token() -> None:
    assert F16_PER_TOKEN == 23_040 and Q8_PER_TOKEN == 12_240
    assert parked_bytes(SMOLLM, _parked("r-0", "a", 100, "f16", "ram")) == 2_304_000
    assert parked_bytes(SMOLLM, _parked("r-1", "a", 50, "q8_0", "disk")) == 612_000
    assert parked_bytes(SMOLLM, _parked("r-2", "a", 0, "q8_0", "disk")) == 0


def test_parked_agents_take_no_kv_reservation_and_are_reported_per_worker_and_tier() -> None:
    groups = [AgentGroup("r", count=4, context=1024)]
    parked = [_parked("r-3", "a", 300, "f16", "ram"), _parked("r-2", "a", 200, "q8_0", "disk")]
    p = plan(SMOLLM, [_device("a", 4 * 10**9)], groups, Q8, settings=SETTINGS, parked=parked)
    # 1024 tokens = 64 blocks of 16 per agent; a q8_0 block is 16 x 12,240 = 195,840 bytes
    block = 16 * Q8_PER_TOKEN
    assert p.agents == 2 and p.workers[0].kv_blocks == 2 * 64
    assert p.workers[0].kv_bytes == 2 * 64 * block == 25_067_520
    full = plan(SMOLLM, [_device("a", 4 * 10**9)], groups, Q8, settings=SETTINGS)
    assert full.agents == 4 and full.workers[0].kv_bytes == 4 * 64 * block == 50_135_040
    (w,) = p.parked
    assert w.worker == "a" and w.agents == ("r-2", "r-3")
    assert w.ram_bytes == 300 * F16_PER_TOKEN == 6_912_000
    assert w.disk_bytes == 200 * Q8_PER_TOKEN == 2_448_000
    text = p.explain()
    assert "Parked: 2 agents hold 6.9 MB of KV in host RAM and 2.4 MB on disk" in text
    assert "host memory, not device memory" in text and "take no KV reservation" in text
    assert "a: 2 parked (6.9 MB RAM, 2.4 MB disk): r-2, r-3" in text
    assert "parked: 2 agents, 6.9 MB in host RAM + 2.4 MB on disk (no KV reservation)" in str(p)
    assert json.loads(p.to_json())["parked"] == [
        {"worker": "a", "agents": ["r-2", "r-3"], "ram_bytes": 6_912_000, "disk_bytes": 2_448_000}
    ]


def test_a_device_too_small_for_every_agent_holds_them_when_half_are_parked() -> None:
    groups = [AgentGroup("r", count=4, context=1024)]
    two_agents_kv = 2 * 64 * 16 * Q8_PER_TOKEN
    usable = SMOLLM.resident_bytes + scratch_bytes(SMOLLM, SETTINGS, 2, 1024) + two_agents_kv + two_agents_kv // 4
    with pytest.raises(NoFeasiblePlan):
        plan(SMOLLM, [_device("a", usable)], groups, Q8, settings=SETTINGS)
    parked = [_parked(f"r-{i}", "a", 1000, "q8_0", "disk") for i in (2, 3)]
    p = plan(SMOLLM, [_device("a", usable)], groups, Q8, settings=SETTINGS, parked=parked)
    assert p.agents == 2 and p.workers[0].kv_bytes == two_agents_kv
    assert p.parked[0].disk_bytes == 2 * 1000 * Q8_PER_TOKEN and p.parked[0].ram_bytes == 0


def test_parked_agents_on_several_workers_and_groups() -> None:
    groups = [AgentGroup("r", count=3, context=512), AgentGroup("c", count=2, context=256)]
    parked = [
        _parked("c-1", "b", 10, "q8_0", "ram", group="c"),
        _parked("r-0", "a", 40, "f16", "disk"),
        _parked("r-2", "b", 7, "f16", "ram"),
    ]
    devices = [_device("a", 4 * 10**9), _device("b", 4 * 10**9)]
    p = plan(SMOLLM, devices, groups, Q8, settings=SETTINGS, parked=parked)
    assert p.agents == (3 - 2) + (2 - 1)  # r-0 and r-2 parked of 3 r, c-1 of 2 c
    reserved = {g.group: 0 for w in p.workers for g in w.groups}
    for w in p.workers:
        for g in w.groups:
            reserved[g.group] += g.agents
    assert reserved == {"r": 1, "c": 1}
    a, b = p.parked
    assert (a.worker, a.agents, a.ram_bytes, a.disk_bytes) == ("a", ("r-0",), 0, 40 * F16_PER_TOKEN)
    assert (b.worker, b.agents) == ("b", ("c-1", "r-2"))
    assert b.ram_bytes == 10 * Q8_PER_TOKEN + 7 * F16_PER_TOKEN == 283_680 and b.disk_bytes == 0


def test_bad_parked_agents_are_refused_with_what_is_wrong() -> None:
    groups = [AgentGroup("r", count=1, context=256)]
    dev = [_device("a", 4 * 10**9)]
    with pytest.raises(ValueError, match="groups not in the plan: x"):
        plan(SMOLLM, dev, groups, Q8, settings=SETTINGS, parked=[_parked("x-0", "a", 1, "f16", "ram", group="x")])
    with pytest.raises(ValueError, match="2 parked agents, more than its 1"):
        plan(SMOLLM, dev, groups, Q8, settings=SETTINGS,
             parked=[_parked(f"r-{i}", "a", 1, "f16", "ram") for i in range(2)])  # fmt: skip
    with pytest.raises(ValueError, match="where 'gpu' is not one of"):
        _parked("r-0", "a", 1, "f16", "gpu")


# -- a disk-parked session survives a SIGKILL of its worker; GetPlacement shows the states ----------------

grpc = pytest.importorskip("grpc")
ray = pytest.importorskip("ray")

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve  # noqa: E402

TOKEN = "life-token"
MAX_NEW = 12


def _config(park_dir: Path) -> str:
    return two_worker_config(
        "lfc",
        MAX_NEW,
        extra=f"""lifecycle:
  policy: measured
  park_dir: {park_dir}
  park_disk_bytes: 64MiB
""",
    )


@pytest.fixture(scope="module")
def conn():  # type: ignore[no-untyped-def]
    c = scheduler.connect(None, kv_bytes=8 * 10**9)
    yield c
    scheduler.disconnect(c)


def _turn(c: SwarmClient, agents: list[str], text: str) -> dict[str, list[int]]:
    jobs = {a: c.submit("lfc", agent=a, messages=[("user", text)], max_tokens=MAX_NEW)[0] for a in agents}
    out = {}
    for a, j in jobs.items():
        toks: list[int] = []
        for ev in c.stream(j.id, retries=20):
            assert ev.offset == len(toks), f"gap or repeat at {ev.offset}"
            toks += ev.token_ids
            if ev.done:
                assert ev.job.state == "done", ev.job
                break
        out[a] = toks
    return out


def _sessions(c: SwarmClient) -> dict[str, tuple[str, Any]]:
    return {s.agent: (w.worker, s) for w in c.placement("lfc").workers for s in w.sessions}


def test_a_disk_parked_session_survives_a_worker_sigkill_and_is_restored_from_disk(conn: scheduler.Connection,
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path / "runs", echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(_config(tmp_path / "park"))
            agents = ["helper-0", "helper-1"]
            first = _turn(c, agents, "Name three colors.")
            assert first["helper-0"] == first["helper-1"]
            idle = until(lambda: (s := _sessions(c)) and all(a in s and s[a][1].state == "idle" for a in agents)
                          and s, "both sessions idle")  # fmt: skip
            on = {a: idle[a][0] for a in agents}
            assert sorted(on.values()) == ["a", "b"], on
            parked = next(a for a in agents if on[a] == "a")
            other = next(a for a in agents if on[a] == "b")
            tokens = idle[parked][1].tokens

            run = srv.hub.swarm("lfc")
            actor = run.sched.workers["a"].actor
            assert ray.get(actor.park.remote(parked, "disk"), timeout=60) == "disk"
            st = until(lambda: (x := _sessions(c)[parked][1]).state == "parked" and x, "GetPlacement to say parked")
            assert (st.where, st.tokens) == ("disk", tokens), st
            life = next(w.lifecycle for w in c.placement("lfc").workers if w.worker == "a")
            assert life.parked == 1 and life.idle == 0 and life.parked_disk_bytes > 0, life
            assert life.parked_disk_bytes == st.kv_bytes or st.kv_bytes > 0
            # the run's summary accounts for it as the planner does: host bytes, no KV reservation
            summary = run.parked_summary(run.sched.states())
            assert summary["workers"] == [
                {"worker": "a", "agents": (parked,), "ram_bytes": 0, "disk_bytes": tokens * Q8_PER_TOKEN}
            ]
            assert "Parked: 1 agents" in summary["explanation"]
            files = list((tmp_path / "park" / "lfc" / "a").iterdir())
            assert len(files) == 1, files  # the park file, in the worker's own folder of the configured park_dir

            pid = run.sched.states()["a"]["pid"]  # type: ignore[index]
            os.kill(pid, signal.SIGKILL)
            until(lambda: any(e["event"] == "worker_lost" for e in run.events), "the loss to be seen")
            # the restarted worker indexes its park folder: the session is there again, parked on disk
            back = until(lambda: (s := _sessions(c)).get(parked) and s[parked][0] == "a" and s[parked][1].state
                          == "parked" and s, "the restarted worker to list the parked session")  # fmt: skip
            assert back[parked][1].where == "disk" and back[parked][1].tokens == tokens
            now = until(lambda: isinstance(x := run.sched.states().get("a"), dict) and x, "worker a to answer")
            assert now["pid"] != pid, run.events[-8:]  # a new process

            second = _turn(c, agents, "Now name three animals.")
            assert second[parked] == second[other]  # restored from disk: as the agent that was never touched
            life = next(w.lifecycle for w in c.placement("lfc").workers if w.worker == "a")
            assert life.restores == 1 and life.reprefill_tokens == 0, life
            assert life.reprefill_tokens_saved >= tokens, life
    finally:
        srv.stop()
