"""The one imperative step of a placement: a PlacementChange carried out over Ray, in its steps' order."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from swarm import scheduler
from swarm.runtime.placement import PlacementChange, kv_budget

if TYPE_CHECKING:
    from swarm.planner import Plan
    from swarm.runtime.loop import SwarmRun


def apply_change(run: SwarmRun, plan: Plan, change: PlacementChange, reason: str) -> None:
    """stop -> agents leave -> resize (a failed resize restarts the worker) -> start -> agents arrive -> reserve."""
    sched = run.sched
    shipping = run._ship_out(change)  # moving agents' KV, exported before anything stops (placer.py)
    for s in change.stop:
        run._lose_sessions(s.worker, s.reason)
        sched.forget(s.worker)
    for m in change.leaving:
        a = run.agents[m.agent]
        if a.worker is None:
            continue
        if a.worker in sched.workers:
            with contextlib.suppress(scheduler.WorkerLost):  # the next tick reports the loss
                sched.end(a.worker, a.name)
        a.moved_from, a.move_reason = a.worker, reason
        a.worker = None
    to_start = [(run._spec(s.plan, list(s.agents)), s.plan.weight_bytes + s.plan.scratch_bytes) for s in change.start]
    restarted = []
    for r in change.resize:
        try:  # same formats: the engine's budget moves in place, its sessions stay
            sched.resize(r.worker, r.kv_budget_bytes, scheduler.compact_names(r.agents))
        except Exception as e:  # noqa: BLE001 - below the blocks in use, or it died: restart instead
            if isinstance(e, scheduler.WorkerLost):
                run._event("worker_lost", worker=r.worker, error=str(e)[:200])
                run._after_loss(r.worker)
            else:
                run._event("resize_failed", worker=r.worker, error=str(e)[:200])
            wp = plan.worker(r.worker)
            run._lose_sessions(r.worker, f"{r.worker} restarts with a {kv_budget(wp):,}-byte KV budget")
            sched.forget(r.worker)
            to_start.append((run._spec(wp, list(r.agents)), wp.weight_bytes + wp.scratch_bytes))
            restarted.append(r.worker)
    if to_start:
        run._starting = [spec.name for spec, _ in to_start]
        sched.start_workers(to_start)
        run._starting = []
    for a in run.agents.values():
        dst = change.assignment.get(a.name)
        if not a.finished and a.worker is None and dst is not None:
            a.worker, a.synced = dst, False
            if a.moved_from is not None:
                run._event("moved", agent=a.name, src=a.moved_from, dst=a.worker, reason=a.move_reason,
                           history=len(a.history))  # fmt: skip
                a.moved_from = None
            if a.turn is not None:  # resume the turn from the history, on the new worker
                run._resume(a)
    run._ship_in(shipping)  # the exports' refs to the arrived agents' new workers, before their next turn
    for w in dict.fromkeys((*change.reserve, *restarted)):
        sched.reserve(w, change.reservations[w])
