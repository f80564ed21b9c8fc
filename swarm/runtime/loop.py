"""The run loop: one launch's SwarmRun, its threads, and the tick that moves every agent on."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm import planner, scheduler
from swarm.config import SwarmConfig
from swarm.errors import (
    SwarmError,
)
from swarm.jobs import Job
from swarm.planning import PlanInputs
from swarm.runtime.admission import AdmissionMixin
from swarm.runtime.agents import (
    JOIN_CHECK_S,
    POLL_S,
    Agent,
    check_launchable,
)
from swarm.runtime.placer import PlacerMixin
from swarm.runtime.record import RecordMixin
from swarm.runtime.report import ReportMixin
from swarm.runtime.turns import TurnsMixin
from swarm.store import Store


class SwarmRun(TurnsMixin, PlacerMixin, AdmissionMixin, RecordMixin, ReportMixin):
    """One launch: plan, place, run every agent's turns, write transcripts."""

    def __init__(
        self,
        cfg: SwarmConfig,
        inputs: PlanInputs,
        sched: scheduler.Scheduler,
        out_dir: Path,
        *,
        echo: Callable[[str], None] = print,
        live: bool = True,
        serve: bool = False,
        store: Store | None = None,
    ) -> None:
        from worker.engine import load_tokenizer

        if not serve:
            check_launchable(cfg)
        assert inputs.model_path is not None
        self.cfg, self.inputs, self.sched = cfg, inputs, sched
        self.tok = load_tokenizer(inputs.model_path)
        self.stop_tokens = tuple(sorted(self.tok.eot_ids))
        self.out_dir = out_dir
        self.echo = echo
        self.live = live
        self.agents: dict[str, Agent] = {}
        for g in cfg.agents:
            for i in range(g.count):
                a = Agent(name=f"{g.name}-{i}", group=g, index=i, context=g.context)
                if g.system_prompt:
                    a.messages.append({"role": "system", "content": g.system_prompt})
                self.agents[a.name] = a
        self.devices = {d.name: d for d in inputs.devices}
        self.worker_cfg = {w.name: w for w in cfg.workers}
        self.missing: set[str] = set()  # cluster workers whose device no node offers yet
        self.drained: set[str] = set()  # workers drained on purpose (drain()): not planned until undrain()
        self.plan: planner.Plan | None = None
        self.initial_plan: planner.Plan | None = None
        self.events: list[dict[str, Any]] = []
        self.started = time.time()
        self.on_tick: Callable[[SwarmRun], None] | None = None  # called once per poll (drills, tests)
        self.on_state: Callable[[SwarmRun], None] | None = None  # called when `healthy` may have changed
        self.record_error = ""  # why the store cannot record now (disk full); "" while it records
        self._record_retry_at = 0.0
        self._released = False
        self._deaths: dict[str, list[float]] = {}  # worker -> monotonic times it died (within CRASH_WINDOW_S)
        self._restart_at: dict[str, float] = {}  # worker -> when it may be started again (backed off)
        self._start_failures: dict[str, int] = {}  # worker -> failed starts in a row
        self._replace_reason: str | None = None  # a placement is owed (a worker died or a start failed)
        self._replace_after = 0.0  # monotonic time of the next try
        self._starting: list[str] = []  # workers the placement in progress starts
        self._rejoin_after: dict[str, float] = {}
        self.serve = serve  # agents wait for jobs after their tasks instead of finishing
        self.lock = threading.RLock()  # the loop and API calls
        self.generation = 0  # placements made
        self.state = "starting"
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._oneoffs = 0
        self.jobs: dict[str, Job] = {}  # every job, for GetJob and streams
        self._open_jobs: dict[str, Job] = {}  # jobs not yet recorded as ended (the only ones flush looks at)
        self._placement_cache: tuple[float, int, dict[str, Any]] | None = None
        self.store = store  # durable agents and jobs (the API server); None: nothing is recorded
        self._snap_dirty: set[str] = set()  # agents whose snapshot must be rewritten
        self._hist_flushed: dict[str, int] = {}  # history tokens of each agent already recorded

    def begin(self) -> None:
        """Places the swarm (workers started, KV reserved)."""
        workers = [d.name for d in self.inputs.devices]
        res = scheduler.cluster_resources()
        for w in workers:
            wc = self.worker_cfg[w]
            if wc.kind == "cluster" and res.get(f"device:{wc.device}", 0) < 1:
                self.missing.add(w)
                self.echo(f"worker {w}: no node offers device:{wc.device} yet; planning without it")
        with self.lock:
            self.place([w for w in workers if w not in self.missing], "launch")
            self._adopt_measured_profiles()
            self.state = "running"
        self._state_changed()
        self._last_join = time.monotonic()

    def run(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Runs every agent's tasks to the end (the `swarm launch` mode)."""
        self.begin()
        assert self.plan is not None
        self.echo(str(self.plan))
        from swarm.progress import LiveProgress

        ui = LiveProgress(self.cfg.name, self.sched.states, self.progress) if self.live else None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not all(a.finished for a in self.agents.values()):
                if deadline is not None and time.monotonic() > deadline:
                    raise SwarmError(f"the swarm did not finish within {timeout_s:.0f} s")
                with self.lock:
                    self.tick()
                if ui is not None:
                    ui.update()
                if self.on_tick is not None:
                    self.on_tick(self)
                time.sleep(POLL_S)
        finally:
            if ui is not None:
                ui.close()
        self.state = "finished"
        return self.finish()

    def start(self) -> None:
        """Serve mode: places the swarm and runs its loop in a thread until stop()."""
        self.begin()
        self._thread = threading.Thread(target=self._serve_loop, name=f"swarm-{self.cfg.name}", daemon=True)
        self._thread.start()

    def _serve_loop(self) -> None:
        try:
            while not self._stop.is_set():
                with self.lock:
                    self.tick()
                if self.on_tick is not None:
                    self.on_tick(self)
                time.sleep(POLL_S)
        except Exception as e:  # the swarm fails visibly: its jobs are reported failed, never dropped
            with self.lock:
                self.state, self.error = "failed", f"{type(e).__name__}: {e}"
                self._fail_jobs(self.error)
                self._event("failed", error=self.error[:300])
                self.sched.shutdown()  # every worker and placement group goes, so a relaunch finds the names free
                with contextlib.suppress(Exception):  # the record may be what failed; the state is in memory
                    self.flush()
                    if self.store is not None:
                        self.store.set_swarm_state(self.cfg.name, "failed", self.error)
            self._state_changed()

    @property
    def healthy(self) -> bool:
        """Running and recording: what the per-swarm health check reports as SERVING."""
        return self.state == "running" and not self.record_error

    def _state_changed(self) -> None:
        if self.on_state is not None:
            with contextlib.suppress(Exception):  # a report must not take the swarm down
                self.on_state(self)

    def stop(self, reason: str = "the swarm was stopped") -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        with self.lock:
            self._fail_jobs(reason, cancelled=True)
            if self.state != "failed":
                self.state = "stopped"
            self.flush()
            self._state_changed()
            try:
                return self.finish()
            except OSError as e:  # transcripts could not be written (disk full): the record has the jobs
                self._event("transcripts_not_written", error=str(e)[:300])
                return {}

    def tick(self) -> None:
        """One poll: start turns, collect tokens, handle lost workers, deadlines and joins (under self.lock)."""
        now = time.time()
        for a in self.agents.values():
            if a.turn is not None and a.turn.request.job is not None:
                job = a.turn.request.job
                if job.deadline is not None and now > job.deadline:
                    self._cancel_turn(a, "deadline")
            for job in [j for j in a.jobs if j.deadline is not None and now > j.deadline]:
                a.jobs.remove(job)
                job.finish("cancelled", "deadline")
        for a in self.agents.values():  # while nothing can be recorded no new turn starts (running ones pause)
            if not a.finished and a.turn is None and a.worker is not None and a.worker in self.sched.workers and \
                    not self.record_error:  # fmt: skip
                self._start_turn(a)
        drained = self.sched.drain_all()
        lost = [w for w, ev in drained.items() if isinstance(ev, scheduler.WorkerLost)]
        lost += [w for w, h in self.sched.workers.items() if not h.alive and w not in lost]  # died in another call
        for ev in drained.values():
            if not isinstance(ev, scheduler.WorkerLost):
                self._apply(ev)
        if lost:
            for w in lost:
                err = drained.get(w)
                self._event("worker_lost", worker=w, error=str(err) if err else "the worker died")
                self._lose_sessions(w, f"worker {w} was lost")
                self.sched.forget(w)
            for w in lost:
                self._after_loss(w)
            self._owe_placement(f"lost {', '.join(lost)}")
        if self._replace_reason is not None:
            if time.monotonic() >= self._replace_after:
                self._try_place()
        elif self._released:
            self._released = False
            try:
                self._release()
            except scheduler.SchedulerError as e:  # a worker died or Ray could not hold the KV: place again
                self._owe_placement(f"agents finished ({str(e)[:200]})")
        if self.missing and time.monotonic() - self._last_join > JOIN_CHECK_S:
            self._last_join = time.monotonic()
            self._check_joins()
        self.flush()

    def _event(self, kind: str, **data: Any) -> None:
        self.events.append({"event": kind, "t": round(time.time() - self.started, 3), **data})
        if kind in ("moved", "worker_lost", "worker_joined", "context_capped", "shipped", "ship_failed") and \
                not self.live:  # fmt: skip
            self.echo(f"[{kind}] " + ", ".join(f"{k}={v}" for k, v in data.items() if k != "plan"))
