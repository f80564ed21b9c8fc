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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm import planner, scheduler
from swarm.config import AgentGroup, SwarmConfig
from swarm.errors import ConfigError, NoFeasiblePlan, SwarmError
from swarm.planning import PlanInputs, available_memory, plan_inputs
from worker.service import WorkerSpec

POLL_S = 0.05
JOIN_CHECK_S = 2.0
DEFAULT_REVIEW = "Here are the other agents' reports. Review them."


@dataclass
class Turn:
    index: int
    user: str
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
    ) -> None:
        from worker.engine import load_tokenizer

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
        self.events: list[dict[str, Any]] = []
        self.started = time.time()
        self.on_tick: Callable[[SwarmRun], None] | None = None  # called once per poll (drills, tests)
        self._released = False
        self._lost: set[str] = set()

    # -- planning and placement ------------------------------------------------------------
    def _groups(self) -> tuple[list[planner.AgentGroup], dict[str, list[Agent]]]:
        by: dict[str, list[Agent]] = {}
        for a in self.agents.values():
            if not a.finished:
                by.setdefault(a.planner_group, []).append(a)
        base = {g.name: g for g in self.inputs.groups}
        groups = []
        for key, members in by.items():
            b = base[members[0].group.name]
            groups.append(dataclasses.replace(b, name=key, count=len(members), context=members[0].context))
        return groups, by

    def _plan(self, workers: list[str]) -> planner.Plan:
        groups, _ = self._groups()
        devices = [self.devices[w] for w in workers]
        i = self.inputs
        return planner.plan(i.geometry, devices, groups, i.policy, settings=i.settings, quality=i.quality)

    def _spec(self, wp: planner.WorkerPlan, agents: list[str]) -> WorkerSpec:
        w = self.worker_cfg[wp.worker]
        e = self.cfg.engine
        cal = "catalog" if w.kind == "virtual" else w.calibration
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
                except Exception as e:  # noqa: BLE001 - below the blocks in use: restart instead
                    self._event("resize_failed", worker=w, error=str(e)[:200])
                    self._lose_sessions(w, f"{w} restarts with a {budget:,}-byte KV budget")
                    self.sched.forget(w)
                    to_start.append((self._spec(wp, names), wp.weight_bytes + wp.scratch_bytes))
        if to_start:
            self.sched.start_workers(to_start)
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
        self._event("placed", reason=reason, plan=plan.to_dict()["workers"] if reason != "launch" else None)

    def _lose_sessions(self, worker: str, reason: str) -> None:
        for a in self.agents.values():
            if a.worker == worker and not a.finished:
                a.moved_from, a.move_reason = worker, reason
                a.worker = None

    # -- turns ----------------------------------------------------------------------------
    def _turn_text(self, a: Agent) -> str | None:
        """The next user message, or None while its inputs are not ready."""
        g = a.group
        tasks = list(g.tasks)
        if g.inputs_from is not None:
            sources = [s for s in self.agents.values() if s.group.name == g.inputs_from]
            if not all(s.finished for s in sources):
                return None
            if a.turns_done == 0:
                reports = "\n\n".join(f"Report from {s.name}:\n{_last_reply(s)}" for s in sources)
                return f"{tasks[0] if tasks else DEFAULT_REVIEW}\n\n{reports}"
        return tasks[a.turns_done]

    def _n_turns(self, a: Agent) -> int:
        return max(len(a.group.tasks), 1)

    def _sampling(self, a: Agent, max_new: int) -> dict[str, Any]:
        s = a.group.sampling
        return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "repetition_penalty": s.repetition_penalty, "seed": s.seed + a.index + 7919 * a.turns_done,
                "max_new_tokens": max_new, "stop_tokens": self.stop_tokens}  # fmt: skip

    def _encode_turn(self, a: Agent, user: str) -> tuple[list[int], bool]:
        """Tokens extending the agent's history with the user message (fresh: the whole conversation)."""
        text = self.tok.render_chat(a.messages + [{"role": "user", "content": user}], add_generation_prompt=True)
        if a.history:
            have = self.tok.decode(a.history)
            if text.startswith(have) and len(text) > len(have):
                return self.tok.encode(text[len(have) :], add_bos=False), False
        return self.tok.encode(text), True

    def _start_turn(self, a: Agent) -> bool:
        user = self._turn_text(a)
        if user is None:
            return False
        tokens, fresh = self._encode_turn(a, user)
        need = (0 if fresh else len(a.history)) + len(tokens) + a.group.max_new_tokens
        if need > a.context:
            self._grow(a, need)  # if nothing holds it, the turn is cut at the reservation (_submit clips it)
        if not a.synced and not fresh:  # it moved: the new worker prefills the whole history
            tokens, fresh = a.history + tokens, True
        t = Turn(index=a.turns_done, user=user, started=time.time())
        a.messages.append({"role": "user", "content": user})
        a.history = tokens if fresh else a.history + tokens
        t.prompt_tokens, t.prompt_ids, t.fresh = len(tokens), list(tokens), fresh
        a.turn = t
        self._submit(a, tokens, fresh)
        return True

    def _submit(self, a: Agent, tokens: list[int], fresh: bool) -> None:
        t = a.turn
        assert t is not None and a.worker is not None
        left = a.group.max_new_tokens - len(t.reply)
        room = a.context - len(a.history)
        max_new = min(left, room)
        if max_new <= 0:
            self._end_turn(a, "context" if room <= 0 else "max_tokens")
            return
        h = self.sched.workers[a.worker]
        t.worker, t.kv_format = a.worker, _format(h.spec.kv_k, h.spec.kv_v)
        with contextlib.suppress(scheduler.WorkerLost):  # the next drain reports the loss and the agent moves
            self.sched.submit(a.worker, a.name, t.index, tokens, self._sampling(a, max_new), fresh)
            a.synced = True

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
            self.place(self.sched.live_workers() or list(self.devices), f"{a.name} needs {need} tokens of context")
            return True
        except NoFeasiblePlan as e:
            a.context = old
            self._event("context_capped", agent=a.name, need=need, reserved=old, why=str(e).splitlines()[0])
            return False

    def _end_turn(self, a: Agent, reason: str) -> None:
        t = a.turn
        assert t is not None
        reply = list(t.reply)
        if reply and reply[-1] in self.tok.eot_ids:
            reply = reply[:-1]
        text = self.tok.decode(reply, skip_special=True)
        a.messages.append({"role": "assistant", "content": text})
        dur = time.time() - t.started
        a.log.append({"turn": t.index, "user": t.user, "assistant": text, "prompt_tokens": t.prompt_tokens,
                      "prompt_ids": t.prompt_ids, "fresh": t.fresh,
                      "tokens": len(t.reply), "token_ids": t.reply, "finish_reason": reason, "worker": t.worker,
                      "kv_format": t.kv_format, "started": t.started, "duration_s": dur,
                      "time_to_first_token_s": t.first_token_s, "resumed": t.resumed,
                      "history_tokens": len(a.history)})  # fmt: skip
        a.turn = None
        a.turns_done += 1
        if a.turns_done >= self._n_turns(a) or reason == "context":
            a.finished = True
            a.finish_note = reason if reason == "context" else "done"
            if a.worker is not None and a.worker in self.sched.workers:
                self.sched.end(a.worker, a.name)
            self._released = True

    # -- the loop ---------------------------------------------------------------------------
    def run(self, timeout_s: float | None = None) -> dict[str, Any]:
        workers = [d.name for d in self.inputs.devices]
        res = scheduler.cluster_resources()
        for w in workers:
            wc = self.worker_cfg[w]
            if wc.kind == "cluster" and res.get(f"device:{wc.device}", 0) < 1:
                self.missing.add(w)
                self.echo(f"worker {w}: no node offers device:{wc.device} yet; planning without it")
        self.place([w for w in workers if w not in self.missing], "launch")
        assert self.plan is not None
        self.echo(str(self.plan))
        ui = _Progress(self) if self.live else None
        last_join = time.monotonic()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not all(a.finished for a in self.agents.values()):
                if deadline is not None and time.monotonic() > deadline:
                    raise SwarmError(f"the swarm did not finish within {timeout_s:.0f} s")
                for a in self.agents.values():
                    if not a.finished and a.turn is None and a.worker is not None:
                        self._start_turn(a)
                drained = self.sched.drain_all()
                lost = [w for w, ev in drained.items() if isinstance(ev, scheduler.WorkerLost)]
                for ev in drained.values():
                    if not isinstance(ev, scheduler.WorkerLost):
                        self._apply(ev)
                if lost:
                    for w in lost:
                        self._event("worker_lost", worker=w, error=str(drained[w]))
                        self._lose_sessions(w, f"worker {w} was lost")
                        self.sched.forget(w)
                    live = self.sched.live_workers() + [w for w in workers if w not in self.sched.workers
                                                        and w not in self.missing and w not in lost]  # fmt: skip
                    live = [w for w in dict.fromkeys(live) if w not in lost]
                    self._lost |= set(lost)
                    live = [w for w in live if w not in self._lost]
                    if not live:
                        raise SwarmError(f"every worker is lost ({', '.join(sorted(self._lost))}); nothing can run")
                    self.place(live, f"lost {', '.join(lost)}")
                elif self._released:
                    self._released = False
                    self._release()
                if self.missing and time.monotonic() - last_join > JOIN_CHECK_S:
                    last_join = time.monotonic()
                    self._check_joins()
                if ui is not None:
                    ui.update()
                if self.on_tick is not None:
                    self.on_tick(self)
                time.sleep(POLL_S)
        finally:
            if ui is not None:
                ui.close()
        return self.finish()

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
            if ev["done"]:
                reason = ev["reason"]
                if reason == "max_tokens" and len(a.turn.reply) < a.group.max_new_tokens:
                    reason = "context"  # clipped at the reservation
                self._end_turn(a, reason)

    def _release(self) -> None:
        """Frees finished agents' KV reservations (the workers keep their formats)."""
        assert self.plan is not None
        assignment = {a.name: a.worker for a in self.agents.values() if not a.finished and a.worker}
        for wp in self.plan.workers:
            if wp.worker in self.sched.workers:
                self.sched.reserve(wp.worker, self._reservations(wp, assignment))  # type: ignore[arg-type]

    def _check_joins(self) -> None:
        res = scheduler.cluster_resources()
        joined = [w for w in self.missing if res.get(f"device:{self.worker_cfg[w].device}", 0) >= 1]
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
            "plan": self.plan.to_dict() if self.plan else None,
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


class _Progress:
    """Live progress bars per worker and agent (rich), redrawn a few times a second."""

    def __init__(self, run: SwarmRun) -> None:
        from rich.console import Console
        from rich.live import Live

        self.run = run
        self.console = Console()
        self.last = 0.0
        self.states: dict[str, Any] = {}
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < 0.5:
            return
        self.last = now
        self.states = {w: s for w, s in self.run.sched.states().items() if isinstance(s, dict)}
        self.live.update(self._render())

    def _render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        workers = Table(title=f"swarm {self.run.cfg.name}: workers", title_justify="left")
        for col in ("worker", "device", "KV format", "agents", "tokens", "tok/s", "queue", "KV reserved / budget"):
            workers.add_column(col, justify="right" if col in ("agents", "tokens", "tok/s", "queue") else "left")
        for w, s in self.states.items():
            used, budget = s["kv_bytes_reserved"], max(s["kv_budget_bytes"], 1)
            kv = Table.grid(padding=(0, 1))
            kv.add_row(ProgressBar(total=budget, completed=used, width=16),
                       f"{used / 2**20:.1f}/{budget / 2**20:.1f} MiB")  # fmt: skip
            workers.add_row(w, s["device"], s["kv_format"], str(s["active_sessions"]), str(s["tokens_generated"]),
                            f"{s['tokens_per_s']:.0f}", str(s["queue_depth"]), kv)  # fmt: skip
        agents = Table(title="agents", title_justify="left")
        for col in ("agent", "worker", "turn", "context / reserved", "tokens", "progress"):
            agents.add_column(col, justify="right" if col == "tokens" else "left")
        for a in self.run.agents.values():
            n = self.run._n_turns(a) * a.group.max_new_tokens
            done = n if a.finished else a.turns_done * a.group.max_new_tokens + (len(a.turn.reply) if a.turn else 0)
            turn = "done" if a.finished else f"{a.turns_done + 1}/{self.run._n_turns(a)}"
            if not a.finished and a.turn is None:
                turn += " (waiting)"
            agents.add_row(a.name, str(a.worker or "-"), turn, f"{len(a.history)} / {a.context}",
                           str(a.tokens_generated), ProgressBar(total=n, completed=done, width=20))  # fmt: skip
        return Group(workers, agents)

    def close(self) -> None:
        self.update(force=True)
        self.live.stop()


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
