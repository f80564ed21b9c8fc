"""Soak: minutes of jobs, cancels and a worker kill per minute against a local swarm.

A server runs in this process (local Ray, two workers); client threads keep
submitting jobs (to the swarm's agents, and one-off agents), stream them to
the end, and cancel some mid-stream; once a minute a worker process is killed
with SIGKILL. Every job must end completed, cancelled by us, or refused or
failed with a reason: `lost` (no terminal state, or a stream with a gap or a
repeat) must be 0. Reported: counts, latency percentiles, and the resident
memory of every process at start and end.

    .venv/bin/python bench/soak.py --minutes 10 --json results/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import grpc  # noqa: E402

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve  # noqa: E402

TOKEN = "soak"
CONFIG = """
name: soak
agents:
  - name: chat
    count: 8
    context: 1024
    system_prompt: You are a helpful assistant. Answer briefly.
    max_new_tokens: 32
workers:
  - name: w1
    kind: virtual
    device: x86-host
  - name: w2
    kind: virtual
    device: x86-host
policy:
  formats: [q8_0]
engine:
  threads: 1
"""
PROMPTS = ["Name a color.", "Tell me a fact about the sea.", "Count to five.", "What is a cache?", "Say hello."]


def rss_by_role() -> dict[str, int]:
    """Resident bytes summed per role: this driver, engine workers, Ray's own processes."""
    out: Counter[str] = Counter()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            rss = next(int(ln.split()[1]) * 1024 for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if ln.startswith("VmRSS:"))  # fmt: skip
        except (OSError, StopIteration):
            continue
        if int(pid) == os.getpid():
            out["driver+server"] += rss
        elif "MeteredEngineWorker" in cmd:
            out["engine workers"] += rss
            out["engine worker processes"] += 1
            out["largest engine worker"] = max(out["largest engine worker"], rss)
        elif any(k in cmd for k in ("raylet", "gcs_server", "dashboard", "ray/_private", "runtime_env")):
            out["ray"] += rss
    return dict(out)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between worker kills")
    ap.add_argument("--cancel-rate", type=float, default=0.1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=Path("/tmp/kvswarm-soak"), echo=lambda m: None)
    outcomes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    latency: list[float] = []
    lost: list[str] = []
    kills: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.minutes * 60
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            time.sleep(2)
            rss_start = rss_by_role()

            def client(k: int) -> None:
                rng = random.Random(k)
                while time.monotonic() < stop_at:
                    t0 = time.monotonic()
                    target = {"new_agent": True} if rng.random() < 0.1 else {"agent": f"chat-{rng.randrange(8)}"}
                    try:
                        job = c.submit("soak", messages=[("user", rng.choice(PROMPTS))], max_tokens=rng.randint(8, 48),
                                       **target)[0]  # fmt: skip
                    except grpc.RpcError as e:
                        with lock:
                            outcomes["refused"] += 1
                            reasons[f"{e.code().name}: {e.details()[:60]}"] += 1
                        time.sleep(0.2)
                        continue
                    cancel_after = rng.randint(1, 6) if rng.random() < args.cancel_rate else None
                    got, expect, final = 0, 0, None
                    try:
                        for ev in c.stream(job.id, timeout=300):
                            if ev.offset != expect:
                                raise AssertionError(f"gap or repeat at {ev.offset} (expected {expect})")
                            expect += len(ev.token_ids)
                            got += len(ev.token_ids)
                            if cancel_after is not None and got >= cancel_after:
                                c.cancel(job.id)
                                cancel_after = None
                            if ev.done:
                                final = ev.job
                    except Exception as e:  # noqa: BLE001 - a broken stream is a lost job
                        with lock:
                            lost.append(f"{job.id}: {type(e).__name__}: {e}")
                        continue
                    with lock:
                        if final is None:
                            lost.append(f"{job.id}: the stream ended without the job ending")
                        else:
                            outcomes[final.state] += 1
                            reasons[final.finish_reason] += 1
                            if final.state == "done":
                                latency.append(time.monotonic() - t0)

            threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.clients)]
            for t in threads:
                t.start()
            next_kill = time.monotonic() + args.kill_every
            while time.monotonic() < stop_at:
                time.sleep(1)
                if time.monotonic() >= next_kill:
                    next_kill += args.kill_every
                    workers = scheduler.placement("soak")["workers"]
                    if workers:
                        name = random.choice(sorted(workers))
                        os.kill(workers[name]["pid"], signal.SIGKILL)
                        kills.append(name)
                        print(f"[{time.strftime('%H:%M:%S')}] killed {name} (pid {workers[name]['pid']}); "
                              f"so far {dict(outcomes)}, lost {len(lost)}", flush=True)  # fmt: skip
            for t in threads:
                t.join(timeout=600)
            rss_end = rss_by_role()
            budgets = {w.worker: w.kv_bytes_budget for w in c.placement("soak").workers}
            jobs = c.jobs("soak", limit=100000)
            unfinished = [j.id for j in jobs if j.state in ("queued", "running")]
    finally:
        srv.stop()
        scheduler.disconnect(conn)
    result = {
        "minutes": args.minutes, "clients": args.clients, "kills": kills, "outcomes": dict(outcomes),
        "reasons": dict(reasons.most_common(20)), "lost": lost, "unfinished_on_server": unfinished,
        "latency_p50_s": pct(latency, 50), "latency_p99_s": pct(latency, 99),
        "rss_start": rss_start, "rss_end": rss_end, "kv_budgets_end": budgets, "date": time.strftime("%Y-%m-%d"),
        "python": sys.version.split()[0],
    }  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "lost"}, indent=2))
    print(f"lost: {len(lost)}" + (f" (first: {lost[0]})" if lost else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(1 if lost or unfinished else 0)


if __name__ == "__main__":
    main()
