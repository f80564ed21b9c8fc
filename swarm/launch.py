"""`swarm launch`: run a whole agent swarm, placed by the planner, on Ray workers.

The driver owns every agent's conversation and token history (the engine's
sequence on its worker is a cache of it), so a session can move: to a new
worker it is re-prefilled from that history, and its transcript stays whole.
Ray is reached only through swarm/scheduler.py.

Re-planning happens when
- a worker dies or stops answering: its agents move to the survivors,
- a cluster worker whose device was missing at launch joins,
- an agent's next turn would run past its reserved context: it is re-planned
  with the larger context (or, if nothing fits, the turn is cut at the
  reservation and its transcript says so),
and when agents finish their KV reservations are released.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm import planner, scheduler
from swarm.config import AgentGroup, SwarmConfig
from swarm.errors import (
    ConfigError,
    FailedPrecondition,
    NoFeasiblePlan,
    NotFound,
    ResourceExhausted,
    StoreFull,
    SwarmError,
)
from swarm.jobs import Job
from swarm.planning import PlanInputs, available_memory, plan_inputs, trusted_calibration
from swarm.store import Store
from worker.service import WorkerSpec

POLL_S = 0.05
CRASH_WINDOW_S = 60.0  # deaths of one worker within this window back its restarts off
RECORD_RETRY_S = 1.0  # while the store cannot record (disk full), how often a write is tried again
RESTART_BACKOFF_MAX_S = 30.0  # the longest wait before a worker that keeps dying is started again
START_ATTEMPTS = 3  # failed starts of every worker in a row before the swarm is failed (nothing can run)
REJOIN_AFTER_S = 30.0
REPLAN_GAIN = 1.15  # a re-plan after agents finish must promise this much more aggregate tokens/s
JOIN_CHECK_S = 2.0
CANCEL_REASONS = ("cancelled", "deadline", "client_cancelled", "swarm_stopped")
DEFAULT_REVIEW = "Here are the other agents' reports. Review them."


@dataclass
class TurnRequest:
    """What a turn adds and how it samples: a configured task or a job from the API."""

    messages: list[dict[str, str]]
    max_new: int
    sampling: dict[str, Any] | None = None  # None: the group's
    job: Job | None = None
    task: bool = False  # one of the agent's configured tasks


@dataclass
class Turn:
    index: int
    user: str
    request: TurnRequest
    prompt_tokens: int = 0
    reply: list[int] = field(default_factory=list)
    started: float = 0.0
    first_token_s: float | None = None
    worker: str = ""
    kv_format: str = ""
    resumed: int = 0  # times it was re-prefilled on another worker mid-turn
    prompt_ids: list[int] = field(default_factory=list)  # the tokens this turn added to the history
    fresh: bool = False  # prompt_ids are the whole conversation (the history was re-rendered)


@dataclass
class Agent:
    name: str
    group: AgentGroup
    index: int
    context: int  # tokens reserved
    messages: list[dict[str, str]] = field(default_factory=list)
    history: list[int] = field(default_factory=list)  # every token the engine sequence holds
    turns_done: int = 0
    turn: Turn | None = None
    worker: str | None = None
    finished: bool = False
    finish_note: str = ""
    moved_from: str | None = None  # the worker it left, until it is placed again
    synced: bool = False  # its worker holds its history (False after a move)
    move_reason: str = ""
    tokens_generated: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)  # transcript records
    tasks_done: int = 0  # configured tasks completed
    jobs: deque[Job] = field(default_factory=deque)  # API jobs waiting for their turn
    oneoff: bool = False  # placed for one job, released after it

    @property
    def planner_group(self) -> str:
        return self.group.name if self.context == self.group.context else f"{self.group.name}@{self.context}"


def check_launchable(cfg: SwarmConfig) -> None:
    """What `swarm plan` accepts but a run needs besides: turns for every agent, a real model."""
    if cfg.model.geometry is not None:
        raise ConfigError("model.geometry", "describes a model with no weights", "give model.path to launch")
    for i, g in enumerate(cfg.agents):
        if not g.tasks and g.inputs_from is None:
            raise ConfigError(f"agents[{i}].tasks", "is empty", "give the turns each agent works through, or set "
                              "inputs_from to review another group's output")  # fmt: skip


class SwarmRun:
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

    # -- planning and placement ------------------------------------------------------------
    def _groups(self, agents: list[Agent] | None = None) -> tuple[list[planner.AgentGroup], dict[str, list[Agent]]]:
        by: dict[str, list[Agent]] = {}
        for a in self.agents.values() if agents is None else agents:
            if not a.finished:
                by.setdefault(a.planner_group, []).append(a)
        base = {g.name: g for g in self.inputs.groups}
        groups = []
        for key, members in by.items():
            b = base.get(members[0].group.name) or planner.AgentGroup(name=key, count=1, context=1)
            groups.append(dataclasses.replace(b, name=key, count=len(members), context=members[0].context))
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
            name=wp.worker, kind=w.kind, device=w.device or "local", model=str(self.inputs.model_path),
            kv_k=wp.kv_k, kv_v=wp.kv_v, kv_budget_bytes=max(wp.kv_bytes, wp.block_bytes),
            threads=e.threads, block_tokens=e.block_tokens, max_batch_tokens=e.max_batch_tokens,
            calibration=cal, swarm=self.cfg.name, agents=scheduler.compact_names(agents),
        )  # fmt: skip

    def _assign(self, plan: planner.Plan) -> dict[str, str]:
        """Agent -> worker for a plan, keeping agents where they are when the plan allows."""
        _, by = self._groups()
        out: dict[str, str] = {}
        for key, members in by.items():
            want = {wp.worker: next((g.agents for g in wp.groups if g.group == key), 0) for wp in plan.workers}
            movers = []
            for a in members:
                if a.worker is not None and want.get(a.worker, 0) > 0:
                    want[a.worker] -= 1
                    out[a.name] = a.worker
                else:
                    movers.append(a)
            for a in movers:
                w = next(w for w, n in want.items() if n > 0)
                want[w] -= 1
                out[a.name] = w
        return out

    def _reservations(self, wp: planner.WorkerPlan, assignment: dict[str, str]) -> list[scheduler.Reservation]:
        out = []
        for g in wp.groups:
            names = sorted((n for n, w in assignment.items() if w == wp.worker and
                            self.agents[n].planner_group == g.group), key=_agent_key)  # fmt: skip
            if g.shared_blocks and names:
                out.append(scheduler.Reservation(f"{g.group.split('@')[0]}.prefix", g.shared_blocks * wp.block_bytes))
            out += [scheduler.Reservation(name, g.blocks_per_agent * wp.block_bytes) for name in names]
        return out

    def place(self, workers: list[str], reason: str) -> None:
        """Plans the unfinished agents over `workers`, starts or restarts workers, moves agents, reserves KV.

        Order matters: agents leave their old workers (freeing KV) before a kept
        worker's budget moves, and arrive (re-prefilled) only after it has.
        """
        plan = self._plan(workers)
        assignment = self._assign(plan)
        planned = {wp.worker: wp for wp in plan.workers if wp.agents > 0}
        for w in self.sched.live_workers():
            wp = planned.get(w)
            h = self.sched.workers[w]
            if wp is None or (h.spec.kv_k, h.spec.kv_v) != (wp.kv_k, wp.kv_v):
                why = f"worker {w} has no agents in the new plan" if wp is None else f"{w} restarts with KV {wp.format}"
                self._lose_sessions(w, why)
                self.sched.forget(w)
        for a in self.agents.values():
            if not a.finished and a.worker is not None and a.worker != assignment[a.name]:
                if a.worker in self.sched.workers:
                    with contextlib.suppress(scheduler.WorkerLost):  # the next tick reports the loss
                        self.sched.end(a.worker, a.name)
                a.moved_from, a.move_reason = a.worker, reason
                a.worker = None
        to_start = []
        for w, wp in planned.items():
            names = sorted((n for n, x in assignment.items() if x == w), key=_agent_key)
            budget = max(wp.kv_bytes, wp.block_bytes)
            h = self.sched.workers.get(w)
            if h is None:
                to_start.append((self._spec(wp, names), wp.weight_bytes + wp.scratch_bytes))
            elif h.spec.kv_budget_bytes != budget:
                try:  # same formats: the engine's budget moves in place, its sessions stay
                    self.sched.resize(w, budget, scheduler.compact_names(names))
                except Exception as e:  # noqa: BLE001 - below the blocks in use, or it died: restart instead
                    if isinstance(e, scheduler.WorkerLost):
                        self._event("worker_lost", worker=w, error=str(e)[:200])
                        self._after_loss(w)
                    else:
                        self._event("resize_failed", worker=w, error=str(e)[:200])
                    self._lose_sessions(w, f"{w} restarts with a {budget:,}-byte KV budget")
                    self.sched.forget(w)
                    to_start.append((self._spec(wp, names), wp.weight_bytes + wp.scratch_bytes))
        if to_start:
            self._starting = [spec.name for spec, _ in to_start]
            self.sched.start_workers(to_start)
            self._starting = []
        for a in self.agents.values():
            if not a.finished and a.worker is None:
                a.worker, a.synced = assignment[a.name], False
                if a.moved_from is not None:
                    self._event("moved", agent=a.name, src=a.moved_from, dst=a.worker, reason=a.move_reason,
                                history=len(a.history))  # fmt: skip
                    a.moved_from = None
                if a.turn is not None:  # resume the turn from the history, on the new worker
                    self._resume(a)
        for w, wp in planned.items():
            self.sched.reserve(w, self._reservations(wp, assignment))
        self.plan = plan
        self.initial_plan = self.initial_plan or plan
        self.generation += 1
        self._event("placed", reason=reason, plan=plan.to_dict()["workers"] if reason != "launch" else None)

    def _lose_sessions(self, worker: str, reason: str) -> None:
        for a in self.agents.values():
            if a.worker == worker and not a.finished:
                a.moved_from, a.move_reason = worker, reason
                a.worker = None

    # -- turns ----------------------------------------------------------------------------
    def _task_text(self, a: Agent) -> str | None:
        """The next configured task's user message, or None while its inputs are not ready."""
        g = a.group
        tasks = list(g.tasks)
        if g.inputs_from is not None:
            sources = [s for s in self.agents.values() if s.group.name == g.inputs_from]
            if not all(self._tasks_over(s) for s in sources):
                return None
            if a.tasks_done == 0:
                reports = "\n\n".join(f"Report from {s.name}:\n{_last_reply(s)}" for s in sources)
                return f"{tasks[0] if tasks else DEFAULT_REVIEW}\n\n{reports}"
        return tasks[a.tasks_done]

    def _n_turns(self, a: Agent) -> int:
        """Configured turns (tasks, or the one review turn of an inputs_from group)."""
        if a.oneoff:
            return 0
        return max(len(a.group.tasks), 1 if a.group.inputs_from else 0)

    def _tasks_over(self, a: Agent) -> bool:
        return a.finished or (a.tasks_done >= self._n_turns(a) and a.turn is None)

    def _next_request(self, a: Agent) -> TurnRequest | None:
        if a.tasks_done < self._n_turns(a):
            text = self._task_text(a)
            if text is None:
                return None
            return TurnRequest([{"role": "user", "content": text}], a.group.max_new_tokens, task=True)
        while a.jobs:
            job = a.jobs.popleft()
            if not job.done:  # cancelled while queued
                return TurnRequest(job.messages, job.max_tokens, job.sampling, job=job)
        return None

    def _sampling(self, a: Agent, req: TurnRequest, max_new: int) -> dict[str, Any]:
        s = a.group.sampling
        base = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "repetition_penalty": s.repetition_penalty, "seed": s.seed + a.index + 7919 * a.turns_done}  # fmt: skip
        return {**base, **(req.sampling or {}), "max_new_tokens": max_new, "stop_tokens": self.stop_tokens}

    def _encode_turn(self, a: Agent, new: list[dict[str, str]]) -> tuple[list[int], bool]:
        """Tokens extending the agent's history with new messages (fresh: the whole conversation)."""
        text = self.tok.render_chat(a.messages + new, add_generation_prompt=True)
        if a.history:
            have = self.tok.decode(a.history)
            if text.startswith(have) and len(text) > len(have):
                return self.tok.encode(text[len(have) :], add_bos=False), False
        return self.tok.encode(text), True

    def _start_turn(self, a: Agent) -> bool:
        req = self._next_request(a)
        if req is None:
            return False
        try:
            self._begin_turn(a, req)
        except Exception as e:  # noqa: BLE001 - an error serving one job fails that job, not the swarm
            why = f"{type(e).__name__}: {str(e)[:300]}"
            if a.turn is not None and a.turn.request is req:
                self._fail_turn(a, why)
            else:
                self._event("turn_failed", agent=a.name, job=req.job.id if req.job else None, error=why)
                if req.job is not None:
                    req.job.finish("failed", "error", f"the turn could not start: {why}")
                if req.task:
                    a.tasks_done += 1
                    a.turns_done += 1
        return True

    def _begin_turn(self, a: Agent, req: TurnRequest) -> None:
        tokens, fresh = self._encode_turn(a, req.messages)
        need = (0 if fresh else len(a.history)) + len(tokens) + req.max_new
        if need > a.context:
            self._grow(a, need)  # if nothing holds it, the turn is cut at the reservation (_submit clips it)
        if not a.synced and not fresh:  # it moved: the new worker prefills the whole history
            tokens, fresh = a.history + tokens, True
        user = "\n\n".join(m["content"] for m in req.messages if m["role"] == "user")
        t = Turn(index=a.turns_done, user=user, request=req, started=time.time())
        a.messages.extend(req.messages)
        a.history = tokens if fresh else a.history + tokens
        t.prompt_tokens, t.prompt_ids, t.fresh = len(tokens), list(tokens), fresh
        a.turn = t
        self._snap_dirty.add(a.name)
        if req.job is not None and a.worker is not None:
            h = self.sched.workers.get(a.worker)
            fmt = _format(h.spec.kv_k, h.spec.kv_v) if h else ""
            req.job.begin(self.tok.stream_decoder(skip_special=True), a.worker, fmt, len(tokens))
        self._submit(a, tokens, fresh)

    def _submit(self, a: Agent, tokens: list[int], fresh: bool) -> None:
        t = a.turn
        assert t is not None
        if a.worker is None or a.worker not in self.sched.workers:
            return  # its worker is down: the next placement resumes the turn from the history
        left = t.request.max_new - len(t.reply)
        room = a.context - len(a.history)
        max_new = min(left, room)
        if max_new <= 0:
            self._end_turn(a, "context" if room <= 0 else "max_tokens")
            return
        h = self.sched.workers[a.worker]
        t.worker, t.kv_format = a.worker, _format(h.spec.kv_k, h.spec.kv_v)
        if t.request.job is not None:
            t.request.job.relocate(t.worker, t.kv_format)
        try:
            self.sched.submit(a.worker, a.name, t.index, tokens, self._sampling(a, t.request, max_new), fresh)
            a.synced = True
        except scheduler.WorkerLost:  # the next tick reports the loss and the agent moves
            pass
        except scheduler.CallRefused as e:  # the worker refused this turn (it stays up): the turn fails alone
            self._fail_turn(a, str(e))

    def _resume(self, a: Agent) -> None:
        """Re-prefills a moved agent's whole history on its new worker and continues its turn."""
        assert a.turn is not None
        a.turn.resumed += 1
        self._submit(a, list(a.history), True)

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
        """Workers a re-plan may use: the live ones and the configured ones not missing whose restart is due."""
        now = time.monotonic()
        live = set(self.sched.live_workers())
        return [d for d in self.devices if d in live or (d not in self.missing and self._restart_at.get(d, 0) <= now)]

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

    def _end_turn(self, a: Agent, reason: str) -> None:
        t = a.turn
        assert t is not None
        job = t.request.job
        if job is not None and job.stopped:
            reason = "stop_string"
        reply = list(t.reply)
        if reply and reply[-1] in self.tok.eot_ids:
            reply = reply[:-1]
        text = self.tok.decode(reply, skip_special=True)
        if job is not None and job.stopped:
            job.finish("done", reason)
            text = job.text
        a.messages.append({"role": "assistant", "content": text})
        dur = time.time() - t.started
        a.log.append({"turn": t.index, "user": t.user, "assistant": text, "prompt_tokens": t.prompt_tokens,
                      "prompt_ids": t.prompt_ids, "fresh": t.fresh,
                      "tokens": len(t.reply), "token_ids": t.reply, "finish_reason": reason, "worker": t.worker,
                      "kv_format": t.kv_format, "started": t.started, "duration_s": dur,
                      "time_to_first_token_s": t.first_token_s, "resumed": t.resumed,
                      "history_tokens": len(a.history), "job": job.id if job else None})  # fmt: skip
        if job is not None:
            job.finish("cancelled" if reason in CANCEL_REASONS else "done", reason)
        a.turn = None
        self._snap_dirty.add(a.name)
        a.turns_done += 1
        if t.request.task:
            a.tasks_done += 1
        over = a.tasks_done >= self._n_turns(a) and not a.jobs
        if reason == "context" or (over and (a.oneoff or not self.serve)):
            self._finish_agent(a, "context" if reason == "context" else "done")

    def _fail_turn(self, a: Agent, why: str) -> None:
        """A turn the engine could not serve: its job fails with the engine's message, the turn is taken back
        out of the conversation (the worker already freed the session's KV), and the agent goes on."""
        t = a.turn
        assert t is not None
        job = t.request.job
        self._event("turn_failed", agent=a.name, turn=t.index, worker=t.worker, job=job.id if job else None,
                    error=why[:300])  # fmt: skip
        n_msgs = len(t.request.messages)
        if n_msgs and a.messages[-n_msgs:] == t.request.messages:
            del a.messages[-n_msgs:]
        keep = len(a.history) - len(t.prompt_ids) - len(t.reply)
        a.history = a.history[:keep] if not t.fresh and keep >= 0 else []  # [] : the next turn renders it all
        a.synced = False
        a.turn = None
        self._snap_dirty.add(a.name)
        if job is not None:
            job.finish("failed", "error", f"the engine refused this job: {why}")
        if t.request.task:  # a configured task is not retried
            a.tasks_done += 1
            a.turns_done += 1
        if a.oneoff and not a.jobs:
            self._finish_agent(a, "failed")

    def _finish_agent(self, a: Agent, note: str) -> None:
        self._snap_dirty.add(a.name)
        a.finished = True
        a.finish_note = note
        for job in a.jobs:
            job.finish("failed", "agent_finished", f"agent {a.name} finished ({note}) before this job ran")
        a.jobs.clear()
        if a.worker is not None and a.worker in self.sched.workers:
            with contextlib.suppress(scheduler.WorkerLost):  # the next tick reports the loss
                self.sched.end(a.worker, a.name)
        self._released = True

    # -- the loop ---------------------------------------------------------------------------
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

    def run(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Runs every agent's tasks to the end (the `swarm launch` mode)."""
        self.begin()
        assert self.plan is not None
        self.echo(str(self.plan))
        from swarm.progress import LiveProgress

        ui = LiveProgress(self) if self.live else None
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

    def _fail_jobs(self, why: str, cancelled: bool = False) -> None:
        for a in self.agents.values():
            pending = list(a.jobs) + ([a.turn.request.job] if a.turn and a.turn.request.job else [])
            for job in pending:
                if job is not None:
                    job.finish("cancelled" if cancelled else "failed", "swarm_stopped" if cancelled else "error", why)
            a.jobs.clear()

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

    # -- the record ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Records what changed (one transaction), then lets streams see it.

        When the store cannot record (disk full) nothing is marked written and streams see nothing new: the
        next flush after RECORD_RETRY_S tries the whole change again, so recording resumes on its own."""
        if self.record_error and time.monotonic() < self._record_retry_at:
            return
        changed = [j for j in self._open_jobs.values() if j.dirty or len(j.token_ids) > j._flushed]
        if self.store is not None:
            snaps = {n: self._snapshot(self.agents[n]) for n in self._snap_dirty if n in self.agents}
            chunks, hist = {}, {}
            for a in self.agents.values():
                if a.name in snaps:
                    hist[a.name] = len(a.history)
                elif len(a.history) > self._hist_flushed.get(a.name, 0):
                    chunks[a.name] = a.history[self._hist_flushed.get(a.name, 0) :]
                    hist[a.name] = len(a.history)
            stmts = self.store.agent_statements(self.cfg.name, snaps, chunks)
            marks = {j.id: (j._flushed, j.dirty) for j in changed}  # restored if the write fails
            job_chunks, job_updates = {}, {}
            for j in changed:
                chunk, update = j.pending_writes()
                if chunk:
                    job_chunks[j.id] = chunk
                if update:
                    job_updates[j.id] = update
            try:
                self.store.commit(stmts + self.store.job_statements(job_updates, job_chunks))
            except StoreFull as e:
                for j in changed:
                    j._flushed, j.dirty = marks[j.id]
                self._record_failed(e)
                return
            self._hist_flushed.update(hist)
            if self.record_error:
                self._event("recording_resumed")
                self.record_error = ""
                self._state_changed()
        self._snap_dirty.clear()
        for j in changed:
            j.publish()
            if j.done:  # recorded and seen as ended: it changes no more
                del self._open_jobs[j.id]

    def _record_failed(self, e: StoreFull) -> None:
        self._record_retry_at = time.monotonic() + RECORD_RETRY_S
        if not self.record_error:
            self._event("recording_paused", error=str(e)[:300])
            self.record_error = str(e)
            self._state_changed()

    def _snapshot(self, a: Agent) -> dict[str, Any]:
        t = a.turn
        turn = None
        if t is not None:
            r = t.request
            turn = {"index": t.index, "user": t.user, "reply": t.reply, "prompt_ids": t.prompt_ids, "fresh": t.fresh,
                    "prompt_tokens": t.prompt_tokens, "started": t.started, "resumed": t.resumed,
                    "request": {"messages": r.messages, "max_new": r.max_new, "sampling": r.sampling,
                                "job": r.job.id if r.job else None, "task": r.task}}  # fmt: skip
        return {"group": dataclasses.asdict(a.group), "index": a.index, "context": a.context, "messages": a.messages,
                "history": a.history, "tasks_done": a.tasks_done, "turns_done": a.turns_done, "finished": a.finished,
                "finish_note": a.finish_note, "tokens_generated": a.tokens_generated, "oneoff": a.oneoff,
                "log": a.log, "turn": turn}  # fmt: skip

    def restore(self, agents: dict[str, tuple[dict[str, Any], list[int]]], jobs: list[dict[str, Any]]) -> None:
        """Takes back agents and jobs a previous server recorded (before start())."""
        from swarm.config import load_config

        for rec in jobs:
            job = self.jobs[rec["id"]] = Job.restore(rec)
            if not job.done:
                self._open_jobs[job.id] = job
        for name, (snap, extra) in agents.items():
            a = self.agents.get(name)
            if a is None:  # a one-off agent
                g = load_config({"name": "x", "agents": [_group_dict(snap["group"])]}).agents[0]
                a = self.agents[name] = Agent(name=name, group=g, index=snap["index"], context=snap["context"])
                self._oneoffs = max(self._oneoffs, int(name[3:].split("-")[0]) + 1 if name.startswith("job") else 0)
            for k in ("context", "messages", "history", "tasks_done", "turns_done", "finished", "finish_note",
                      "tokens_generated", "oneoff", "log"):  # fmt: skip
                setattr(a, k, snap[k])
            a.history = a.history + extra
            t = snap["turn"]
            if t is not None and not a.finished:
                r = t["request"]
                job = self.jobs.get(r["job"]) if r["job"] else None
                req = TurnRequest(r["messages"], r["max_new"], r["sampling"], job=job, task=r["task"])
                a.turn = Turn(index=t["index"], user=t["user"], request=req, reply=t["reply"] + extra,
                              started=t["started"], prompt_ids=t["prompt_ids"], fresh=t["fresh"],
                              prompt_tokens=t["prompt_tokens"], resumed=t["resumed"])  # fmt: skip
                if job is not None:
                    job.begin(self.tok.stream_decoder(skip_special=True), "", "", t["prompt_tokens"])
            self._hist_flushed[a.name] = len(a.history)
        queued = sorted((j for j in self.jobs.values() if j.state == "queued"), key=lambda j: j.created)
        running = {a.turn.request.job.id for a in self.agents.values() if a.turn and a.turn.request.job}
        for j in queued:
            if j.id in running:
                continue
            a = self.agents.get(j.agent)
            if a is None or a.finished:
                j.finish("failed", "agent_finished", f"agent {j.agent} is gone after the restart")
            else:
                a.jobs.append(j)

    def _apply(self, events: dict[str, dict[str, Any]]) -> None:
        for name, ev in events.items():
            a = self.agents.get(name)
            if a is None or a.turn is None or ev["turn"] != a.turn.index:
                continue
            a.turn.reply += ev["tokens"]
            a.history += ev["tokens"]
            a.tokens_generated += len(ev["tokens"])
            if a.turn.first_token_s is None and ev.get("first_token_s") is not None:
                a.turn.first_token_s = ev["first_token_s"]
            job = a.turn.request.job
            if job is not None and ev["tokens"] and job.push(ev["tokens"], self.tok.eot_ids) and not ev["done"]:
                self._cancel_turn(a, "stop_string")  # the text ended at a stop string
                continue
            if ev["done"] and ev["reason"] == "error":
                self._fail_turn(a, ev.get("error") or "the engine raised")
                continue
            if ev["done"]:
                reason = ev["reason"]
                if reason == "max_tokens" and len(a.turn.reply) < a.turn.request.max_new:
                    reason = "context"  # clipped at the reservation
                self._end_turn(a, reason)

    def _cancel_turn(self, a: Agent, reason: str) -> None:
        """Stops a running turn: its worker frees the session's KV, and the next turn re-prefills the history."""
        if a.worker is not None and a.worker in self.sched.workers:
            with contextlib.suppress(scheduler.WorkerLost):
                self.sched.end(a.worker, a.name)
        a.synced = False
        if a.turn is not None:
            self._end_turn(a, reason)

    # -- jobs (the API) ------------------------------------------------------------------------
    MAX_QUEUE = 256  # jobs waiting per agent

    def submit_job(
        self,
        *,
        agent: str | None = None,
        group: str | None = None,
        new_agent: bool = False,
        messages: list[dict[str, str]],
        max_tokens: int = 0,
        sampling: dict[str, Any] | None = None,
        stop: tuple[str, ...] = (),
        idempotency_key: str = "",
        deadline: float | None = None,
    ) -> list[Job]:
        """Queues one turn per target agent (validated by the caller); returns the jobs."""
        with self.lock:
            if self.state != "running":
                raise FailedPrecondition(
                    f"swarm {self.cfg.name!r} is {self.state}{': ' + self.error if self.error else ''}"
                )
            if self.record_error:
                raise StoreFull(self.record_error)
            if new_agent:
                targets = [self._new_oneoff(messages, max_tokens or 128)]
            elif agent is not None:
                if agent not in self.agents:
                    raise NotFound(f"swarm {self.cfg.name!r} has no agent {agent!r} (agents: {_sample(self.agents)})")
                targets = [self.agents[agent]]
            else:
                targets = [a for a in self.agents.values() if a.group.name == group and not a.oneoff]
                if not targets:
                    groups = sorted({a.group.name for a in self.agents.values() if not a.oneoff})
                    raise NotFound(f"swarm {self.cfg.name!r} has no group {group!r} (groups: {', '.join(groups)})")
            jobs = []
            for a in targets:
                if a.finished:
                    raise FailedPrecondition(f"agent {a.name} has finished ({a.finish_note}); it takes no more jobs")
                if len(a.jobs) >= self.MAX_QUEUE:
                    raise ResourceExhausted(f"agent {a.name} already has {len(a.jobs)} jobs waiting (the limit); "
                                            "wait for some to finish or send to another agent")  # fmt: skip
                n = max_tokens or a.group.max_new_tokens
                new = self.tok.encode(self.tok.render_chat(a.messages + messages, add_generation_prompt=True))
                if len(new) + n > self.inputs.geometry.n_ctx:
                    room = self.inputs.geometry.n_ctx - len(new)
                    raise ResourceExhausted(
                        f"agent {a.name}: the conversation would be {len(new):,} tokens + {n:,} new, past the model's "
                        f"{self.inputs.geometry.n_ctx:,}; " + (f"ask for at most max_tokens={room}" if room > 0 else
                                                               "start a new agent (new_agent) with a shorter prompt")
                    )  # fmt: skip
            for a in targets:
                jobs.append(Job(swarm=self.cfg.name, agent=a.name, messages=list(messages),
                                max_tokens=max_tokens or a.group.max_new_tokens, sampling=sampling, stop=tuple(stop),
                                idempotency_key=idempotency_key, deadline=deadline))  # fmt: skip
            if self.store is not None:  # accepted means recorded
                try:
                    self.store.add_jobs([j.record() for j in jobs])
                except StoreFull as e:
                    for a in targets:
                        if a.oneoff:
                            self._finish_agent(a, "cancelled")
                    self._record_failed(e)
                    raise
                self.flush()  # a one-off agent's snapshot, too
            for a, job in zip(targets, jobs, strict=True):
                job.dirty = False
                a.jobs.append(job)
                self.jobs[job.id] = self._open_jobs[job.id] = job
            return jobs

    def _new_oneoff(self, messages: list[dict[str, str]], max_tokens: int) -> Agent:
        k = self._oneoffs
        prompt = self.tok.encode(self.tok.render_chat(messages, add_generation_prompt=True))
        bt = self.cfg.engine.block_tokens
        need = len(prompt) + max_tokens
        if need > self.inputs.geometry.n_ctx:
            raise ResourceExhausted(f"a one-off agent needs {need:,} tokens, past the model's "
                                    f"{self.inputs.geometry.n_ctx:,}; shorten the messages or max_tokens")  # fmt: skip
        ctx = math.ceil(need / bt) * bt
        g = AgentGroup(name=f"job{k}", count=1, context=ctx, max_new_tokens=max_tokens)
        a = Agent(name=f"job{k}-0", group=g, index=0, context=ctx, oneoff=True)
        self.agents[a.name] = a
        self._snap_dirty.add(a.name)
        reason = f"one-off agent {a.name}"
        try:
            if self._replace_reason is not None:  # workers are down: it waits with the others if it fits them all
                self._plan([d for d in self.devices if d not in self.missing])
                self._owe_placement(reason)
            else:
                self.place(self._placeable(), reason)
        except NoFeasiblePlan as e:
            del self.agents[a.name]
            self._snap_dirty.discard(a.name)
            raise ResourceExhausted(f"no worker has room for a one-off agent of {ctx:,} tokens: {e}") from e
        except scheduler.SchedulerError as e:  # a worker died or would not start: placed with the others later
            self._owe_placement(f"{reason} ({str(e)[:200]})")
        self._oneoffs += 1
        return a

    def cancel_job(self, job_id: str, reason: str = "cancelled") -> Job:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id!r} in swarm {self.cfg.name!r}")
            if job.done:
                return job
            a = self.agents[job.agent]
            if job in a.jobs:
                a.jobs.remove(job)
                job.finish("cancelled", reason)
                if a.oneoff and a.turn is None:
                    self._finish_agent(a, "cancelled")
            elif a.turn is not None and a.turn.request.job is job:
                self._cancel_turn(a, reason)
            return job

    def placement(self, max_age_s: float = 0.25) -> dict[str, Any]:
        """Per worker: device, formats, agents, KV bytes, predicted and measured tokens/s.

        Answers younger than `max_age_s` are shared (many watchers cost one round of worker calls)."""
        cached = self._placement_cache
        if cached is not None and time.monotonic() - cached[0] < max_age_s and cached[1] == self.generation:
            return cached[2]
        # NOTE: the workers are asked outside self.lock. A busy worker answers state() only after its engine
        # step (seconds while it prefills many agents), and the swarm loop must not wait for that: with the
        # lock held here, one client polling GetPlacement stopped a 600-agent swarm's loop for 14 s at a time.
        generation = self.generation
        states = self.sched.states() if self.state == "running" else {}
        with self.lock:
            planned = {wp.worker: wp for wp in (self.plan.workers if self.plan else ())}
            on: dict[str, list[str]] = {}  # {worker: its unfinished agents}, one pass over the agents
            for a in self.agents.values():
                if a.worker is not None and not a.finished:
                    on.setdefault(a.worker, []).append(a.name)
            out = []
            for name, h in list(self.sched.workers.items()):
                st = states.get(name)
                st = st if isinstance(st, dict) else {}
                wp = planned.get(name)
                out.append({
                    "worker": name, "device": h.spec.device, "kind": h.spec.kind, "kv_k": h.spec.kv_k,
                    "kv_v": h.spec.kv_v, "node_id": h.node_id, "alive": h.alive and bool(st),
                    "agents": sorted(on.get(name, ()), key=_agent_key),
                    "kv_bytes_budget": h.spec.kv_budget_bytes, "kv_bytes_reserved": int(st.get("kv_bytes_reserved", 0)),
                    "kv_bytes_used": int(st.get("kv_bytes_used", 0)),
                    "predicted_tokens_per_s": wp.tokens_per_s if wp else 0.0,
                    "measured_tokens_per_s": float(st.get("tokens_per_s", 0.0)),
                    "queue_depth": int(st.get("queue_depth", 0)),
                })  # fmt: skip
            result = {"swarm": self.cfg.name, "generation": self.generation, "workers": out}
            if self.generation == generation:  # the states belong to this placement
                self._placement_cache = (time.monotonic(), self.generation, result)
            return result

    def info(self) -> dict[str, Any]:
        with self.lock:
            names = [a.name for a in self.agents.values()]
            return {"name": self.cfg.name, "state": self.state, "agents": len(names), "agent_names": names,
                    "workers": len(self.sched.live_workers()), "error": self.error, "started_unix": self.started,
                    "tokens_generated": sum(a.tokens_generated for a in self.agents.values())}  # fmt: skip

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
        assignment = {a.name: a.worker for a in self.agents.values() if not a.finished and a.worker}
        for wp in self.plan.workers:
            if wp.worker in self.sched.workers:
                self.sched.reserve(wp.worker, self._reservations(wp, assignment))  # type: ignore[arg-type]

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

    def _event(self, kind: str, **data: Any) -> None:
        self.events.append({"event": kind, "t": round(time.time() - self.started, 3), **data})
        if kind in ("moved", "worker_lost", "worker_joined", "context_capped") and not self.live:
            self.echo(f"[{kind}] " + ", ".join(f"{k}={v}" for k, v in data.items() if k != "plan"))

    # -- results ----------------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        states = {w: s for w, s in self.sched.states().items() if not isinstance(s, Exception)}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "agents").mkdir(exist_ok=True)
        for a in self.agents.values():
            with open(self.out_dir / "agents" / f"{a.name}.jsonl", "w") as f:
                for m in a.messages[:1]:
                    if m["role"] == "system":
                        f.write(json.dumps({"role": "system", "content": m["content"]}) + "\n")
                for rec in a.log:
                    f.write(json.dumps({"role": "user", "turn": rec["turn"], "content": rec["user"],
                                        "tokens": rec["prompt_tokens"]}) + "\n")  # fmt: skip
                    f.write(json.dumps({"role": "assistant", "turn": rec["turn"], "content": rec["assistant"],
                                        **{k: v for k, v in rec.items() if k not in ("user", "assistant", "turn")}})
                            + "\n")  # fmt: skip
        wall = time.time() - self.started
        total = sum(a.tokens_generated for a in self.agents.values())
        summary = {
            "swarm": self.cfg.name,
            "started": self.started,
            "wall_s": wall,
            "tokens_generated": total,
            "tokens_per_s": total / wall if wall > 0 else 0.0,
            "plan": self.plan.to_dict() if self.plan else None,  # the latest
            "initial_plan": self.initial_plan.to_dict() if self.initial_plan else None,
            "workers": states,
            "agents": {
                a.name: {
                    "group": a.group.name,
                    "worker": a.worker,
                    "turns": a.turns_done,
                    "tokens": a.tokens_generated,
                    "context_reserved": a.context,
                    "history_tokens": len(a.history),
                    "finish": a.finish_note,
                    "moves": sum(
                        1 for e in self.events if e["event"] == "moved" and e.get("agent") == a.name and e.get("dst")
                    ),
                }
                for a in self.agents.values()
            },  # fmt: skip
            "events": self.events,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary


def rebuild_history(transcript: Path, upto_turn: int | None = None) -> list[int]:
    """An agent's token history from its JSONL transcript: through turn `upto_turn`'s prompt, or all of it."""
    history: list[int] = []
    for line in Path(transcript).read_text().splitlines():
        rec = json.loads(line)
        if rec["role"] != "assistant":
            continue
        history = list(rec["prompt_ids"]) if rec["fresh"] else history + rec["prompt_ids"]
        if rec["turn"] == upto_turn:
            return history
        history += rec["token_ids"]
    return history


def _group_dict(g: dict[str, Any]) -> dict[str, Any]:
    """A recorded AgentGroup as config input (tuples became lists)."""
    out = {k: v for k, v in g.items() if v is not None}
    out["min_quality"] = {k: v for k, v in g.get("min_quality", {}).items() if v is not None}
    return out


def _sample(names: Any, n: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


def _format(k: str, v: str) -> str:
    return k if k == v else f"{k}/{v}"


def _last_reply(a: Agent) -> str:
    replies = [m["content"] for m in a.messages if m["role"] == "assistant"]
    return replies[-1] if replies else "(no output)"


def _agent_key(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def summary_table(summary: dict[str, Any]) -> str:
    rows = [f"{'agent':<18}{'worker':<14}{'turns':>6}{'tokens':>8}  finish"]
    for name, a in summary["agents"].items():
        rows.append(f"{name:<18}{str(a['worker']):<14}{a['turns']:>6}{a['tokens']:>8}  {a['finish']}"
                    + (f" (moved {a['moves']}x)" if a["moves"] else ""))  # fmt: skip
    rows.append(f"{summary['tokens_generated']} tokens in {summary['wall_s']:.1f} s "
                f"({summary['tokens_per_s']:.1f} tokens/s across the swarm)")  # fmt: skip
    return "\n".join(rows)


# -- entry point -------------------------------------------------------------------------------


def launch(
    cfg: SwarmConfig,
    *,
    address: str | None = None,
    keep: bool = False,
    out_dir: Path | None = None,
    echo: Callable[[str], None] = print,
    live: bool = True,
    timeout_s: float | None = None,
    calibrate: Callable[[Path, str, int], dict] | None = None,
    on_tick: Callable[[SwarmRun], None] | None = None,
) -> dict[str, Any]:
    """Plans, starts Ray (or joins one), runs the swarm to the end, writes transcripts and a summary."""
    check_launchable(cfg)
    inputs = plan_inputs(cfg, calibrate=calibrate, progress=None)
    out = out_dir or Path(cfg.output_dir) / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    conn = scheduler.connect(address, kv_bytes=available_memory(), keep=keep)
    echo(f"Ray: {conn.address}  dashboard: {conn.dashboard_url or '(not running)'}")
    if conn.auth_token_path:
        echo(f"  log in to the dashboard with the token in {conn.auth_token_path}")
    sched = scheduler.Scheduler(cfg.name, conn)
    try:
        run = SwarmRun(cfg, inputs, sched, out, echo=echo, live=live)
        run.on_tick = on_tick
        summary = run.run(timeout_s=timeout_s)
        echo(summary_table(summary))
        echo(f"transcripts: {out / 'agents'}  summary: {out / 'summary.json'}")
        if keep:
            echo(f"--keep: the swarm's workers stay up; `swarm status --address {conn.address}` shows them, "
                 "`ray stop` ends them")  # fmt: skip
        return summary
    finally:
        if not keep:
            sched.shutdown()
            scheduler.disconnect(conn)
        else:
            scheduler.disconnect(conn, stop_head=False)
