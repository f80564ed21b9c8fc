"""The Ray side of kvswarm: with swarm/scheduler_connect.py (connecting), the only modules that call Ray.

A worker is one `EngineWorker` actor in a placement group of one bundle
(`kvswarm.<swarm>/<worker>`): its device resource (`device:<id>` for a
cluster worker), a CPU unless it is virtual, and Ray's `memory` resource for
its weights and scratch. A local or virtual worker is pinned to the driver's
node by its `ray.io/node-id` label.

The agents' KV reservations live in a second placement group per worker,
pinned to the worker's node, one bundle per agent holding the custom
resource `kv_bytes` (plus one bundle per group for the system-prompt blocks
its agents share). Ray names groups, not bundles, so the group's name lists
its bundles in order, compressed into ranges:

    kvswarm.demo/local kv1: researcher.prefix researcher[0-2] critic[0]

bundle 0 is the researchers' shared prefix, bundles 1-3 are researcher-0..2
and bundle 4 is critic-0. The name grows with the number of groups, not of
agents, so it stays short for thousands of agents; the dashboard's
placement-group view shows each bundle's node, and `swarm status` expands it.
When the agents on a worker change (one finishes, one moves in) the group is
replaced by the next generation (kv2, ...).

Every node that hosts workers must offer `kv_bytes`: `swarm launch` gives
the local Ray the host's available memory; cluster nodes declare theirs
(`ray start --resources '{"device:rk3588": 1, "kv_bytes": 6e9}'`). A local
GPU worker (`backend: vulkan`) holds its agents' KV in its device's own
resource instead, `kv_bytes:vulkan:<index>` (`kv_resource`), which `swarm
launch` sizes from the device heap, the figure planning gives the worker:
a GPU with more memory than the host is not held to the host's.
Every Ray call here has a timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util import metrics
from ray.util import state as ray_state
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from swarm.errors import CallRefused, SchedulerError, WorkerLost
from swarm.runtime.names import compact_names, expand_names
from swarm.runtime.placement import Reservation
from swarm.runtime.report import LIFECYCLE_COUNTERS, lifecycle_numbers
from swarm.scheduler_connect import (
    CALIBRATE_TIMEOUT_S,
    CALL_TIMEOUT_S,
    KV_RESOURCE,
    LOOPBACK,
    NAMESPACE,
    NODE_LABEL,
    OWNER_ENV,
    TIMEOUT_S,
    Connection,
    _owner_id,
    auth_token_path,
    cluster_resources,
    connect,
    device_kv_resource,
    disconnect,
)
from worker.service import EngineWorker, WorkerSpec

# swarm.scheduler is the Ray API the rest of swarm/ uses: the connecting names are re-exported
__all__ = [
    "CALIBRATE_TIMEOUT_S",
    "CALL_TIMEOUT_S",
    "CallRefused",
    "Connection",
    "KV_RESOURCE",
    "LOOPBACK",
    "MeteredEngineWorker",
    "NAMESPACE",
    "NODE_LABEL",
    "OWNER_ENV",
    "Reservation",
    "Scheduler",
    "SchedulerError",
    "TIMEOUT_S",
    "WorkerHandle",
    "WorkerLost",
    "_owner_id",
    "auth_token_path",
    "cluster_resources",
    "compact_names",
    "connect",
    "device_kv_resource",
    "disconnect",
    "expand_names",
    "kv_resource",
    "placement",
    "worker_states",
]

# -- the worker actor ---------------------------------------------------------------------


class MeteredEngineWorker(EngineWorker):
    """EngineWorker exporting its live numbers as Ray metrics (Ray's Prometheus endpoint)."""

    METRICS_EVERY_S = 1.0

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        keys = ("swarm", "worker", "device", "kv_format")
        self._tags = {"swarm": self.spec.swarm, "worker": self.spec.name, "device": self.spec.device,
                      "kv_format": self.kv_format}  # fmt: skip
        self._m_tokens = metrics.Counter("kvswarm_tokens_generated", "tokens generated", tag_keys=keys)
        self._m_tps = metrics.Gauge("kvswarm_decode_tokens_per_s", "decode tokens/s (5 s window)", tag_keys=keys)
        self._m_used = metrics.Gauge("kvswarm_kv_bytes_used", "KV bytes holding positions", tag_keys=keys)
        self._m_reserved = metrics.Gauge("kvswarm_kv_bytes_reserved", "KV blocks held x block bytes", tag_keys=keys)
        self._m_budget = metrics.Gauge("kvswarm_kv_bytes_budget", "the plan's KV budget", tag_keys=keys)
        self._m_agents = metrics.Gauge("kvswarm_active_agents", "sessions with a turn running", tag_keys=keys)
        self._m_queue = metrics.Gauge("kvswarm_queue_depth", "turns waiting for their first token", tag_keys=keys)
        self._m_last = 0.0
        self._m_counted = 0
        # session lifecycle (issue 18): bytes held per state, and the counters' totals already exported
        self._m_idle = metrics.Gauge("kvswarm_kv_idle_bytes", "KV bytes of idle sessions kept in the pool",
                                     tag_keys=keys)  # fmt: skip
        self._m_parked = metrics.Gauge("kvswarm_kv_parked_bytes", "KV bytes of parked sessions, by tier (ram, disk)",
                                       tag_keys=(*keys, "tier"))  # fmt: skip
        self._m_life = {
            key: metrics.Counter(f"kvswarm_{key}", text, tag_keys=keys) for key, text in LIFECYCLE_COUNTERS.items()
        }
        self._m_life_counted: dict[str, int] = {}
        self._export(force=True)

    def _report(self, final: bool) -> None:
        if hasattr(self, "_m_last"):  # the loop thread starts before the metrics exist
            self._export(force=final)

    def _export(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._m_last < self.METRICS_EVERY_S:
            return
        self._m_last = now
        s = self.state()
        if s["tokens_generated"] > self._m_counted:
            self._m_tokens.inc(s["tokens_generated"] - self._m_counted, tags=self._tags)
            self._m_counted = s["tokens_generated"]
        self._m_tps.set(s["tokens_per_s"], tags=self._tags)
        self._m_used.set(s["kv_bytes_used"], tags=self._tags)
        self._m_reserved.set(s["kv_bytes_reserved"], tags=self._tags)
        self._m_budget.set(s["kv_budget_bytes"], tags=self._tags)
        self._m_agents.set(s["active_sessions"], tags=self._tags)
        self._m_queue.set(s["queue_depth"], tags=self._tags)
        life = lifecycle_numbers(s.get("lifecycle"))
        self._m_idle.set(life["idle_bytes"], tags=self._tags)
        for tier in ("ram", "disk"):
            self._m_parked.set(life[f"parked_{tier}_bytes"], tags={**self._tags, "tier": tier})
        for key, counter in self._m_life.items():
            done = self._m_life_counted.get(key, 0)
            if life[key] > done:
                counter.inc(life[key] - done, tags=self._tags)
                self._m_life_counted[key] = life[key]

    def ship_in(self, session: str, blobs: list[Any]) -> dict[str, Any]:
        """Imports a session shipped from another worker. `blobs` holds the source's export as an ObjectRef, in a
        list so that Ray leaves it unresolved: the bytes come from the object store to this process (never through
        the driver), and a source that died is this call's answer ({"imported": False}), not this worker's failure."""
        try:
            blob = ray.get(blobs[0], timeout=CALL_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - the source died or its export raised: the caller re-prefills
            return {"imported": False, "why": f"the source's export failed: {type(e).__name__}: {str(e)[:200]}"}
        if blob is None:
            return {"imported": False, "why": "the source held no KV for it (dropped, running or unknown there)"}
        got = self.import_session(session, blob)
        self._export(force=True)  # an idle worker's loop exports nothing until its next step
        return {**got, "imported": bool(got.get("accepted")), "bytes": len(blob), "why": got.get("reason", "")}

    def export_session(self, session: str) -> bytes | None:
        out = super().export_session(session)
        self._export(force=True)  # the ship out counts now, not at the next step
        return out

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def ready(self) -> bool:
        return True


_RemoteWorker = ray.remote(max_concurrency=8, max_restarts=0)(MeteredEngineWorker)


# -- placement ----------------------------------------------------------------------------


@dataclass
class WorkerHandle:
    spec: WorkerSpec
    actor: Any
    pg: PlacementGroup
    node_id: str
    kv_pg: PlacementGroup | None = None
    kv_generation: int = 0
    reservations: tuple[Reservation, ...] = ()
    alive: bool = True


@dataclass
class Scheduler:
    """Places workers and KV reservations for one swarm and relays calls to the workers."""

    swarm: str
    conn: Connection
    workers: dict[str, WorkerHandle] = field(default_factory=dict)

    @property
    def _lifetime(self) -> str | None:
        # --keep: the workers and reservations outlive the driver (its Ray runs as its own head).
        return "detached" if self.conn.head_process else None

    def worker_pg_name(self, worker: str) -> str:
        return f"kvswarm.{self.swarm}/{worker}"

    def actor_name(self, worker: str) -> str:
        return f"{self.swarm}.{worker}"

    def check_resources(self, spec: WorkerSpec) -> None:
        res = cluster_resources()
        if spec.kind == "cluster" and res.get(f"device:{spec.device}", 0) < 1:
            raise SchedulerError(
                f"worker {spec.name!r}: no Ray node offers resource device:{spec.device}. To fix: on that machine "
                f"run `ray start --address {self.conn.address} --resources "
                f'\'{{"device:{spec.device}": 1, "{KV_RESOURCE}": <KV bytes>}}\'`'
            )
        kv = kv_resource(spec)
        if res.get(kv, 0) < spec.kv_budget_bytes:
            raise SchedulerError(
                f"worker {spec.name!r} needs {spec.kv_budget_bytes:,} bytes of resource {kv}, the cluster "
                f"offers {res.get(kv, 0):,.0f}. To fix: start nodes with --resources "
                f"'{{\"{kv}\": <bytes>}}' (`swarm launch` does for a Ray it starts), or plan fewer agents"
            )

    def start_workers(self, specs: Iterable[tuple[WorkerSpec, int]], timeout_s: float = TIMEOUT_S) -> None:
        """Starts (spec, resident bytes) workers in parallel; returns once every one answers."""
        pending = []
        for spec, resident in specs:
            if spec.name in self.workers:
                raise SchedulerError(f"worker {spec.name!r} is already running")
            self.check_resources(spec)
            bundle: dict[str, float] = {"memory": float(resident)}
            if spec.kind != "virtual":
                bundle["CPU"] = 1.0
            if spec.kind == "cluster":
                bundle[f"device:{spec.device}"] = 1.0
            if gpu_request(spec, cluster_resources()):  # a GPU worker where Ray sees GPUs: it holds one
                bundle["GPU"] = 1.0
            selector = [{NODE_LABEL: self.conn.node_id}] if spec.kind != "cluster" else None
            pg = placement_group([bundle], strategy="STRICT_PACK", name=self.worker_pg_name(spec.name),
                                 bundle_label_selector=selector, lifetime=self._lifetime)  # fmt: skip
            pending.append((spec, bundle, pg))
        try:
            ray.get([pg.ready() for _, _, pg in pending], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            for _, _, pg in pending:
                remove_placement_group(pg)
            raise SchedulerError(
                f"placement of {', '.join(s.name for s, _, _ in pending)} did not finish in {timeout_s:.0f} s: "
                "no node has the CPU, memory or device resources free. To fix: check `ray status`"
            ) from e
        started = []
        try:
            for spec, bundle, pg in pending:
                actor = _RemoteWorker.options(
                    name=self.actor_name(spec.name),
                    num_cpus=bundle.get("CPU", 0.0),
                    num_gpus=bundle.get("GPU", 0.0),
                    memory=bundle["memory"],
                    resources={k: v for k, v in bundle.items() if k.startswith("device:")},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
                    lifetime=self._lifetime,
                ).remote(_spec_dict(spec))
                started.append((spec, actor, pg))
            calibrating = any(spec.calibration != "catalog" for spec, _, _ in started)  # a cold full run: minutes
            nodes = _get([a.node_id.remote() for _, a, _ in started], max(timeout_s, CALIBRATE_TIMEOUT_S)
                         if calibrating else timeout_s, "worker start")  # fmt: skip
        except BaseException:  # none of them is kept: their actors and groups go, so a retry finds the names free
            for _, actor, _ in started:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            for _, _, pg in pending:
                with contextlib.suppress(Exception):
                    remove_placement_group(pg)
            raise
        for (spec, actor, pg), node in zip(started, nodes, strict=True):
            self.workers[spec.name] = WorkerHandle(spec=spec, actor=actor, pg=pg, node_id=node)

    def reserve(self, worker: str, reservations: Sequence[Reservation], timeout_s: float = TIMEOUT_S) -> None:
        """Holds the agents' KV on the worker's node (replacing the previous generation)."""
        h = self.workers[worker]
        total = sum(r.kv_bytes for r in reservations)
        if total > h.spec.kv_budget_bytes:
            raise SchedulerError(
                f"worker {worker!r}: reservations of {total:,} bytes exceed its KV budget {h.spec.kv_budget_bytes:,}"
            )
        if h.kv_pg is not None:
            remove_placement_group(h.kv_pg)
            h.kv_pg = None
        h.reservations = tuple(r for r in reservations if r.kv_bytes > 0)
        if not h.reservations:
            return
        h.kv_generation += 1
        name = f"{self.worker_pg_name(worker)} kv{h.kv_generation}: {compact_names([r.label for r in h.reservations])}"
        pg = placement_group(
            [{kv_resource(h.spec): float(r.kv_bytes)} for r in h.reservations], strategy="STRICT_PACK", name=name,
            bundle_label_selector=[{NODE_LABEL: h.node_id}] * len(h.reservations),
            lifetime=self._lifetime,
        )  # fmt: skip
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            remove_placement_group(pg)
            raise SchedulerError(
                f"worker {worker!r}: the node cannot hold {total:,} bytes of {kv_resource(h.spec)} for its agents "
                f"(another swarm may hold it). To fix: check `ray status`"
            ) from e
        h.kv_pg = pg

    # -- calls to workers ---------------------------------------------------------------
    def _live(self, worker: str) -> WorkerHandle:
        h = self.workers.get(worker)
        if h is None or not h.alive:
            raise WorkerLost(f"worker {worker!r} is not running")
        return h

    def submit(
        self, worker: str, session: str, turn: int, tokens: list[int], sampling: dict[str, Any], fresh: bool
    ) -> None:
        h = self._live(worker)
        _get([h.actor.submit.remote(session, turn, tokens, sampling, fresh)], CALL_TIMEOUT_S, worker, h)

    def resize(self, worker: str, kv_budget_bytes: int, agents: str) -> None:
        """Moves a running worker's KV budget (a re-plan kept its formats)."""
        h = self._live(worker)
        _get([h.actor.set_budget.remote(kv_budget_bytes, agents)], CALL_TIMEOUT_S, worker, h)
        h.spec = dataclasses.replace(h.spec, kv_budget_bytes=kv_budget_bytes, agents=agents)

    def end(self, worker: str, session: str) -> None:
        h = self.workers.get(worker)
        if h is not None and h.alive:
            with contextlib.suppress(CallRefused):  # the session is gone either way
                _get([h.actor.end.remote(session)], CALL_TIMEOUT_S, worker, h)

    def drain_all(self) -> dict[str, dict[str, dict[str, Any]] | WorkerLost]:
        """Each live worker's new tokens; a worker that died maps to a WorkerLost."""
        live = [h for h in self.workers.values() if h.alive]
        refs = [h.actor.drain.remote() for h in live]
        return dict(zip([h.spec.name for h in live], _gather(refs, live), strict=True))

    def states(self) -> dict[str, dict[str, Any] | WorkerLost]:
        """Every live worker's state(); safe to call while another thread places workers (a copy is iterated)."""
        live = [h for h in list(self.workers.values()) if h.alive]
        refs = [h.actor.state.remote() for h in live]
        return dict(zip([h.spec.name for h in live], _gather(refs, live), strict=True))

    def forget(self, worker: str) -> None:
        """Drops a lost worker: its actor, placement groups and reservations."""
        h = self.workers.pop(worker, None)
        if h is None:
            return
        h.alive = False
        for pg in (h.kv_pg, h.pg):
            if pg is not None:
                with contextlib.suppress(Exception):  # the group may be gone with its node
                    remove_placement_group(pg)
        with contextlib.suppress(Exception):  # already dead
            ray.kill(h.actor, no_restart=True)

    def kill(self, worker: str) -> None:
        """Kills a worker's actor as a crash would (tests and drills)."""
        ray.kill(self.workers[worker].actor, no_restart=True)

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """Stops every worker (one shared deadline, so a dead Ray does not hold this up) and frees its groups."""
        with contextlib.suppress(Exception):  # stopping anyway
            refs = [h.actor.stop.remote() for h in self.workers.values() if h.alive]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for name in list(self.workers):
            self.forget(name)

    def live_workers(self) -> list[str]:
        return [n for n, h in self.workers.items() if h.alive]

    # -- shipping a session's KV on a planned move (docs/RELIABILITY.md) --------------------------
    def export_ref(self, worker: str, session: str) -> Any:
        """The source's snapshot of a session (EngineWorker.export_session) as an ObjectRef: its bytes stay in
        Ray's object store until the destination fetches them."""
        return self._live(worker).actor.export_session.remote(session)

    def wait_exports(self, refs: Sequence[Any], timeout_s: float = CALL_TIMEOUT_S) -> set[Any]:
        """The exports that finished within the deadline (fetched nowhere: a source may be stopped after this)."""
        if not refs:
            return set()
        try:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s, fetch_local=False)
        except Exception:  # noqa: BLE001 - Ray itself is gone: nothing ships, every agent re-prefills
            return set()
        return set(ready)

    def ship(self, worker: str, session: str, export: Any) -> dict[str, Any]:
        """Hands an export's ObjectRef straight to the destination's import: {"imported": True, "bytes", ...}, or
        {"imported": False, "why"} when the source's export failed or held nothing or the destination refused the
        snapshot (another model, no room in its park tiers)."""
        h = self._live(worker)
        out: dict[str, Any] = _get([h.actor.ship_in.remote(session, [export])], CALL_TIMEOUT_S, worker, h)[0]
        return out


def gpu_request(spec: WorkerSpec, resources: dict[str, float]) -> bool:
    """True when the worker runs on a GPU (backend vulkan) and Ray sees one (the `GPU` resource; Ray counts
    NVIDIA GPUs itself, others when a node starts with --num-gpus): then its actor requests one. Without it a
    GPU worker still runs; Ray just does not account for its GPU."""
    return spec.backend != "cpu" and resources.get("GPU", 0.0) >= 1.0


def kv_resource(spec: WorkerSpec) -> str:
    """The Ray resource a worker's KV reservations hold: a local GPU worker's device_kv_resource (its device
    heap), else the node's KV_RESOURCE (host memory; a cluster node declares it for whatever device it has)."""
    return device_kv_resource(spec.device) if spec.kind == "local" and spec.backend != "cpu" else KV_RESOURCE


def _kv_held(unit_resources: dict[str, float]) -> dict[str, Any]:
    """{"kv_bytes": bytes, "kv_resource": name} of a placement-group bundle (0 and "" for a worker's own)."""
    for name, amount in unit_resources.items():
        if name == KV_RESOURCE or name.startswith(f"{KV_RESOURCE}:"):
            return {"kv_bytes": int(amount), "kv_resource": name}
    return {"kv_bytes": 0, "kv_resource": ""}


def _spec_dict(spec: WorkerSpec) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spec)


def _get(refs: list[Any], timeout_s: float, what: str, h: WorkerHandle | None = None) -> list[Any]:
    try:
        out: list[Any] = ray.get(refs, timeout=timeout_s)
        return out
    except ray.exceptions.GetTimeoutError as e:
        if h is not None:
            h.alive = False
        raise WorkerLost(f"{what}: no answer within {timeout_s:.0f} s") from e
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
        if h is not None:
            h.alive = False
        raise WorkerLost(f"{what}: the worker died ({type(e).__name__})") from e
    except ray.exceptions.RayTaskError as e:  # the method raised; the actor lives on
        if h is None:
            raise WorkerLost(f"{what}: {type(e.cause).__name__}: {str(e.cause)[:300]}") from e
        raise CallRefused(f"{what}: {type(e.cause).__name__}: {str(e.cause)[:500]}") from e


def _gather(refs: list[Any], handles: list[WorkerHandle], timeout_s: float = CALL_TIMEOUT_S) -> list[Any]:
    """One answer per worker within one shared deadline; a worker that died or stayed silent maps to WorkerLost."""
    try:
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0]) if refs else set()
    except Exception:  # noqa: BLE001 - Ray itself is gone: every worker is
        ready = set()
    out: list[Any] = []
    for ref, h in zip(refs, handles, strict=True):
        if ref not in ready:
            h.alive = False
            out.append(WorkerLost(f"worker {h.spec.name!r}: no answer within {timeout_s:.0f} s"))
            continue
        try:
            out.append(ray.get(ref, timeout=timeout_s))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError,
                RuntimeError) as e:  # fmt: skip
            h.alive = False
            out.append(WorkerLost(f"worker {h.spec.name!r}: {type(e).__name__}: {str(e)[:300]}"))
    return out


# -- reading the placement back from Ray's state ---------------------------------------------


def placement(swarm: str | None = None, timeout_s: int = 30) -> dict[str, Any]:
    """Live workers and KV bundles of kvswarm swarms, from Ray's state API."""
    # This process's Ray, by address: found by a scan, another Ray on the machine makes the call ambiguous.
    addr = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    actors = ray_state.list_actors(address=addr, filters=[("state", "=", "ALIVE")], limit=10_000, timeout=timeout_s,
                                   detail=True)  # fmt: skip
    pgs = ray_state.list_placement_groups(address=addr, filters=[("state", "=", "CREATED")], limit=10_000,
                                          timeout=timeout_s, detail=True)  # fmt: skip
    workers = {}
    for a in actors:
        if a.class_name.endswith("EngineWorker") and a.name and (swarm is None or a.name.startswith(f"{swarm}.")):
            workers[a.name] = {"actor": a.name, "node_id": a.node_id, "pid": a.pid, "repr": a.repr_name}
    groups = []
    for pg in pgs:
        if not pg.name.startswith("kvswarm.") or (swarm is not None and not pg.name.startswith(f"kvswarm.{swarm}/")):
            continue
        bundles = [{"node_id": b.get("node_id"), **_kv_held(b.get("unit_resources", {}))}
                   for b in (pg.bundles or [])]  # fmt: skip
        if " kv" in pg.name:
            head, _, labels = pg.name.partition(": ")
            worker = head.split("/", 1)[1].split(" ")[0]
            for b, label in zip(bundles, expand_names(labels), strict=False):
                b["label"] = label
        else:
            worker = pg.name.split("/", 1)[1]
            for b in bundles:
                b["label"] = "worker"
        groups.append({"name": pg.name, "worker": worker, "bundles": bundles})
    return {"workers": workers, "placement_groups": groups}


def worker_states(timeout_s: float = CALL_TIMEOUT_S) -> dict[str, dict[str, Any] | str]:
    """state() of every named EngineWorker in the kvswarm namespace."""
    out: dict[str, dict[str, Any] | str] = {}
    for name in sorted(ray.util.list_named_actors()):
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            out[name] = ray.get(actor.state.remote(), timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - reported per worker
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
    return out
