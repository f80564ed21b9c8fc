"""Reports: the API's views (placement, info) and the run's transcripts and summary."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from swarm.planner.parked import ParkedAgent, parked_by_worker
from swarm.planner.result import explain_parked
from swarm.runtime.names import agent_key as _agent_key


@dataclass(frozen=True)
class AgentProgress:
    """One agent's line in the live progress view."""

    name: str
    worker: str | None
    turn: str  # "2/3", "2/3 (waiting)" or "done"
    history_tokens: int
    context: int  # tokens reserved
    tokens_generated: int
    planned_tokens: int  # its configured turns' max_new_tokens
    done_tokens: int  # of planned_tokens


class ReportMixin:
    """The views of a run: the API's and the transcripts and summary written at its end."""

    def progress(self) -> list[AgentProgress]:
        """Every agent's progress through its configured turns (the live view draws this)."""
        out = []
        for a in list(self.agents.values()):
            n_turns, per_turn = self._n_turns(a), a.group.max_new_tokens
            done = n_turns * per_turn if a.finished else a.turns_done * per_turn + (len(a.turn.reply) if a.turn else 0)
            turn = "done" if a.finished else f"{a.turns_done + 1}/{n_turns}"
            if not a.finished and a.turn is None:
                turn += " (waiting)"
            out.append(AgentProgress(a.name, a.worker, turn, len(a.history), a.context, a.tokens_generated,
                                     n_turns * per_turn, done))  # fmt: skip
        return out

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
                    "sessions": session_states(st.get("sessions")),
                    "lifecycle": lifecycle_view(st.get("lifecycle"), h.spec),
                })  # fmt: skip
            result = {"swarm": self.cfg.name, "generation": self.generation, "workers": out}
            if self.generation == generation:  # the states belong to this placement
                self._placement_cache = (time.monotonic(), self.generation, result)
            return result

    def parked_agents(self, states: dict[str, Any]) -> list[ParkedAgent]:
        """The agents the workers report parked (their KV in host RAM or on disk), as the planner's values."""
        out = []
        for w, st in states.items():
            if not isinstance(st, dict) or not isinstance(st.get("sessions"), dict):
                continue
            for name, x in st["sessions"].items():
                a = self.agents.get(name)
                if a is None or x.get("state") != "parked" or x.get("where") not in ("ram", "disk"):
                    continue
                out.append(ParkedAgent(name=name, group=str(a.planner_group), worker=w, tokens=int(x.get("tokens", 0)),
                                       kv_k=st["kv_k"], kv_v=st["kv_v"], where=x["where"]))  # fmt: skip
        return out

    def parked_summary(self, states: dict[str, Any]) -> dict[str, Any]:
        """The parked agents' host bytes per worker and tier, and the words for them (the plan's accounting)."""
        by_worker = parked_by_worker(self.inputs.geometry, self.parked_agents(states))
        return {"workers": [dataclasses.asdict(p) for p in by_worker],
                "explanation": explain_parked(by_worker) if by_worker else "no agent is parked"}  # fmt: skip

    def kv_moves(self) -> dict[str, int]:
        """What the moves of this run did with the agents' KV (from the events): ships, failed ships, and the
        history tokens moved agents had to re-prefill (a worker counts only its own sessions' re-prefills)."""
        ev = self.events
        shipped = [e for e in ev if e["event"] == "shipped"]
        moves = [e for e in ev if e["event"] == "moved" and e.get("dst")]
        shipped_tokens = sum(int(e.get("tokens", 0)) for e in shipped)
        return {
            "moves": len(moves),
            "shipped": len(shipped),
            "ship_failed": sum(1 for e in ev if e["event"] == "ship_failed"),
            "shipped_bytes": sum(int(e.get("bytes", 0)) for e in shipped),
            "shipped_tokens": shipped_tokens,
            "reprefilled_after_moves_tokens": max(0, sum(int(e.get("history", 0)) for e in moves) - shipped_tokens),
        }

    def info(self) -> dict[str, Any]:
        with self.lock:
            names = [a.name for a in self.agents.values()]
            return {"name": self.cfg.name, "state": self.state, "agents": len(names), "agent_names": names,
                    "workers": len(self.sched.live_workers()), "error": self.error, "started_unix": self.started,
                    "tokens_generated": sum(a.tokens_generated for a in self.agents.values())}  # fmt: skip

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
            "lifecycle": {w: lifecycle_view(st.get("lifecycle"), None) for w, st in states.items()},
            "kv_moves": self.kv_moves(),
            "parked": self.parked_summary(states),
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary


STATES = ("active", "idle", "parked", "dropped")  # a session's lifecycle states (worker/lifecycle.py)

# the worker's lifecycle counters (EngineWorker.state()["lifecycle"]) exported as Ray counters: {name: help}
LIFECYCLE_COUNTERS = {
    "restores": "sessions restored from a park (RAM or disk) instead of re-prefilled",
    "ships_in": "sessions whose KV arrived from another worker",
    "ships_out": "sessions whose KV was exported to another worker",
    "reprefill_tokens": "tokens re-prefilled because a session's KV was gone",
    "reprefill_tokens_saved": "tokens not re-prefilled because a session's KV was kept, restored or shipped",
}


def lifecycle_numbers(life: Any) -> dict[str, int]:
    """The byte gauges and counters of a worker's state()["lifecycle"] as ints (0 for any it does not report):
    restores summed over the tiers, ships split in and out."""
    life = life if isinstance(life, dict) else {}
    ships = life.get("ships") if isinstance(life.get("ships"), dict) else {}
    raw = {
        "idle_bytes": life.get("idle_bytes"),
        "parked_ram_bytes": life.get("parked_ram_bytes"),
        "parked_disk_bytes": life.get("parked_disk_bytes"),
        "restores": life.get("restores"),
        "ships_in": ships.get("in"),
        "ships_out": ships.get("out"),
        "reprefill_tokens": life.get("reprefilled_tokens"),
        "reprefill_tokens_saved": life.get("reprefill_tokens_saved"),
    }
    out = {}
    for key, v in raw.items():
        if isinstance(v, dict):  # per tier ({"ram": n, "disk": m}): the total
            v = sum(x for x in v.values() if isinstance(x, int | float))
        out[key] = int(v) if isinstance(v, int | float) else 0
    return out


def session_states(sessions: Any) -> list[dict[str, Any]]:
    """A worker's state()["sessions"] ({session: {"state", "where", "kv_bytes", "tokens"}}) as the API's list,
    in agent order. A worker that reports only names (no lifecycle) holds them in its pool."""
    if isinstance(sessions, dict):
        items = sessions.items()
    else:
        items = ((name, {"state": "active", "where": "pool"}) for name in sessions or ())
    out = []
    for name, s in sorted(items, key=lambda kv: _agent_key(kv[0])):
        s = s if isinstance(s, dict) else {}
        out.append({"agent": str(name), "state": str(s.get("state", "")), "where": str(s.get("where", "")),
                    "kv_bytes": int(s.get("kv_bytes", 0)), "tokens": int(s.get("tokens", 0))})  # fmt: skip
    return out


def lifecycle_view(life: Any, spec: Any) -> dict[str, Any]:
    """A worker's state()["lifecycle"] as the API's Lifecycle: counts per state, bytes, restores, ships."""
    life = life if isinstance(life, dict) else {}
    counts = life.get("counts") if isinstance(life.get("counts"), dict) else life
    out: dict[str, Any] = {"policy": str(life.get("policy", getattr(spec, "lifecycle", "")))}
    out.update({state: int(counts.get(state, 0)) for state in STATES})
    out.update(lifecycle_numbers(life))
    return out


def summary_table(summary: dict[str, Any]) -> str:
    rows = [f"{'agent':<18}{'worker':<14}{'turns':>6}{'tokens':>8}  finish"]
    for name, a in summary["agents"].items():
        rows.append(f"{name:<18}{str(a['worker']):<14}{a['turns']:>6}{a['tokens']:>8}  {a['finish']}"
                    + (f" (moved {a['moves']}x)" if a["moves"] else ""))  # fmt: skip
    rows.append(f"{summary['tokens_generated']} tokens in {summary['wall_s']:.1f} s "
                f"({summary['tokens_per_s']:.1f} tokens/s across the swarm)")  # fmt: skip
    return "\n".join(rows)
