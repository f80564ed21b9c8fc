"""Connecting to Ray: start a local Ray or join a cluster, reap orphans a killed driver left, disconnect.

The scheduler's other half (swarm/scheduler.py places and drives the workers); these two are the only modules
that call Ray. swarm/scheduler.py re-exports every name here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ray
from ray._private import ray_constants

from swarm.errors import SchedulerError

NAMESPACE = "kvswarm"
KV_RESOURCE = "kv_bytes"  # a node's host memory for KV reservations (CPU and cluster workers)
NODE_LABEL = "ray.io/node-id"
TIMEOUT_S = 120.0  # placement and worker start (a cold start may calibrate)
CALL_TIMEOUT_S = 30.0  # one request to a running worker
CALIBRATE_TIMEOUT_S = 1800.0  # a worker that measures itself on start (cached after the first time)
LOOPBACK = "127.0.0.1"  # a Ray this process starts listens here only (GCS, raylet, workers, agents, dashboard)


# -- connecting ---------------------------------------------------------------------------


def device_kv_resource(device: str) -> str:
    """The Ray resource of a local GPU's memory for KV reservations: `kv_bytes:vulkan:<index>`, sized from the
    device heap (the figure planning gives the GPU worker), apart from the host memory in `kv_bytes`."""
    return f"{KV_RESOURCE}:{device}"


@dataclass(frozen=True)
class Connection:
    address: str
    dashboard_url: str
    node_id: str  # the driver's node
    started_here: bool  # this process started the Ray instance (and stops it)
    head_process: bool  # started as a separate `ray start --head` (survives this process)
    auth_token_path: str | None


def auth_token_path() -> str | None:
    p = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled" or not p.exists():
        return None
    return str(p)


def connect(
    address: str | None,
    *,
    kv_bytes: int,
    keep: bool = False,
    num_cpus: int | None = None,
    device_kv_bytes: Mapping[str, int] | None = None,
) -> Connection:
    """Starts a local Ray (address None) or joins a cluster ("auto" or HOST:PORT). A Ray started here offers
    `kv_bytes` of KV_RESOURCE and, per local GPU in `device_kv_bytes` ({"vulkan:<index>": bytes}), that many
    of its device_kv_resource; a cluster's nodes declare their own."""
    if ray.is_initialized():
        raise SchedulerError("Ray is already initialized in this process; launch one swarm per process")
    cpus = num_cpus or os.cpu_count() or 1
    resources = {KV_RESOURCE: float(kv_bytes)}
    resources.update({device_kv_resource(d): float(n) for d, n in (device_kv_bytes or {}).items()})
    head_process = False
    if address is None and keep:
        # --keep outlives this process, so Ray runs as its own head, not inside the driver.
        cmd = [_ray_cli(), "start", "--head", "--dashboard-host", LOOPBACK, "--node-ip-address", LOOPBACK,
               f"--num-cpus={cpus}",
               f"--resources={json.dumps(resources)}", "--disable-usage-stats"]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        if r.returncode != 0:
            raise SchedulerError(f"`ray start --head` failed: {r.stderr.strip()[-600:]}")
        address, head_process = "auto", True
    if address is None:
        _loopback_only()
        _reap_orphans()
        os.environ[OWNER_ENV] = _owner_id(os.getpid())  # inherited by every Ray process started below
        ctx = ray.init(
            namespace=NAMESPACE, num_cpus=cpus, resources=resources, include_dashboard=True,
            dashboard_host=LOOPBACK, _node_ip_address=LOOPBACK, log_to_driver=False, logging_level="warning",
        )  # fmt: skip
        started = True
    else:
        try:
            ctx = ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="warning")
        except ConnectionError as e:
            raise SchedulerError(
                f"cannot reach a Ray cluster at {address!r} ({e}). To fix: start one with `ray start --head`, "
                "or drop --address to run a local Ray"
            ) from e
        started = False
    url = ctx.dashboard_url or ""
    return Connection(
        address=ray.get_runtime_context().gcs_address,
        dashboard_url=f"http://{url}" if url and not url.startswith("http") else url,
        node_id=ray.get_runtime_context().get_node_id(),
        started_here=started,
        head_process=head_process,
        auth_token_path=auth_token_path(),
    )


OWNER_ENV = "KVSWARM_RAY_OWNER"  # "<pid>:<start time>:<command key>" of the driver that started a local Ray


def _owner_id(pid: int) -> str:
    """A process identity that survives pid reuse (its pid and start time in clock ticks since boot), and the key
    of the command it runs (its working directory and arguments: the same server started again has the same)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""
    key = hashlib.sha256(cwd.encode() + b"\0" + argv).hexdigest()[:16]
    return f"{pid}:{stat.rsplit(')', 1)[1].split()[19]}:{key}"


def _reap_orphans() -> list[int]:
    """Kills the Ray processes that an earlier run of this same command started and left behind when it was
    killed (a SIGKILLed driver takes its GCS and raylet with it, but the dashboard and runtime-env agents outlive
    them). Only processes whose OWNER_ENV names a driver that is gone and ran this command are touched: another
    program's Ray, or a live driver's, is never touched. Returns the pids killed."""
    mine = _owner_id(os.getpid())
    if not mine:  # no /proc: nothing to look at
        return []
    key = mine.rsplit(":", 1)[1]
    killed = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or d.name == str(os.getpid()):
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        owner = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(OWNER_ENV.encode() + b"=")), "")
        parts = owner.split(":")
        if len(parts) != 3 or parts[2] != key or _owner_id(int(parts[0])) == owner:
            continue  # another command's Ray, or its driver is alive
        with contextlib.suppress(OSError):
            os.kill(int(d.name), signal.SIGKILL)
            killed.append(int(d.name))
    return killed


def _loopback_only() -> None:
    """A Ray started here is a one-machine Ray: every process it starts binds and advertises 127.0.0.1.

    Ray turns a node IP of 127.0.0.1 into the host's address unless clustering is off
    (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, Ray's own switch for one-machine platforms, read by
    this process at import and by the processes it starts from their environment)."""
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _ray_cli() -> str:
    """The `ray` command of this environment (a venv's bin/ need not be on PATH)."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray") or "ray"


def disconnect(conn: Connection | None, *, stop_head: bool = True) -> None:
    if ray.is_initialized():
        ray.shutdown()
    if conn is not None and conn.head_process and stop_head:
        subprocess.run([_ray_cli(), "stop", "--force"], capture_output=True, timeout=TIMEOUT_S)


def cluster_resources() -> dict[str, float]:
    return dict(ray.cluster_resources())
