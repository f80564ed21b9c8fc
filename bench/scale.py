"""Scale: a swarm of many agents over many virtual workers launches, runs one turn each, and stops.

The server runs in this process (the driver: gRPC server, swarm loop, planner,
Ray driver) on a loopback port with a local Ray; the workers are virtual
(`x86-host` from configs/devices.yaml, a memory cap each), one Ray actor each.
Every agent has one short task (a few new tokens), so the run measures the
driver's own costs, not decoding.

Reported:
- launch_s: the LaunchSwarm call (plan, 20 worker actors, KV placement groups);
- turns_s: from the launch's answer until every agent has had its turn;
- driver CPU (this process, all threads) per generated token over launch + turns;
- GetPlacement latency (median, p99) while the swarm runs its turns and when it
  is idle, each over `--placement-calls` calls spaced past the server's 0.25 s
  cache (so each one asks the workers);
- stop_s: the StopSwarm call.

    .venv/bin/python bench/scale.py                          # 2,000 agents over 20 virtual workers
    .venv/bin/python bench/scale.py --agents 200 --workers 4 --json results/scale-200.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve  # noqa: E402

TOKEN = "scale-bench"
PLACEMENT_SPACING_S = 0.3  # past SwarmRun.placement's 0.25 s cache: every call asks the workers
WORKER_MEMORY = "512MiB"  # per virtual worker: weights (~100 MB), scratch and 100 short agents' KV


def scale_config(name: str, agents: int, workers: int, max_new: int, threads: int = 1) -> str:
    """One group of `agents` agents, one short task each, over `workers` virtual x86 hosts."""
    ws = "\n".join(f"  - {{name: w{i:02d}, kind: virtual, device: x86-host, memory: {WORKER_MEMORY}}}"
                   for i in range(workers))  # fmt: skip
    return f"""
name: {name}
agents:
  - name: a
    count: {agents}
    context: 64
    system_prompt: You are terse.
    tasks: ["Say hi."]
    max_new_tokens: {max_new}
workers:
{ws}
policy:
  formats: [q8_0]
engine:
  threads: {threads}
"""


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def _latencies(c: SwarmClient, swarm: str, n: int, stop: threading.Event | None = None) -> list[float]:
    out = []
    for _ in range(n):
        if stop is not None and stop.is_set():
            break
        t = time.perf_counter()
        c.placement(swarm)
        out.append(time.perf_counter() - t)
        time.sleep(PLACEMENT_SPACING_S)
    return out


def run_scale(
    agents: int,
    workers: int,
    *,
    max_new: int = 2,
    placement_calls: int = 50,
    out_root: Path = Path("/tmp/kvswarm-scale"),
    timeout_s: float = 1800.0,
    conn: scheduler.Connection | None = None,
    say: Any = print,
) -> dict[str, Any]:
    """Runs one scale swarm through the API; the numbers, every agent's (turns, tokens) and the placement."""
    own = conn is None
    conn = conn or scheduler.connect(None, kv_bytes=8 * 10**9)
    name = f"scale{agents}"
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=out_root, echo=lambda m: None)
    c = SwarmClient(srv.target, token=TOKEN, timeout_s=600)
    try:
        cpu0, t0 = _cpu_s(), time.perf_counter()
        c.launch(scale_config(name, agents, workers, max_new))
        launch_s, launch_cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        say(f"launched {agents} agents over {workers} workers in {launch_s:.1f} s ({launch_cpu:.1f} s CPU)")
        run = srv.hub.swarm(name)
        ticks: list[float] = []  # when each swarm-loop poll ended: the gaps are how long a tick held run.lock
        run.on_tick = lambda r: ticks.append(time.perf_counter())
        busy: list[float] = []
        done = threading.Event()
        watcher = threading.Thread(target=lambda: busy.extend(_latencies(c, name, placement_calls, done)))
        watcher.start()
        t1 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while True:
            with run.lock:
                left = sum(1 for a in run.agents.values() if a.tasks_done < 1)
            if left == 0 or run.state != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        turns_s, cpu_total = time.perf_counter() - t1, _cpu_s() - cpu0
        run.on_tick = None
        gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
        done.set()
        watcher.join()
        say(f"turns done in {turns_s:.1f} s ({left} agents left, state {run.state})")
        idle = _latencies(c, name, placement_calls)
        p = c.placement(name)
        with run.lock:
            turns = {a.name: (a.tasks_done, a.tokens_generated, len(a.log)) for a in run.agents.values()}
            tokens = sum(a.tokens_generated for a in run.agents.values())
        t2 = time.perf_counter()
        info = c.stop(name)
        stop_s = time.perf_counter() - t2
        return {
            "agents": agents, "workers": workers, "max_new_tokens": max_new, "state": run.state,
            "stopped_state": info.state, "launch_s": launch_s, "launch_cpu_s": launch_cpu, "turns_s": turns_s,
            "stop_s": stop_s, "tokens_generated": tokens, "driver_cpu_s": cpu_total,
            "driver_cpu_ms_per_token": 1e3 * cpu_total / tokens if tokens else float("nan"),
            "get_placement_busy_ms": {"median": 1e3 * statistics.median(busy) if busy else float("nan"),
                                      "p99": 1e3 * _pct(busy, 99), "calls": len(busy)},
            "get_placement_idle_ms": {"median": 1e3 * statistics.median(idle), "p99": 1e3 * _pct(idle, 99),
                                      "calls": len(idle)},
            "longest_tick_s": max(gaps, default=float("nan")), "ticks": len(gaps),
            "turns": turns,
            "placement_agents": sorted(x for w in p.workers for x in w.agents),
            "placement_workers": len(p.workers),
        }  # fmt: skip
    finally:
        c.close()
        srv.stop()
        if own:
            scheduler.disconnect(conn)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--max-new", type=int, default=2, help="new tokens per agent's turn")
    ap.add_argument("--placement-calls", type=int, default=50)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    r = run_scale(args.agents, args.workers, max_new=args.max_new, placement_calls=args.placement_calls)
    r["machine"] = f"{platform.machine()} {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    had_turn = sum(1 for t in r["turns"].values() if t[0] >= 1)
    print(f"{r['agents']} agents over {r['workers']} virtual workers ({r['machine']})")
    print(f"  launch: {r['launch_s']:.1f} s ({r['launch_cpu_s']:.1f} s driver CPU)")
    print(f"  turns: {r['turns_s']:.1f} s; {had_turn}/{r['agents']} agents had their turn, "
          f"{r['tokens_generated']} tokens")  # fmt: skip
    print(f"  driver CPU: {r['driver_cpu_s']:.1f} s, {r['driver_cpu_ms_per_token']:.2f} ms per generated token")
    for k in ("busy", "idle"):
        g = r[f"get_placement_{k}_ms"]
        print(f"  GetPlacement while {k}: median {g['median']:.1f} ms, p99 {g['p99']:.1f} ms ({g['calls']} calls)")
    print(f"  longest swarm-loop tick (holding the swarm's lock): {r['longest_tick_s']:.1f} s of {r['ticks']} ticks")
    print(f"  placement lists {len(r['placement_agents'])} agents on {r['placement_workers']} workers")
    print(f"  stop: {r['stop_s']:.1f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        out = {k: v for k, v in r.items() if k not in ("turns", "placement_agents")}
        out["agents_with_their_turn"], out["placement_agents"] = had_turn, len(r["placement_agents"])
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if had_turn == r["agents"] else 1


if __name__ == "__main__":
    sys.exit(main())
