"""Faults caused on purpose: a worker process killed mid-generation, the server
restarted, a burst larger than capacity. Nothing accepted is lost: every job
ends completed (with the text an uninterrupted greedy run gives) or reported.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

from engine_alone import greedy_alone  # noqa: E402 (tests/)
from swarm_harness import SYSTEM, two_worker_config  # noqa: E402 (tests/)

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve  # noqa: E402

TOKEN = "rel-token"
LONG = [("user", "Count from 1 to 300, separated by commas.")]  # to an agent whose system prompt is SYSTEM
ALONE = [{"role": r, "content": c} for r, c in [("system", SYSTEM), *LONG]]
CONFIG = two_worker_config("rel", 16)


@pytest.fixture(scope="module")
def conn():  # type: ignore[no-untyped-def]
    c = scheduler.connect(None, kv_bytes=8 * 10**9)
    yield c
    scheduler.disconnect(c)


def _follow(c: SwarmClient, job_id: str, offset: int = 0, until: int | None = None) -> tuple[list[int], Any]:
    """Tokens from `offset`, checking contiguity; stops early after `until` tokens."""
    toks: list[int] = []
    expect = offset
    for ev in c.stream(job_id, offset):
        assert ev.offset == expect, f"gap or repeat: event at {ev.offset}, expected {expect}"
        toks += ev.token_ids
        expect += len(ev.token_ids)
        if ev.done:
            return toks, ev.job
        if until is not None and len(toks) >= until:
            return toks, None
    return toks, None


def test_a_killed_worker_process_loses_no_token(conn: scheduler.Connection, tmp_path: Path) -> None:
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            job = c.submit("rel", agent="helper-0", messages=LONG, max_tokens=120)[0]
            first, _ = _follow(c, job.id, until=12)
            worker = c.job(job.id).worker
            pid = scheduler.placement("rel")["workers"][f"rel.{worker}"]["pid"]
            os.kill(pid, signal.SIGKILL)  # the worker process dies mid-generation
            rest, final = _follow(c, job.id, offset=len(first))
            assert final is not None and final.state == "done", final
            assert first + rest == greedy_alone(ALONE, 120)  # the text of an uninterrupted greedy run
            events = srv.hub.swarm("rel").events
            assert any(e["event"] == "worker_lost" and e["worker"] == worker for e in events)
            assert any(e["event"] == "moved" and e["agent"] == "helper-0" for e in events)
            # The new placement is what Ray shows: the job's worker is alive, in a new process if it was restarted.
            alive = scheduler.placement("rel")["workers"]
            assert f"rel.{final.worker}" in alive and alive[f"rel.{final.worker}"]["pid"] != pid
    finally:
        srv.stop()


def test_a_restarted_server_resumes_accepted_jobs(conn: scheduler.Connection, tmp_path: Path) -> None:
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    with SwarmClient(srv.target, token=TOKEN) as c:
        c.launch(CONFIG)
        running = c.submit("rel", agent="helper-0", messages=LONG, max_tokens=120, idempotency_key="once")[0]
        queued = c.submit("rel", agent="helper-0", messages=[("user", "Say hi.")], max_tokens=6)[0]
        seen, _ = _follow(c, running.id, until=10)
    srv.hub.crash()  # the server process dies: no clean stop, nothing more recorded
    srv.server.stop(0).wait(5)

    srv2 = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)  # same run directory
    try:
        with SwarmClient(srv2.target, token=TOKEN) as c:
            assert [s.name for s in c.swarms()] == ["rel"]
            rest, final = _follow(c, running.id, offset=len(seen))  # the client reconnects where it was
            assert final is not None and final.state == "done"
            assert seen + rest == greedy_alone(ALONE, 120)
            _, q = _follow(c, queued.id)
            assert q is not None and q.state == "done" and q.tokens > 0
            again = c.submit("rel", agent="helper-0", messages=LONG, max_tokens=120, idempotency_key="once")
            assert [j.id for j in again] == [running.id]  # the retry is not a second job
            assert {j.id for j in c.jobs("rel")} >= {running.id, queued.id}
    finally:
        srv2.stop()


def test_a_stopped_server_reports_its_jobs_after_restart(conn: scheduler.Connection, tmp_path: Path) -> None:
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    with SwarmClient(srv.target, token=TOKEN) as c:
        c.launch(CONFIG)
        job = c.submit("rel", agent="helper-1", messages=LONG, max_tokens=400)[0]
        _follow(c, job.id, until=3)
    srv.stop()  # a clean stop ends running jobs as cancelled, on record
    srv2 = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv2.target, token=TOKEN) as c:
            got = c.job(job.id)
            assert got.state == "cancelled" and got.finish_reason == "swarm_stopped"
            toks, final = _follow(c, job.id)
            assert final is not None and len(toks) == got.tokens
    finally:
        srv2.stop()


def test_a_burst_beyond_capacity_is_completed_or_refused(conn: scheduler.Connection, tmp_path: Path) -> None:
    cfg = """
name: burst
agents:
  - name: a
    count: 1
    context: 128
    max_new_tokens: 4
workers:
  - name: small
    kind: virtual
    device: raspberry-pi-5
    memory: 118MiB
policy:
  formats: [q8_0]
engine:
  threads: 1
"""
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(cfg)
            accepted, refused = [], []
            over_budget: list[str] = []
            stop = threading.Event()

            def watch() -> None:  # the engine never holds more KV than its budget
                run = srv.hub.swarm("burst")
                while not stop.is_set():
                    for w, s in run.sched.states().items():
                        if isinstance(s, dict) and s["kv_bytes_reserved"] > s["kv_budget_bytes"]:
                            over_budget.append(f"{w}: {s['kv_bytes_reserved']} > {s['kv_budget_bytes']}")
                    time.sleep(0.05)

            t = threading.Thread(target=watch)
            t.start()
            for i in range(24):  # one-off agents of ~600 tokens each: only a few fit the 118 MiB device
                try:
                    accepted += c.submit("burst", new_agent=True, messages=[("user", f"Story {i}: once upon a time")],
                                         max_tokens=560)  # fmt: skip
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                    assert "no worker has room" in e.details()
                    refused.append(e.details())
            finals = [_follow(c, j.id)[1] for j in accepted]
            stop.set()
            t.join()
            assert accepted and refused, (len(accepted), len(refused))
            assert all(f is not None and f.state == "done" for f in finals)
            assert not over_budget, over_budget[:3]
    finally:
        srv.stop()


def test_a_killed_server_process_restarts_and_finishes_its_jobs(tmp_path: Path) -> None:
    """The real thing: `swarm serve` killed with SIGKILL and started again on the same run directory."""
    import socket
    import subprocess
    import sys

    from ray.cluster_utils import Cluster

    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"kv_bytes": 4e9}})
    address = cluster.address
    config = tmp_path / "rel.yaml"
    config.write_text(CONFIG)
    cmd = [sys.executable, "-m", "swarm.cli", "serve", "--config", str(config), "--address", address, "--port",
           str(port), "--token", TOKEN, "--out", str(tmp_path / "runs")]  # fmt: skip

    def start() -> subprocess.Popen[str]:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.monotonic() + 300
        with SwarmClient(f"127.0.0.1:{port}", token=TOKEN, timeout_s=5) as c:
            while time.monotonic() < deadline:
                try:
                    if [s.name for s in c.swarms() if s.state == "running"] == ["rel"]:
                        return p
                except grpc.RpcError:
                    pass
                assert p.poll() is None, p.stdout.read() if p.stdout else ""
                time.sleep(0.5)
        raise AssertionError("the server did not come up")

    server = start()
    try:
        with SwarmClient(f"127.0.0.1:{port}", token=TOKEN) as c:
            job = c.submit("rel", agent="helper-1", messages=LONG, max_tokens=120)[0]
            seen, _ = _follow(c, job.id, until=10)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=60)
        server = start()  # resumes the swarm from <out>/kvswarm.db
        with SwarmClient(f"127.0.0.1:{port}", token=TOKEN) as c:
            rest, final = _follow(c, job.id, offset=len(seen))
            assert final is not None and final.state == "done"
            assert seen + rest == greedy_alone(ALONE, 120)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        cluster.shutdown()
