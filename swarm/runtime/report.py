"""Reports: the API's views (placement, info) and the run's transcripts and summary."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

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


def summary_table(summary: dict[str, Any]) -> str:
    rows = [f"{'agent':<18}{'worker':<14}{'turns':>6}{'tokens':>8}  finish"]
    for name, a in summary["agents"].items():
        rows.append(f"{name:<18}{str(a['worker']):<14}{a['turns']:>6}{a['tokens']:>8}  {a['finish']}"
                    + (f" (moved {a['moves']}x)" if a["moves"] else ""))  # fmt: skip
    rows.append(f"{summary['tokens_generated']} tokens in {summary['wall_s']:.1f} s "
                f"({summary['tokens_per_s']:.1f} tokens/s across the swarm)")  # fmt: skip
    return "\n".join(rows)
