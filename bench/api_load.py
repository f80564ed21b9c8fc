"""200 concurrent streaming jobs against one kvswarm gRPC server, and the same
work driven on the engine directly in the same run (the API's overhead).

The server runs in this process on a loopback port with a local Ray and one
worker; each client thread submits one job to its own agent and streams it.
Reported: aggregate tokens/s, time to first token and inter-token latency
(p50/p99, as the client sees them), and the ratios against the engine alone.

    .venv/bin/python bench/api_load.py [--jobs 200] [--max-tokens 32] [--json results/api_load.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import Limits, serve  # noqa: E402
from worker.engine import Engine, Sampling  # noqa: E402

TOKEN = "bench"
QUESTIONS = ["Name a color.", "Name a fruit.", "Name a city.", "Name an animal.", "Name a planet."]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def config(n: int, kv: str, threads: int, max_tokens: int) -> str:
    return f"""
name: load
agents:
  - name: chat
    count: {n}
    context: 128
    system_prompt: You are terse.
    max_new_tokens: {max_tokens}
workers:
  - name: host
    kind: virtual
    device: x86-host
policy:
  formats: [{kv}]
engine:
  threads: {threads}
  max_batch_tokens: 512
"""


def through_api(n: int, kv: str, threads: int, max_tokens: int) -> dict:
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=Path("/tmp/kvswarm-bench"), echo=lambda m: None,
                limits=Limits(max_streams_per_client=n + 8))  # fmt: skip
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(config(n, kv, threads, max_tokens))
            ttft: list[float] = []
            itl: list[float] = []
            tokens = [0] * n
            errors: list[str] = []
            barrier = threading.Barrier(n + 1)

            def one(i: int) -> None:
                barrier.wait()
                t0 = time.perf_counter()
                try:
                    job = c.submit("load", agent=f"chat-{i}", messages=[("user", QUESTIONS[i % len(QUESTIONS)])],
                                   max_tokens=max_tokens, sampling={"temperature": 0.0})[0]  # fmt: skip
                    last = None
                    for ev in c.stream(job.id):
                        now = time.perf_counter()
                        k = len(ev.token_ids)
                        if k:
                            if last is None:
                                ttft.append(now - t0)
                                k -= 1
                            elif k:
                                itl.extend([(now - last) / k] * k)
                            last = now
                        tokens[i] += len(ev.token_ids)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    errors.append(f"{type(e).__name__}: {e}")

            threads_ = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for t in threads_:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in threads_:
                t.join()
            wall = time.perf_counter() - t0
            c.stop("load")
    finally:
        srv.stop()
        scheduler.disconnect(conn)
    return {"tokens": sum(tokens), "wall_s": wall, "tokens_per_s": sum(tokens) / wall, "errors": errors,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "itl_p50_s": pct(itl, 50),
            "itl_p99_s": pct(itl, 99)}  # fmt: skip


def direct(n: int, kv: str, threads: int, max_tokens: int) -> dict:
    """The same prompts on one engine in this process: add every sequence, step until done."""
    eng = Engine(kv_k=kv, kv_v=kv, threads=threads, max_batch_tokens=512)
    tok = eng.tokenizer
    stop = tuple(sorted(tok.eot_ids))
    t0 = time.perf_counter()
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    itl: list[float] = []
    seqs = []
    for i in range(n):
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTIONS[i % 5]}]
        ids = tok.encode(tok.render_chat(msgs, add_generation_prompt=True))
        seqs.append(eng.add_sequence(ids, Sampling(max_new_tokens=max_tokens, stop_tokens=stop)))
    made = 0
    while eng.busy():
        out = eng.step()
        now = time.perf_counter()
        for s in out:
            if s not in first:
                first[s] = now - t0
            else:
                itl.append(now - last[s])
            last[s] = now
        made += len(out)
    wall = time.perf_counter() - t0
    ttft = list(first.values())
    return {"tokens": made, "wall_s": wall, "tokens_per_s": made / wall, "ttft_p50_s": pct(ttft, 50),
            "ttft_p99_s": pct(ttft, 99), "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    api = through_api(args.jobs, args.kv, args.threads, args.max_tokens)
    eng = direct(args.jobs, args.kv, args.threads, args.max_tokens)
    cpu = platform.processor() or platform.machine()
    print(f"{args.jobs} concurrent streaming jobs, {args.max_tokens} new tokens each, KV {args.kv}, "
          f"{args.threads} threads, {cpu}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"{'':<22}{'tokens/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}")
    for name, r in (("gRPC API (Ray)", api), ("engine directly", eng)):
        print(f"{name:<22}{r['tokens_per_s']:>10.1f}{r['ttft_p50_s'] * 1e3:>8.0f}ms{r['ttft_p99_s'] * 1e3:>8.0f}ms"
              f"{r['itl_p50_s'] * 1e3:>8.1f}ms{r['itl_p99_s'] * 1e3:>8.1f}ms")  # fmt: skip
    print(f"API / direct: throughput {api['tokens_per_s'] / eng['tokens_per_s']:.2f}x, "
          f"TTFT p50 {api['ttft_p50_s'] / eng['ttft_p50_s']:.2f}x, ITL p50 {api['itl_p50_s'] / eng['itl_p50_s']:.2f}x; "
          f"errors {len(api['errors'])}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "api": api, "direct": eng,
                                               "python": sys.version.split()[0]}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
