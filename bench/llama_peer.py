"""llama.cpp side of bench/decode.py and bench/aggregate.py, run in an interpreter
that has llama-cpp-python, as a small server that bench/peer.py drives over pipes.

Imports nothing from kvswarm so it can run in a separate environment. One JSON
request per stdin line, one reply per stdout line prefixed with REPLY (llama.cpp
may write its own lines):

    {"op": "version"}                             -> {"version": "0.3.36"}
    {"op": "open", "id": "fa=1", "mode": "decode", "model": PATH, ...}
        -> {"ok": true, "extra_bufts": true, "probe": "exit status 0"} | {"error": "..."}
    {"op": "measure", "id": "fa=1"}  -> {"tokens_per_s": ..., ...} | {"error": "..."}
    {"op": "close"}                  -> {"ok": true} (closes every open case)

"open" builds the contexts of one configuration and fills their caches once;
each "measure" rewinds the caches to the filled state and times one sample, so
bench/peer.py can alternate our samples with llama.cpp's without refilling 8k
contexts each time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import llama_cpp

REPLY = "@@peer "
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}


def prompt_tokens(seq: int, n: int) -> list[int]:
    """The synthetic prompt bench/decode.py and bench/aggregate.py give both engines."""
    return [(17 * seq + 31 * i) % 40000 + 100 for i in range(n)]


class Context:
    """One llama_context with a batch of room for n_batch tokens."""

    def __init__(self, model: Any, cfg: dict[str, Any], n_ctx: int, n_batch: int, n_seq: int, unified: bool) -> None:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_batch
        p.n_seq_max = n_seq
        p.n_threads = cfg["threads"]
        p.n_threads_batch = cfg["threads"]
        p.type_k = GGML_TYPE[cfg["kv"]]
        p.type_v = GGML_TYPE[cfg["kv"]]
        p.flash_attn_type = 1 if cfg["flash_attn"] else 0
        p.kv_unified = unified
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:  # e.g. a quantized V cache without flash attention
            raise RuntimeError("llama.cpp refused this context configuration")
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq)

    def submit(self, tokens: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode over (token, position, sequence id, want logits) rows."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, (tok, pos, seq, want) in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = want
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def prefill(self, seq: int, tokens: list[int], start: int = 0) -> None:
        """tokens at positions start.. of seq, n_batch at a time, logits for the last one only."""
        for at in range(0, len(tokens), self.n_batch):
            chunk = tokens[at : at + self.n_batch]
            last = at + len(chunk) == len(tokens)
            self.submit([(t, start + at + i, seq, last and i == len(chunk) - 1) for i, t in enumerate(chunk)])

    def rewind(self, seq: int, pos: int) -> None:
        """Drop seq's cells at positions >= pos."""
        if not llama_cpp.llama_memory_seq_rm(self.mem, seq, pos, -1):
            raise RuntimeError(f"llama_memory_seq_rm(seq {seq}, from {pos}) refused")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


class DecodeCase:
    """Single-sequence decode of n_decode tokens (after one untimed step, as ours) on
    `depth` cached positions, and prefill of a fresh prefill_len-token prompt (its own context)."""

    def __init__(self, model: Any, cfg: dict[str, Any]) -> None:
        self.n_decode, self.prefill_len = cfg["n_decode"], cfg["prefill_len"]
        self.filled = max(cfg["depth"], 1)
        # The smallest context that holds the run: llama.cpp's cost can grow with n_ctx.
        self.deep = Context(model, cfg, self.filled + 1 + self.n_decode + 64, 512, 1, True)
        try:
            self.fresh = Context(model, cfg, self.prefill_len + 64, 512, 1, True)
            self.deep.prefill(0, prompt_tokens(0, self.filled))
        except Exception:
            self.deep.close()
            raise

    def measure(self) -> dict[str, float]:
        self.deep.rewind(0, self.filled)
        self.deep.submit([(504, self.filled, 0, True)])  # untimed first step
        t0 = time.perf_counter()
        for i in range(self.n_decode):
            self.deep.submit([(504, self.filled + 1 + i, 0, True)])
        decode_s = time.perf_counter() - t0
        llama_cpp.llama_memory_clear(self.fresh.mem, True)
        t0 = time.perf_counter()
        self.fresh.prefill(0, prompt_tokens(0, self.prefill_len))
        prefill_s = time.perf_counter() - t0
        return {"tokens_per_s": self.n_decode / decode_s, "prefill_tokens_per_s": self.prefill_len / prefill_s}

    def close(self) -> None:
        self.deep.close()
        self.fresh.close()


def sampler_chain(sampling: dict[str, Any], seed: int) -> Any:
    """llama.cpp's sampler chain for one sequence: top-k (when > 0), top-p (when < 1), temperature, then
    a seeded draw from the softmax (llama.cpp's own order for these samplers)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if sampling.get("top_k", 0) > 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(sampling["top_k"]))
    if sampling.get("top_p", 1.0) < 1.0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(sampling["top_p"], 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(sampling["temperature"]))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain


class AggregateCase:
    """n_seq sequences of prompt_len-token prompts; each sample times n_new steps (after
    one untimed step, as ours) of one llama_decode over a batch holding one token of
    every sequence id. With cfg["sampling"] ({"temperature", "top_k", "top_p"}) each
    sequence's next token is drawn by its own sampler chain from its row of logits and
    fed back; without, every step feeds fixed tokens (no sampling on either side)."""

    def __init__(self, model: Any, cfg: dict[str, Any]) -> None:
        self.n_seq, self.prompt_len, self.n_new = cfg["n_seq"], cfg["prompt_len"], cfg["n_new"]
        # kv_unified=True: one cache that every sequence's attention spans (masked);
        # False: one cache stream per sequence (n_ctx split evenly between them).
        per_seq = self.prompt_len + 1 + self.n_new + 64
        self.c = Context(model, cfg, self.n_seq * per_seq, max(self.prompt_len, self.n_seq), self.n_seq, cfg["unified"])
        for s in range(self.n_seq):
            self.c.prefill(s, prompt_tokens(s, self.prompt_len))
        sampling = cfg.get("sampling")
        self.chains = [sampler_chain(sampling, s) for s in range(self.n_seq)] if sampling else []

    def next_tokens(self) -> list[int]:
        if not self.chains:
            return [504 + s for s in range(self.n_seq)]
        return [llama_cpp.llama_sampler_sample(ch, self.c.ctx, s) for s, ch in enumerate(self.chains)]

    def measure(self) -> dict[str, float]:
        for s in range(self.n_seq):
            self.c.rewind(s, self.prompt_len)
        self.c.submit([(504 + s, self.prompt_len, s, True) for s in range(self.n_seq)])  # untimed first step
        t0 = time.perf_counter()
        for step in range(1, self.n_new + 1):
            toks = self.next_tokens()
            self.c.submit([(toks[s], self.prompt_len + step, s, True) for s in range(self.n_seq)])
        dt = time.perf_counter() - t0
        return {"tokens_per_s": self.n_seq * self.n_new / dt}

    def close(self) -> None:
        for ch in self.chains:
            llama_cpp.llama_sampler_free(ch)
        self.c.close()


CASES = {"decode": DecodeCase, "aggregate": AggregateCase}


def probe(path: str) -> int:
    """A 512-token prefill and a 16-sequence step with llama.cpp's default model parameters (its extra
    weight buffer types on: AMX tiles, repacked rows). Run in a child process by extra_bufts_work."""
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    if not model:
        return 2
    c = Context(model, {"threads": 2, "kv": "f16", "flash_attn": False}, 1024, 512, 16, True)
    c.prefill(0, prompt_tokens(0, 512))
    c.submit([(100 + s, 512 if s == 0 else 0, s, True) for s in range(16)])
    c.close()
    llama_cpp.llama_model_free(model)
    return 0


def extra_bufts_work(path: str) -> tuple[bool, str]:
    """Whether llama.cpp survives its extra weight buffer types on this machine and file, and if not
    how the probe ended. ggml 0.25.3 built for a CPU with AMX-INT8 (a Xeon VM, 2026-12-07) died of
    SIGSEGV in its first 512-token prefill with them on and ran with them off, so the peer keeps them
    (its best settings) only where a child process has run a prefill with them."""
    try:
        r = subprocess.run([sys.executable, __file__, "--probe", path], capture_output=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "the probe ran past 600 s"
    return r.returncode == 0, f"exit status {r.returncode}"


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(REPLY + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    if sys.argv[1:2] == ["--probe"]:
        sys.exit(probe(sys.argv[2]))
    llama_cpp.llama_backend_init()
    models: dict[str, Any] = {}  # {path: llama_model*}, loaded once
    extra: dict[str, tuple[bool, str]] = {}  # {path: extra_bufts_work(path)}
    cases: dict[str, DecodeCase | AggregateCase] = {}  # {request id: open case}, filled once, measured often
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "version":
                reply({"version": llama_cpp.__version__})
            elif op == "open":
                if req["model"] not in models:
                    extra[req["model"]] = extra_bufts_work(req["model"])
                    mparams = llama_cpp.llama_model_default_params()
                    mparams.use_extra_bufts = extra[req["model"]][0]
                    models[req["model"]] = llama_cpp.llama_model_load_from_file(req["model"].encode(), mparams)
                cases[req["id"]] = CASES[req["mode"]](models[req["model"]], req)
                works, how = extra[req["model"]]
                reply({"ok": True, "extra_bufts": works, "probe": how})
            elif op == "measure":
                reply(cases[req["id"]].measure())
            elif op == "close":
                for c in cases.values():
                    c.close()
                cases.clear()
                reply({"ok": True})
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # a configuration llama.cpp refuses: reported, the server goes on
            reply({"error": str(e) or type(e).__name__})
    for c in cases.values():
        c.close()
    for m in models.values():
        llama_cpp.llama_model_free(m)


if __name__ == "__main__":
    main()
