"""Faults stay small: an error serving one job fails that job alone; dead workers are restarted while jobs
wait; a swarm fails only when no worker can start, and then frees every Ray resource; the store, the API and
the per-swarm health check agree; a local Ray listens on loopback only and leaves nothing behind a SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

from engine_alone import greedy_alone  # noqa: E402 (tests/)
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from swarm_harness import SYSTEM, WAIT_S, finish, two_worker_config, until  # noqa: E402 (tests/)

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve, swarm_health_name  # noqa: E402

TOKEN = "faults-token"
ASK = [("user", "Name three colors.")]
ALONE = [{"role": r, "content": c} for r, c in [("system", SYSTEM), *ASK]]
CONFIG = two_worker_config("flt", 16)


@pytest.fixture(scope="module")
def conn():  # type: ignore[no-untyped-def]
    c = scheduler.connect(None, kv_bytes=8 * 10**9)
    yield c
    scheduler.disconnect(c)


def _health(c: SwarmClient, service: str) -> str:
    r = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


# -- one job's engine error -------------------------------------------------------------------------


def test_the_engine_refusing_one_session_fails_that_turn_only() -> None:
    """The worker layer alone (no server check in front): a sampling value that is 0 in float32 and a prompt
    past the model's context each fail their own turn with the engine's message and hold no KV; the
    sessions beside them finish with the tokens of the engine run alone."""
    from worker.service import EngineWorker, WorkerSpec

    w = EngineWorker(WorkerSpec(name="w", kind="virtual", device="x86-host", model="default", kv_k="q8_0",
                                kv_v="q8_0", kv_budget_bytes=64 * 2**20, threads=1))  # fmt: skip
    try:
        tok = w.engine.tokenizer
        prompt = tok.encode(tok.render_chat(ALONE, add_generation_prompt=True))
        good = {"max_new_tokens": 12, "stop_tokens": tuple(sorted(tok.eot_ids))}
        w.submit("good-0", 0, prompt, good, True)
        w.submit("bad-top-p", 0, prompt, {**good, "top_p": 1e-300}, True)  # 0.0 as the engine's float32
        n_ctx = int(w.engine.config["n_ctx_train"])
        w.submit("too-long", 0, prompt * (n_ctx // len(prompt) + 1), good, True)  # past the model's context
        w.submit("good-1", 0, prompt, good, True)
        got: dict[str, list[int]] = {}
        ends: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + WAIT_S
        while len(ends) < 4 and time.monotonic() < deadline:
            for name, ev in w.drain().items():
                got.setdefault(name, []).extend(ev["tokens"])
                if ev["done"]:
                    ends[name] = ev
            time.sleep(0.02)
        assert set(ends) == {"good-0", "good-1", "bad-top-p", "too-long"}, ends
        assert ends["bad-top-p"]["reason"] == "error" and "top_p" in ends["bad-top-p"]["error"]
        assert ends["too-long"]["reason"] == "error" and "context" in ends["too-long"]["error"]
        assert not got.get("bad-top-p") and not got.get("too-long")
        want = greedy_alone(ALONE, 12)
        assert got["good-0"] == want and got["good-1"] == want
        assert len(w.engine.sequence_ids()) == 2  # the failed sessions hold no sequence, so no KV
        assert w.state()["error"] is None  # the loop is alive
        # The failed session takes a good turn afterwards (resent with its history, as the driver does).
        w.submit("bad-top-p", 1, prompt, good, True)
        again: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            ev = w.drain().get("bad-top-p")
            if ev is not None:
                again += ev["tokens"]
                if ev["done"]:
                    break
            time.sleep(0.02)
        assert again == want
    finally:
        w.stop()


def test_a_job_the_engine_refuses_fails_alone_and_the_swarm_goes_on(conn: scheduler.Connection,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            run = srv.hub.swarm("flt")
            # Straight to the runtime, past the server's checks: top_p 1e-300 is 0 in float32.
            bad = run.submit_job(agent="helper-0", messages=[{"role": "user", "content": "Hi."}], max_tokens=8,
                                 sampling={"top_p": 1e-300})[0]  # fmt: skip
            after = c.submit("flt", agent="helper-0", messages=ASK, max_tokens=12)[0]  # queued behind it
            beside = c.submit("flt", agent="helper-1", messages=ASK, max_tokens=12)[0]
            _, bad_end = finish(c, bad.id)
            assert bad_end.state == "failed" and "top_p" in bad_end.error, bad_end
            want = greedy_alone(ALONE, 12)
            for job in (after, beside):
                toks, end = finish(c, job.id)
                assert end.state == "done" and toks == want  # the failed turn left no trace in helper-0's history
            assert run.state == "running"
            assert not any(e["event"] == "worker_lost" for e in run.events)  # no worker died for it
            assert any(e["event"] == "turn_failed" and e["job"] == bad.id for e in run.events)
            assert srv.hub.store.swarm_state("flt") == ("running", "")
            assert _health(c, swarm_health_name("flt")) == "SERVING"
    finally:
        srv.stop()


# -- workers down ---------------------------------------------------------------------------------------


def _worker_pids(swarm: str) -> dict[str, int]:
    return {n.split(".", 1)[1]: w["pid"] for n, w in scheduler.placement(swarm)["workers"].items()}


def test_every_worker_killed_at_once_jobs_wait_and_finish(conn: scheduler.Connection, tmp_path: Path) -> None:
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            first = [c.submit("flt", agent=f"helper-{i}", messages=ASK, max_tokens=12)[0] for i in range(2)]
            until(lambda: all(c.job(j.id).state != "queued" for j in first), "the first jobs to start")
            pids = until(lambda: (p := _worker_pids("flt")) and len(p) == 2 and p, "two workers")
            for pid in pids.values():
                os.kill(pid, signal.SIGKILL)  # every worker at once
            # Accepted while no worker runs: they wait for the restart, none is refused.
            later = [c.submit("flt", agent=f"helper-{i % 2}", messages=[("user", "Say hi.")], max_tokens=6)[0]
                     for i in range(4)]  # fmt: skip
            oneoff = c.submit("flt", new_agent=True, messages=ASK, max_tokens=12)[0]
            want = greedy_alone(ALONE, 12)
            for j in first:
                toks, end = finish(c, j.id)
                assert end.state == "done" and toks == want, end
            for j in later:
                assert finish(c, j.id)[1].state == "done"
            toks, end = finish(c, oneoff.id)
            assert end.state == "done" and toks == greedy_alone([{"role": "user", "content": ASK[0][1]}], 12)
            run = srv.hub.swarm("flt")
            assert run.state == "running"
            lost = {e["worker"] for e in run.events if e["event"] == "worker_lost"}
            assert lost == {"a", "b"}, [e for e in run.events if e["event"] != "placed"]
            now = until(lambda: (p := _worker_pids("flt")) and len(p) == 2 and p, "both workers back")
            assert set(now.values()).isdisjoint(pids.values())  # new processes
    finally:
        srv.stop()


def test_a_swarm_no_worker_can_start_fails_frees_its_resources_and_relaunches(conn: scheduler.Connection,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            run = srv.hub.swarm("flt")

            def no_start(*_: Any, **__: Any) -> None:
                raise scheduler.SchedulerError("drill: this node cannot start workers")

            run.sched.start_workers = no_start  # type: ignore[method-assign]
            pids = until(lambda: (p := _worker_pids("flt")) and len(p) == 2 and p, "two workers")
            for pid in pids.values():
                os.kill(pid, signal.SIGKILL)
            waiting = c.submit("flt", agent="helper-0", messages=ASK, max_tokens=8)[0]  # accepted: a restart is due
            until(lambda: run.state == "failed", "the swarm to fail after its restarts failed", timeout=120)
            assert "no worker can be started" in run.error
            end = finish(c, waiting.id)[1]
            assert end.state == "failed" and "no worker can be started" in end.error
            # The store, the API and the health check agree.
            assert srv.hub.store.swarm_state("flt")[0] == "failed"  # type: ignore[index]
            assert {s.name: s.state for s in c.swarms()}["flt"] == "failed"
            assert _health(c, swarm_health_name("flt")) == "NOT_SERVING"
            assert _health(c, "") == "SERVING"  # the server itself still serves
            with pytest.raises(grpc.RpcError) as e:
                c.submit("flt", agent="helper-0", messages=ASK, max_tokens=8)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # Every Ray resource it held is gone, so the same name launches again.
            left = scheduler.placement("flt")
            assert not left["workers"] and not left["placement_groups"], left
            c.launch(CONFIG)
            toks, end = finish(c, c.submit("flt", agent="helper-1", messages=ASK, max_tokens=12)[0].id)
            assert end.state == "done" and toks == greedy_alone(ALONE, 12)
            assert _health(c, swarm_health_name("flt")) == "SERVING"
            assert srv.hub.store.swarm_state("flt") == ("running", "")
    finally:
        srv.stop()


def test_a_stopped_swarm_is_stopped_in_the_api_the_store_and_health(conn: scheduler.Connection,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            assert {s.name: s.state for s in c.swarms()}["flt"] == "running"
            assert _health(c, swarm_health_name("flt")) == "SERVING"
            c.stop("flt")
            assert {s.name: s.state for s in c.swarms()}["flt"] == "stopped"
            assert srv.hub.store.swarm_state("flt")[0] == "stopped"  # type: ignore[index]
            assert _health(c, swarm_health_name("flt")) == "NOT_SERVING"
            assert not scheduler.placement("flt")["placement_groups"]
    finally:
        srv.stop()


# -- Ray on this machine ------------------------------------------------------------------------------


def _ray_processes(owner: str) -> list[int]:
    """Pids of the processes whose environment names `owner` as the driver that started their Ray."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"{scheduler.OWNER_ENV}={owner}".encode() in env:
                out.append(int(d.name))
    return out


def test_a_local_ray_listens_on_loopback_only(conn: scheduler.Connection) -> None:
    psutil = pytest.importorskip("psutil")
    owner = scheduler._owner_id(os.getpid())
    pids = set(_ray_processes(owner))
    assert len(pids) >= 3, "expected the GCS, the raylet and its agents"  # started by this test process
    listening = [(c.pid, c.laddr.ip, c.laddr.port) for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]  # fmt: skip
    assert listening, "no Ray process listens"
    wide = [x for x in listening if x[1] not in ("127.0.0.1", "::ffff:127.0.0.1")]
    assert not wide, f"Ray processes listening beyond loopback: {wide}"


SERVER_SCRIPT = textwrap.dedent("""
    import os, sys, time
    os.environ["RAY_AUTH_MODE"] = "disabled"
    from swarm import scheduler
    conn = scheduler.connect(None, kv_bytes=10**9)
    print(scheduler._owner_id(os.getpid()), flush=True)
    time.sleep(600)
""")


def test_nothing_of_a_killed_drivers_ray_outlives_the_next_start() -> None:
    first = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True)
    second, second_owner = None, ""
    try:
        assert first.stdout is not None
        owner = first.stdout.readline().strip()
        assert owner, "the first driver did not start"
        time.sleep(5)  # its agents are up
        assert _ray_processes(owner)
        first.kill()  # SIGKILL: no clean shutdown
        first.wait()
        second = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True)
        assert second.stdout is not None
        second_owner = second.stdout.readline().strip()
        assert second_owner, "the second driver did not start"
        until(lambda: not _ray_processes(owner), "the first driver's Ray processes to be gone", timeout=30)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for pid in _ray_processes(second_owner) if second_owner else []:  # what the second one left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
