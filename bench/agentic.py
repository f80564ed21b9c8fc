"""Agentic workload: agents alternate short generations with tool pauses, on a KV budget that holds half of them.

Each agent runs `--turns` turns: a turn appends about 150 tokens of tool output to its conversation and generates
40 tokens; between turns it waits for its tool, a pause drawn from one seeded distribution (80% lognormal around
half a second, 20% at 8 s: the median pause is 0.5 s). The worker's KV budget holds the contexts of only half of
the agents (at their final length), so while some wait others need the room.

Two runs on the same real engine setup, one after the other, with the same seeds and the same pauses:

- baseline (`lifecycle: drop`): today's behaviour. An idle session's KV is freed when space is needed and its
  next turn re-prefills the whole history.
- lifecycle (`lifecycle: measured`): idle sessions are kept, parked to host RAM or disk, or dropped as the
  worker's measured costs and the agents' learnt pauses say (worker/lifecycle.py); the next turn restores or
  re-prefills, whichever is faster.

It drives `EngineWorker` directly (no Ray, no swarm): one worker, the agents as a poll loop in this process, so
what is compared is the worker's lifecycle and nothing else. Reported per run: mean and p95 job completion time
(an agent's job: its first submit to its last token, pauses included, the same pauses in both runs), per-turn
latency, and re-prefilled tokens (the tokens a turn prefilled beyond the ones it added). `jct_ratio` is
baseline mean JCT / lifecycle mean JCT; `reprefill_saved_share` is 1 - lifecycle re-prefilled / baseline's.

    .venv/bin/python bench/agentic.py --json bench/results/agentic.json
    .venv/bin/python bench/agentic.py --quick     # smoke test: 4 agents x 3 turns, short pauses, < 2 minutes

Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.service import EngineWorker, WorkerSpec  # noqa: E402

TOOL_TOKENS = 150  # tokens of tool output a turn appends
GEN_TOKENS = 40  # tokens a turn generates
PROMPT_TOKENS = 200  # the agent's first prompt (system prompt and task)
LONG_PAUSE_S = 8.0  # a slow tool
LONG_SHARE = 0.2  # of pauses
PAUSE_SIGMA = 0.5  # lognormal spread of the short pauses
MEDIAN_PAUSE_S = 0.5  # of all pauses
# The short pauses' median m solves 0.8 * P(lognormal(m) < 0.5) = 0.5: P = 0.625, so m = 0.5 / exp(sigma z(0.625)).
SHORT_MEDIAN_S = MEDIAN_PAUSE_S / math.exp(PAUSE_SIGMA * statistics.NormalDist().inv_cdf(0.5 / (1 - LONG_SHARE)))
POLL_S = 0.01
# --quick: a smoke test of both runs in well under 2 minutes on 2 busy cores (the same shape, smaller)
QUICK_AGENTS, QUICK_TURNS, QUICK_PAUSE_SCALE = 4, 3, 0.1


@dataclass(frozen=True)
class Workload:
    agents: int = 8
    turns: int = 10
    seed: int = 0
    pause_scale: float = 1.0  # --quick shortens the pauses (the same shape)
    kv: str = "q8_0"
    threads: int = 2
    model: str = "default"

    def pauses(self) -> list[list[float]]:
        """pauses[agent][turn]: the wait after that turn (seeded; the same in both runs)."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.agents):
            row = []
            for _ in range(self.turns - 1):
                long = rng.random() < LONG_SHARE
                p = LONG_PAUSE_S if long else rng.lognormvariate(math.log(SHORT_MEDIAN_S), PAUSE_SIGMA)
                row.append(p * self.pause_scale)
            out.append(row)
        return out

    def tokens(self, n_vocab: int) -> list[list[list[int]]]:
        """tokens[agent][turn]: what the turn appends (turn 0: the prompt). Seeded ids from the ordinary range."""
        rng = random.Random(self.seed + 1)
        lo, hi = 100, min(n_vocab, 30_000)  # past the special tokens
        return [[[rng.randrange(lo, hi) for _ in range(PROMPT_TOKENS if t == 0 else TOOL_TOKENS)]
                 for t in range(self.turns)] for _ in range(self.agents)]  # fmt: skip

    def final_context(self) -> int:
        return PROMPT_TOKENS + (self.turns - 1) * TOOL_TOKENS + self.turns * GEN_TOKENS


@dataclass
class _Agent:
    name: str
    turn: int = 0
    history: list[int] = field(default_factory=list)
    next_at: float = 0.0  # when its next turn is submitted
    running: bool = False
    submitted_at: float = 0.0
    started: float | None = None
    ended: float | None = None
    turn_s: list[float] = field(default_factory=list)
    reprefilled: int = 0  # tokens resent because the worker no longer held the session


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else 0.0


def run(w: Workload, lifecycle: str, park_dir: Path) -> dict[str, Any]:
    """One run of the workload on a fresh worker with the given lifecycle policy."""
    probe = EngineWorker(_spec(w, lifecycle, park_dir, 1 << 30))
    mem = probe.engine.memory()
    n_vocab = probe.n_vocab
    probe.stop()
    per_agent = math.ceil(w.final_context() / probe.spec.block_tokens) * int(mem["block_bytes"])
    budget = per_agent * w.agents // 2  # the KV of half of the agents at their final context
    worker = EngineWorker(_spec(w, lifecycle, park_dir, budget))
    costs = worker.park_costs()  # measured (or read from the cache) now, not during the timed run; None for drop
    pauses, tokens = w.pauses(), w.tokens(n_vocab)
    sampling = {"temperature": 0.0, "max_new_tokens": GEN_TOKENS, "stop_tokens": ()}
    agents = [_Agent(f"agent-{i}") for i in range(w.agents)]
    t0 = time.monotonic()
    failed: list[str] = []
    try:
        while any(a.ended is None for a in agents):
            now = time.monotonic()
            for i, a in enumerate(agents):
                if a.ended is None and not a.running and now >= a.next_at:
                    _submit(worker, a, tokens[i][a.turn], sampling)
                    a.started = a.started if a.started is not None else now
            for name, ev in worker.drain().items():
                a = agents[int(name.rsplit("-", 1)[1])]
                a.history += ev["tokens"]
                if not ev["done"]:
                    continue
                if ev["reason"] == "error":
                    failed.append(f"{name} turn {a.turn}: {ev['error']}")
                done = time.monotonic()
                a.running = False
                a.turn_s.append(done - a.submitted_at)
                finished = sum(len(x.turn_s) for x in agents)
                if finished % w.agents == 0:  # progress, about once per round of turns
                    print(f"  {lifecycle}: {finished}/{w.agents * w.turns} turns, {done - t0:.0f} s", file=sys.stderr)
                i = int(name.rsplit("-", 1)[1])
                if a.turn + 1 >= w.turns or ev["reason"] == "error":
                    a.ended = done
                else:
                    a.next_at = done + pauses[i][a.turn]
                    a.turn += 1
            time.sleep(POLL_S)
        state = worker.state()
    finally:
        worker.stop()
    jct = [a.ended - a.started for a in agents if a.ended is not None and a.started is not None]
    turns = [s for a in agents for s in a.turn_s]
    life = state.get("lifecycle") or {}
    added = sum(len(tokens[i][t]) for i in range(w.agents) for t in range(w.turns))
    reprefilled = _reprefilled(state, added, agents)
    return {
        "lifecycle": lifecycle,
        "kv_budget_bytes": budget,
        "kv_budget_agents": budget / per_agent,
        "wall_s": time.monotonic() - t0,
        "jct_mean_s": statistics.fmean(jct),
        "jct_p95_s": _pct(jct, 0.95),
        "turn_mean_s": statistics.fmean(turns),
        "turn_p95_s": _pct(turns, 0.95),
        "reprefilled_tokens": reprefilled,
        "tokens_prefilled": int(state.get("tokens_prefilled", 0)),
        "tokens_added": added,
        "failed_turns": failed,
        "worker_lifecycle": {k: v for k, v in life.items() if k not in ("decisions", "costs")},
        "park_costs": costs,
        "decisions": life.get("decisions", [])[-8:],  # the worker's last decisions, in words and numbers
    }


def _reprefilled(state: dict[str, Any], added: int, agents: list[_Agent]) -> int:
    """Tokens prefilled again: the worker's own count when it keeps one, else what this driver resent."""
    life = state.get("lifecycle")
    if isinstance(life, dict) and isinstance(life.get("reprefilled_tokens"), int):
        return int(life["reprefilled_tokens"])
    return sum(a.reprefilled for a in agents)


def _submit(worker: EngineWorker, a: _Agent, new: list[int], sampling: dict[str, Any]) -> None:
    """The agent's next turn: its new tokens on top of what the worker holds; the whole history if it holds none."""
    from worker.errors import SessionError

    a.submitted_at, a.running = time.monotonic(), True
    if not a.history:
        a.history = list(new)
        worker.submit(a.name, a.turn, list(new), sampling, True)
        return
    try:
        worker.submit(a.name, a.turn, list(new), sampling, False)
        a.history += new
    except SessionError:  # the worker dropped it: resend the whole history (re-prefilled)
        a.reprefilled += len(a.history)
        a.history += new
        worker.submit(a.name, a.turn, list(a.history), sampling, True)


def _spec(w: Workload, lifecycle: str, park_dir: Path, budget: int) -> WorkerSpec:
    return WorkerSpec(name=f"agentic-{lifecycle}", kind="local", device="local", model=w.model, kv_k=w.kv, kv_v=w.kv,
                      kv_budget_bytes=budget, threads=w.threads, swarm="agentic", lifecycle=lifecycle,
                      park_dir=str(park_dir / lifecycle))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="default")
    quick = f"{QUICK_AGENTS} agents x {QUICK_TURNS} turns, pauses x{QUICK_PAUSE_SCALE}: a smoke test"
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    agents, turns, scale = (args.agents, args.turns, 1.0)
    if args.quick:
        agents, turns, scale = QUICK_AGENTS, QUICK_TURNS, QUICK_PAUSE_SCALE
    w = Workload(agents=agents, turns=turns, seed=args.seed, pause_scale=scale, kv=args.kv,
                 threads=args.threads, model=args.model)  # fmt: skip
    if w.agents < 2 or w.turns < 2:
        ap.error("--agents and --turns must be at least 2")
    with tempfile.TemporaryDirectory(prefix="kvswarm-agentic-") as tmp:
        base = run(w, "drop", Path(tmp))
        print(_line("baseline (drop)", base), flush=True)
        life = run(w, "measured", Path(tmp))
        print(_line("lifecycle (measured)", life), flush=True)
    out = {
        "workload": {
            **asdict(w),
            "tool_tokens": TOOL_TOKENS,
            "gen_tokens": GEN_TOKENS,
            "prompt_tokens": PROMPT_TOKENS,
            "final_context": w.final_context(),
        },  # fmt: skip
        "baseline": base,
        "lifecycle": life,
        "jct_ratio": base["jct_mean_s"] / life["jct_mean_s"] if life["jct_mean_s"] else 0.0,
        "reprefill_saved_share": (
            1 - life["reprefilled_tokens"] / base["reprefilled_tokens"] if base["reprefilled_tokens"] else 0.0
        ),
    }
    print(f"mean JCT {out['jct_ratio']:.2f}x lower with the lifecycle; "
          f"{out['reprefill_saved_share']:.0%} fewer re-prefilled tokens")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if not base["failed_turns"] and not life["failed_turns"] else 1


def _line(label: str, r: dict[str, Any]) -> str:
    return (f"{label:<22} JCT mean {r['jct_mean_s']:.2f} s p95 {r['jct_p95_s']:.2f} s; turn mean "
            f"{r['turn_mean_s']:.2f} s p95 {r['turn_p95_s']:.2f} s; re-prefilled {r['reprefilled_tokens']:,} tokens"
            f"{'; FAILED ' + str(len(r['failed_turns'])) + ' turns' if r['failed_turns'] else ''}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
