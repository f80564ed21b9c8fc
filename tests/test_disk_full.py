"""A full disk under --out, on a real server over a small tmpfs: new jobs are refused with RESOURCE_EXHAUSTED
naming the disk, the running job pauses (nothing unrecorded reaches its stream), the swarm's health check says
NOT_SERVING while the server's says SERVING, and once space returns everything resumes on its own, with the
tokens an uninterrupted greedy run gives."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

from engine_alone import greedy_alone  # noqa: E402 (tests/)
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from swarm_harness import until  # noqa: E402 (tests/)

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve, swarm_health_name  # noqa: E402

TOKEN = "disk-token"
SYSTEM = "You are a helpful assistant. Answer briefly."
LONG = [("user", "Count from 1 to 300, separated by commas.")]
ALONE = [{"role": r, "content": c} for r, c in [("system", SYSTEM), *LONG]]
CONFIG = f"""
name: disk
agents:
  - name: helper
    count: 2
    context: 512
    system_prompt: {SYSTEM}
    max_new_tokens: 16
workers:
  - name: a
    kind: virtual
    device: x86-host
policy:
  formats: [q8_0]
engine:
  threads: 1
"""
TMPFS_BYTES = 16 * 2**20  # room for the store and transcripts of a few jobs; filled on purpose below


@pytest.fixture()
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "out"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs was refused (needs root): {r.stderr.strip() or r.returncode}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path) -> Path:
    """Writes a file until the disk is full; returns it (delete it to give the space back)."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * 2**16
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


def _health(c: SwarmClient, service: str) -> str:
    r = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


def test_a_full_disk_refuses_new_jobs_pauses_running_ones_and_recovers(small_disk: Path) -> None:
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=small_disk, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            run = srv.hub.swarm("disk")
            running = c.submit("disk", agent="helper-0", messages=LONG, max_tokens=120)[0]
            seen: list[int] = []
            stream = c.stream(running.id, retries=20)
            for ev in stream:  # it runs
                seen += ev.token_ids
                if len(seen) >= 4:
                    break
            filler = _fill(small_disk)
            # New jobs are refused with the real reason, whether the swarm saw the full disk yet or not.
            with pytest.raises(grpc.RpcError) as e:
                c.submit("disk", agent="helper-1", messages=[("user", "Say hi.")], max_tokens=6)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
            assert "disk under --out" in (e.value.details() or "") and "full" in e.value.details()
            assert "rollback" not in e.value.details()
            until(lambda: run.record_error, "the swarm to notice it cannot record")
            assert _health(c, swarm_health_name("disk")) == "NOT_SERVING"
            assert _health(c, "") == "SERVING"
            assert run.state == "running"  # paused, not failed
            # Paused: a stream from where the client is gets nothing unrecorded (the engine's tokens wait).
            with pytest.raises(grpc.RpcError) as e:
                list(c.stream(running.id, len(seen), timeout=3, retries=0))
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            filler.unlink()  # space returns
            until(lambda: not run.record_error, "recording to resume on its own")
            assert _health(c, swarm_health_name("disk")) == "SERVING"
            for ev in stream:  # the same stream goes on
                seen += ev.token_ids
                if ev.done:
                    assert ev.job.state == "done", ev.job
                    break
            assert seen == greedy_alone(ALONE, 120)
            after = c.submit("disk", agent="helper-1", messages=LONG, max_tokens=10)[0]
            toks = [t for ev in c.stream(after.id) for t in ev.token_ids]
            assert toks == greedy_alone(ALONE, 10)
            assert srv.hub.store.swarm_state("disk") == ("running", "")
            assert {j["id"]: j["state"] for j in srv.hub.store.jobs("disk")}[running.id] == "done"
    finally:
        srv.stop()
        scheduler.disconnect(conn)
