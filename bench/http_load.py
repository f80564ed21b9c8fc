"""N concurrent streaming chat completions over the OpenAI-compatible HTTP API, against the gRPC path and
the engine directly, in one run; and the per-token cost of grammar-constrained decoding.

One server in this process (gRPC and HTTP on loopback, a local Ray, one worker) runs a swarm with two
groups of N agents. The HTTP clients stream one chat completion each to their own agent (`load/h-<i>`),
then the gRPC clients submit and stream the same prompts to theirs (`g-<i>`); each client set runs in a
child process, so its threads do not take the server's GIL. The engine
alone then runs the same prompts (bench/api_load.py `direct`). Reported: tokens/s, TTFT and ITL p50/p99
as the clients see them (HTTP ITL: gaps between content chunks, about one token each; gRPC: stream
events, spread over the tokens they carry).

Constrained vs unconstrained (the goal: under 10% slower per token): one batch of B sequences stepped by
the engine, as the worker steps them (worker/grammar.py), once free and once with every sequence under a
JSON grammar (a mask computed and set for each sequence after each step). Seconds per batch step.

    .venv/bin/python bench/http_load.py [--jobs 200] [--max-tokens 32] [--batch 16] [--json results/http_load.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from api_load import QUESTIONS, direct, pct  # noqa: E402

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.http import grammar as gr  # noqa: E402
from swarm.server import Limits, serve  # noqa: E402
from worker.engine import Engine, Sampling  # noqa: E402
from worker.grammar import Grammars  # noqa: E402

TOKEN = "bench"
SYSTEM = "You are terse."


WARM = 8  # agents of group w: a first round on both paths (connections, worker caches), not measured


def config(n: int, kv: str, threads: int, max_tokens: int) -> str:
    groups = "".join(f"""
  - name: {g}
    count: {count}
    context: 128
    system_prompt: {SYSTEM}
    max_new_tokens: {max_tokens}""" for g, count in (("h", n), ("g", n), ("w", 2 * WARM)))  # fmt: skip
    return f"""
name: load
agents:{groups}
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


def _summary(tokens: int, wall: float, ttft: list[float], itl: list[float], errors: list[str]) -> dict[str, Any]:
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "errors": errors[:5],
            "n_errors": len(errors), "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99)}  # fmt: skip


def _run_clients(n: int, one: Any) -> float:
    barrier = threading.Barrier(n + 1)

    def go(i: int) -> None:
        barrier.wait()
        one(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def over_http(url: str, n: int, max_tokens: int, agent: Callable[[int], str] = "h-{}".format) -> dict[str, Any]:
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0] * n
    errors: list[str] = []
    http = httpx.Client(limits=httpx.Limits(max_connections=n + 8), timeout=600,
                        headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip

    def one(i: int) -> None:
        question = QUESTIONS[i % len(QUESTIONS)]
        body = {"model": f"load/{agent(i)}", "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        t0 = time.perf_counter()
        try:
            times: list[float] = []
            with http.stream("POST", url + "/chat/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens[i] = chunk["usage"]["completion_tokens"]
                    elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        times.append(time.perf_counter())
            if times:
                ttft.append(times[0] - t0)
                itl.extend(b - a for a, b in zip(times, times[1:], strict=False))  # a chunk is about one token
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(f"{type(e).__name__}: {e}")

    wall = _run_clients(n, one)
    http.close()
    return _summary(sum(tokens), wall, ttft, itl, errors)


def over_grpc(target: str, n: int, max_tokens: int, agent: Callable[[int], str] = "g-{}".format) -> dict[str, Any]:
    c = SwarmClient(target, token=TOKEN)
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0] * n
    errors: list[str] = []

    def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            job = c.submit("load", agent=agent(i), messages=[("user", QUESTIONS[i % len(QUESTIONS)])],
                           max_tokens=max_tokens, sampling={"temperature": 0.0})[0]  # fmt: skip
            last = None
            for ev in c.stream(job.id):
                now = time.perf_counter()
                k = len(ev.token_ids)
                if k:
                    if last is None:
                        ttft.append(now - t0)
                        k -= 1
                    if k and last is not None:
                        itl.extend([(now - last) / k] * k)
                    last = now
                tokens[i] += len(ev.token_ids)
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(f"{type(e).__name__}: {e}")

    wall = _run_clients(n, one)
    c.close()
    return _summary(sum(tokens), wall, ttft, itl, errors)


def _warm_agent(i: int) -> str:
    return f"w-{WARM + i}"


def in_child(fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Runs a client set in its own process: its threads parse streams without taking the server's GIL."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, args, kwargs)  # type: ignore[no-any-return]


def through_server(n: int, kv: str, threads: int, max_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=0, http_port=0, token=TOKEN, out_root=Path("/tmp/kvswarm-bench-http"),
                echo=lambda m: None, limits=Limits(max_streams_per_client=n + 8), max_workers=4 * n + 64)  # fmt: skip
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(config(n, kv, threads, max_tokens))
            in_child(over_http, srv.http.url, WARM, 4, agent="w-{}".format)
            in_child(over_grpc, srv.target, WARM, 4, agent=_warm_agent)
            http = in_child(over_http, srv.http.url, n, max_tokens)
            grpc_ = in_child(over_grpc, srv.target, n, max_tokens)
            c.stop("load")
    finally:
        srv.stop()
        scheduler.disconnect(conn)
    return http, grpc_


# An array that never closes: every sequence decodes its full max_tokens under the grammar.
ENDLESS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}}


def constrained_cost(batch: int, kv: str, threads: int, steps: int, repeats: int = 3) -> dict[str, Any]:
    """Seconds per batch step, free and with every sequence constrained (mask after each step)."""
    eng = Engine(kv_k=kv, kv_v=kv, threads=threads, max_batch_tokens=512)
    tok = eng.tokenizer
    grammars = Grammars(tok, int(eng.config["n_vocab"]))
    grammar = gr.schema_grammar(ENDLESS, "bench")
    msgs = [{"role": "user", "content": "List some numbers as a JSON array."}]
    prompt = tok.encode(tok.render_chat(msgs, add_generation_prompt=True))

    def run(constrained: bool) -> tuple[float, float]:
        sp = Sampling(temperature=1.0, seed=1, max_new_tokens=steps + 1)
        seqs = [eng.add_sequence(prompt, sp) for _ in range(batch)]
        matchers = {}
        if constrained:
            for s in seqs:
                matchers[s] = grammars.matcher(grammar)
                eng.set_token_mask(s, grammars.mask(matchers[s]))
        eng.step()  # the prefill (and first token) is not a decode step
        mask_s, t0 = 0.0, time.perf_counter()
        for _ in range(steps):
            out = eng.step()
            t1 = time.perf_counter()
            for s, t in out.items():
                if s in matchers:
                    grammars.advance(matchers[s], t)
                    eng.set_token_mask(s, grammars.mask(matchers[s]))
            mask_s += time.perf_counter() - t1
        per_step = (time.perf_counter() - t0) / steps
        for s in seqs:
            eng.free(s)
        return per_step, mask_s / steps

    run(True)  # warm-up: caches, pages, the grammar compiled once
    free: list[float] = []
    con: list[float] = []
    masks: list[float] = []
    for _ in range(repeats):  # alternated, so a busy machine's drift hits both alike; medians below
        free.append(run(False)[0])
        step_s, mask_s = run(True)
        con.append(step_s)
        masks.append(mask_s)
    f, c, m = pct(free, 50), pct(con, 50), pct(masks, 50)
    # The work constraining adds is the mask time between steps (the masked sampling in the step is a copy of
    # the logits); its share of a constrained step does not depend on how busy the machine is.
    return {"batch": batch, "steps": steps, "repeats": repeats, "free_step_s": f, "free_runs_s": free,
            "constrained_step_s": c, "constrained_runs_s": con, "mask_s_per_step": m,
            "slowdown": c / f - 1, "mask_share": m / c}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="sequences in the constrained-decoding batch")
    ap.add_argument("--steps", type=int, default=48, help="decode steps timed per run of that batch")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    http, grpc_ = through_server(args.jobs, args.kv, args.threads, args.max_tokens)
    eng = direct(args.jobs, args.kv, args.threads, args.max_tokens)
    cost = constrained_cost(args.batch, args.kv, args.threads, args.steps)
    load_after = os.getloadavg()
    print(f"{args.jobs} concurrent streaming chat completions, {args.max_tokens} new tokens each, KV {args.kv}, "
          f"{args.threads} threads, load average {load_before[0]:.2f} before / {load_after[0]:.2f} after, "
          f"{time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"{'':<22}{'tokens/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}{'errors':>8}")
    for name, r in (("HTTP (OpenAI API)", http), ("gRPC API", grpc_), ("engine directly", eng)):
        print(f"{name:<22}{r['tokens_per_s']:>10.1f}{r['ttft_p50_s'] * 1e3:>8.0f}ms{r['ttft_p99_s'] * 1e3:>8.0f}ms"
              f"{r['itl_p50_s'] * 1e3:>8.1f}ms{r['itl_p99_s'] * 1e3:>8.1f}ms{r.get('n_errors', 0):>8}")  # fmt: skip
    print(f"HTTP / gRPC throughput {http['tokens_per_s'] / grpc_['tokens_per_s']:.2f}x, HTTP / engine "
          f"{http['tokens_per_s'] / eng['tokens_per_s']:.2f}x")  # fmt: skip
    print(f"constrained decoding, batch {cost['batch']} (median of {cost['repeats']}): "
          f"{cost['constrained_step_s'] * 1e3:.1f} ms per step vs {cost['free_step_s'] * 1e3:.1f} ms free "
          f"({cost['slowdown'] * 100:+.1f}% per token; goal < +10%); the masks take "
          f"{cost['mask_s_per_step'] * 1e3:.2f} ms per step, {cost['mask_share'] * 100:.1f}% of it")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "http": http, "grpc": grpc_, "direct": eng,
                                               "constrained": cost, "loadavg": [load_before, load_after],
                                               "python": sys.version.split()[0]}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
