"""Planning and placing the swarm's agents on workers: re-plans, restarts, joins and losses."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from swarm import planner, scheduler
from swarm.errors import (
    NoFeasiblePlan,
    NotFound,
    SwarmError,
)
from swarm.planning import trusted_calibration
from swarm.runtime import placement as placing
from swarm.runtime.agents import (
    CRASH_WINDOW_S,
    REJOIN_AFTER_S,
    REPLAN_GAIN,
    RESTART_BACKOFF_MAX_S,
    START_ATTEMPTS,
    Agent,
)
from swarm.runtime.apply import apply_change
from swarm.runtime.placement import GroupKey
from worker.service import WorkerSpec


class PlacerMixin:
    """Plans over the workers and places by diff -> apply (swarm/runtime/placement.py, apply.py)."""

    def _groups(
        self, agents: list[Agent] | None = None
    ) -> tuple[list[planner.AgentGroup], dict[GroupKey, list[Agent]]]:
        by: dict[GroupKey, list[Agent]] = {}
        for a in self.agents.values() if agents is None else agents:
            if not a.finished:
                by.setdefault(a.planner_group, []).append(a)
        base = {g.name: g for g in self.inputs.groups}
        groups = []
        for key, members in by.items():
            b = base.get(key.name) or planner.AgentGroup(name=str(key), count=1, context=1)
            groups.append(dataclasses.replace(b, name=str(key), count=len(members), context=members[0].context))
        return groups, by

    def _plan(self, workers: list[str], agents: list[Agent] | None = None) -> planner.Plan:
        groups, _ = self._groups(agents)
        devices = [self.devices[w] for w in workers]
        i = self.inputs
        return planner.plan(i.geometry, devices, groups, i.policy, settings=i.settings, quality=i.quality)

    def _spec(self, wp: planner.WorkerPlan, agents: list[str]) -> WorkerSpec:
        w = self.worker_cfg[wp.worker]
        e = self.cfg.engine
        cal = "catalog" if w.kind == "virtual" or w.calibration_file else w.calibration  # catalog: the plan's costs
        return WorkerSpec(
            name=wp.worker, kind=w.kind, device=w.device_label, model=str(self.inputs.model_path),
            backend=w.backend, device_index=w.vulkan_index,
            kv_k=wp.kv_k, kv_v=wp.kv_v, kv_budget_bytes=placing.kv_budget(wp),
            threads=e.threads, block_tokens=e.block_tokens, max_batch_tokens=e.max_batch_tokens,
            calibration=cal, swarm=self.cfg.name, agents=scheduler.compact_names(agents),
            **self._lifecycle_spec(wp.worker),
        )  # fmt: skip

    def _lifecycle_spec(self, worker: str) -> dict[str, Any]:
        """The config's lifecycle section as WorkerSpec fields; a configured park_dir gets a folder per worker (a
        restarted worker finds its own parked sessions there, and no other worker's)."""
        life = self.cfg.lifecycle
        out: dict[str, Any] = {"lifecycle": life.policy, "park_disk_bytes": int(life.park_disk_bytes)}
        if life.park_dir is not None:
            out["park_dir"] = str(Path(life.park_dir).expanduser() / self.cfg.name / worker)
        if life.park_ram_bytes is not None:
            out["park_ram_bytes"] = int(life.park_ram_bytes)
        return out

    def current(self) -> placing.Current:
        """What runs now, as a value: the swarm's workers and where its unfinished agents are."""
        workers = {w: placing.WorkerNow(h.alive, h.spec.kv_k, h.spec.kv_v, h.spec.kv_budget_bytes, h.reservations)
                   for w, h in self.sched.workers.items()}  # fmt: skip
        agents = tuple(placing.AgentNow(a.name, a.planner_group, a.worker) for a in self.agents.values()
                       if not a.finished)  # fmt: skip
        return placing.Current(workers, agents)

    def place(self, workers: list[str], reason: str) -> None:
        """Plans the unfinished agents over `workers`, then applies the change (placement.diff) over Ray."""
        plan = self._plan(workers)
        apply_change(self, plan, placing.diff(plan, self.current()), reason)
        self.plan = plan
        self.initial_plan = self.initial_plan or plan
        self.generation += 1
        self._event("placed", reason=reason, plan=plan.to_dict()["workers"] if reason != "launch" else None)

    def _lose_sessions(self, worker: str, reason: str) -> None:
        for a in self.agents.values():
            if a.worker == worker and not a.finished:
                a.moved_from, a.move_reason = worker, reason
                a.worker = None

    def _grow(self, a: Agent, need: int) -> bool:
        """Re-plans with a larger reservation for `a`; False when no plan holds it."""
        bt = self.cfg.engine.block_tokens
        new = min(self.inputs.geometry.n_ctx, math.ceil(need / bt) * bt)
        if new <= a.context:
            return False
        old = a.context
        a.context = new
        try:
            self.place(self._placeable(), f"{a.name} needs {need} tokens of context")
            return True
        except NoFeasiblePlan as e:
            a.context = old
            self._event("context_capped", agent=a.name, need=need, reserved=old, why=str(e).splitlines()[0])
            return False
        except scheduler.SchedulerError as e:  # a worker died or would not start: placed again next tick
            self._owe_placement(f"{a.name} needs {need} tokens of context ({str(e)[:200]})")
            return a.context == new

    def _placeable(self) -> list[str]:
        """Workers a re-plan may use: the live ones and the configured ones not missing whose restart is due
        (a drained worker is used again only after undrain)."""
        now = time.monotonic()
        live = set(self.sched.live_workers())
        return [d for d in self.devices if d not in self.drained
                and (d in live or (d not in self.missing and self._restart_at.get(d, 0) <= now))]  # fmt: skip

    # -- planned moves: drain, and the KV that travels with them ------------------------------------
    def drain(self, worker: str, reason: str = "") -> None:
        """A planned move off `worker` (maintenance, scale-in): the agents are re-planned over the other workers,
        their KV shipped through Ray's object store, and the worker stops. NoFeasiblePlan (nothing changes) when
        the other workers cannot hold every agent."""
        if worker not in self.devices:
            raise NotFound(f"worker {worker!r} is not in swarm {self.cfg.name}; its workers: {', '.join(self.devices)}")
        with self.lock:
            self.drained.add(worker)
            try:
                self.place(self._placeable(), reason or f"drain {worker}")
            except NoFeasiblePlan:
                self.drained.discard(worker)
                raise
            self._event("drained", worker=worker)

    def undrain(self, worker: str) -> None:
        """Lets a drained worker take agents again (at the next placement)."""
        with self.lock:
            self.drained.discard(worker)

    def _ship_out(self, change: placing.PlacementChange) -> dict[str, tuple[str, str, Any]]:
        """Before any worker stops or any agent leaves: each moving agent's source exports its session, and the
        exports are awaited (not fetched). {agent: (source, destination, ObjectRef of the snapshot)}.

        Only an agent between turns ships: its source holds exactly its history. One with a turn in flight
        resumes by re-prefill on its new worker, as before."""
        out: dict[str, tuple[str, str, Any]] = {}
        for m in change.moves:
            a = self.agents.get(m.agent)
            if m.src is None or m.dst is None or a is None or a.finished or a.turn is not None or not a.synced:
                continue
            if a.worker != m.src or not a.history or m.src not in self.sched.live_workers():
                continue
            with contextlib.suppress(scheduler.WorkerLost):  # a source that died ships nothing
                out[m.agent] = (m.src, m.dst, self.sched.export_ref(m.src, m.agent))
        ready = self.sched.wait_exports([ref for _, _, ref in out.values()])
        for name, (src, dst, ref) in list(out.items()):
            if ref not in ready:
                why = f"the export did not finish within {scheduler.CALL_TIMEOUT_S:.0f} s; re-prefilled"
                self._event("ship_failed", agent=name, src=src, dst=dst, why=why)
                del out[name]
        return out

    def _ship_in(self, shipping: dict[str, tuple[str, str, Any]]) -> None:
        """After the destinations started: each export's ref goes straight to its destination's import. A ship
        that fails (the source died, the destination refused it) is an event, and the agent's next turn
        re-prefills its history there: never a lost job."""
        for name, (src, dst, ref) in shipping.items():
            a = self.agents[name]
            if a.finished or a.worker != dst:
                continue
            try:
                got = self.sched.ship(dst, name, ref)
            except (scheduler.WorkerLost, scheduler.CallRefused) as e:
                got = {"imported": False, "why": str(e)[:300]}
            if got.get("imported"):
                self._event("shipped", agent=name, src=src, dst=dst, bytes=int(got.get("bytes", 0)),
                            tokens=len(a.history))  # fmt: skip
            else:
                why = f"{got.get('why', 'refused')}; its next turn re-prefills {len(a.history)} tokens"
                self._event("ship_failed", agent=name, src=src, dst=dst, why=why)

    def _owe_placement(self, reason: str, after_s: float = 0.0) -> None:
        """Agents wait unplaced (their jobs queue) until the next tick that places them."""
        self._replace_reason = self._replace_reason or reason
        self._replace_after = time.monotonic() + after_s

    def _try_place(self) -> None:
        """Pays an owed placement: over the workers up or due for a restart. When they cannot hold every agent,
        the agents without a worker wait for the next restart; when a start fails it is retried, backed off."""
        reason = self._replace_reason or "re-place"
        workers = self._placeable()
        now = time.monotonic()
        later = [t for w, t in self._restart_at.items() if t > now and w not in workers]
        if not workers:
            self._replace_after = min(later, default=now + 1.0)
            return
        try:
            self.place(workers, reason)
        except NoFeasiblePlan as e:  # the workers up cannot hold them all: the rest wait for a restart
            self._event("place_deferred", workers=workers, why=str(e).splitlines()[0][:200])
            self._replace_after = min(later, default=now + 1.0)
            return
        except scheduler.SchedulerError as e:  # a start failed or a worker died while placing: try again
            failed = [w for w in self._starting if w not in self.sched.live_workers()]
            self._starting = []
            self._event("place_failed", workers=failed, error=str(e)[:300])
            for w in failed:
                n = self._start_failures[w] = self._start_failures.get(w, 0) + 1
                self._restart_at[w] = now + min(2.0**n, RESTART_BACKOFF_MAX_S)
            self._check_startable(str(e))
            self._replace_after = now + 1.0
            return
        for w in self.sched.live_workers():
            self._start_failures.pop(w, None)
            self._restart_at.pop(w, None)
        self._replace_reason = None
        if later:  # a backed-off worker comes back: place again then
            self._owe_placement(f"{reason}: restart", max(min(later) - now, 0.0))

    def _check_startable(self, error: str) -> None:
        """Fails the swarm when no worker runs and every one has failed START_ATTEMPTS starts in a row."""
        if self.sched.live_workers():
            return
        if self.missing and any(self.worker_cfg[w].kind == "cluster" for w in self.missing):
            return  # a cluster node may still join
        if all(self._start_failures.get(w, 0) >= START_ATTEMPTS for w in self.devices):
            raise SwarmError(f"no worker can be started ({START_ATTEMPTS} tries each); the last error: {error}")

    def _release(self) -> None:
        """Agents finished: re-plans the rest when the new plan is predicted to be REPLAN_GAIN faster than
        where they sit (a move costs a re-prefill); otherwise frees the finished agents' KV in place."""
        assert self.plan is not None
        live = [a for a in self.agents.values() if not a.finished and a.worker is not None]
        if live:
            now = 0.0
            for w in {a.worker for a in live}:  # the current assignment, each worker at its best format
                with contextlib.suppress(NoFeasiblePlan):
                    now += self._plan([w], [a for a in live if a.worker == w]).tokens_per_s  # type: ignore[list-item]
            try:
                better = self._plan(self._placeable())
            except NoFeasiblePlan:
                better = None
            if better is not None and better.tokens_per_s > REPLAN_GAIN * now:
                self._event("replan_gain", now=round(now, 1), planned=round(better.tokens_per_s, 1))
                self.place(self._placeable(), f"agents finished: {better.tokens_per_s:.0f} vs {now:.0f} tokens/s")
                return
        placed = [a for a in self.agents.values() if not a.finished and a.worker]
        assignment = {a.name: a.worker for a in placed}
        groups = {a.name: a.planner_group for a in placed}
        for wp in self.plan.workers:
            if wp.worker in self.sched.workers:
                self.sched.reserve(wp.worker, placing.reservations(wp, assignment, groups))

    def _after_loss(self, w: str) -> None:
        """A lost local or virtual worker is started afresh by the next placement: at once the first time, then
        backed off while it keeps dying (its agents wait or move); a lost cluster worker waits for a node that
        offers its device again."""
        now = time.monotonic()
        deaths = [t for t in self._deaths.get(w, []) if now - t < CRASH_WINDOW_S] + [now]
        self._deaths[w] = deaths
        if self.worker_cfg[w].kind == "cluster":
            self.missing.add(w)
            self._rejoin_after[w] = now + REJOIN_AFTER_S  # Ray may still list the dead node's resources
        elif len(deaths) > 1:
            wait = min(2.0 ** (len(deaths) - 2), RESTART_BACKOFF_MAX_S)
            self._restart_at[w] = now + wait
            self._event("worker_restart_backoff", worker=w, deaths=len(deaths), wait_s=wait)

    def _check_joins(self) -> None:
        res = scheduler.cluster_resources()
        now = time.monotonic()
        joined = [w for w in self.missing if res.get(f"device:{self.worker_cfg[w].device}", 0) >= 1
                  and now >= self._rejoin_after.get(w, 0.0)]  # fmt: skip
        if joined:
            self.missing -= set(joined)
            self._event("worker_joined", workers=joined)
            self.place(self.sched.live_workers() + joined, f"{', '.join(joined)} joined")

    def _adopt_measured_profiles(self) -> None:
        """Cluster workers calibrate themselves on start; the plan is redone with what they measured."""
        changed = []
        for w, st in self.sched.states().items():
            prof = st.get("profile") if isinstance(st, dict) else None
            d = self.devices.get(w)
            if d is None or not prof or prof.get("source") != "measured" or d.calibration.source == "measured":
                continue
            cal = planner.Calibration.from_dict(prof)
            cal = dataclasses.replace(cal, quality=cal.quality or self.inputs.quality)
            # an unreliable measurement is planned from the node's measured bandwidth, and says so
            cal = trusted_calibration(cal, self.inputs.geometry, self.inputs.policy.formats)
            self.devices[w] = dataclasses.replace(d, calibration=cal)
            changed.append(w)
        if changed:
            self._event("measured", workers=changed)
            self.place(self._placeable(), f"{', '.join(changed)} measured on their nodes")
