"""llama.cpp side of bench/decode.py, run in an interpreter that has llama-cpp-python.

Prints one JSON object: {"version": ..., "results": [{case..., "tokens_per_s": ...}]}.
Imports nothing from kvswarm so it can run in a separate environment.
"""

from __future__ import annotations

import json
import sys
import time

import llama_cpp

GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}


def decode_rate(model: str, kv: str, flash: bool, depth: int, n_decode: int, threads: int) -> dict:
    def make(n_ctx: int) -> llama_cpp.Llama:
        return llama_cpp.Llama(
            model_path=model,
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            type_k=GGML_TYPE[kv],
            type_v=GGML_TYPE[kv],
            flash_attn=flash,
            verbose=False,
            logits_all=False,
        )

    # The smallest context that holds the run: llama.cpp's cost can grow with n_ctx.
    llm = make(depth + n_decode + 64)
    prompt = [(17 + 31 * i) % 40000 + 100 for i in range(max(depth, 1))]
    llm.eval(prompt)
    tok = 504
    t0 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    # Prefill rate of a fresh 512-token prompt.
    del llm
    llm = make(512 + 64)
    prompt = [(17 + 31 * i) % 40000 + 100 for i in range(512)]
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    return {
        "kv": kv,
        "flash_attn": flash,
        "depth": depth,
        "tokens_per_s": n_decode / decode_s,
        "prefill_tokens_per_s": 512 / prefill_s,
    }


def aggregate_rate(model: str, kv: str, flash: bool, n_seq: int, prompt_len: int, n_new: int, threads: int) -> dict:
    """One llama_decode per step over a batch holding one token of each sequence id."""
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mdl = llama_cpp.llama_model_load_from_file(model.encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_seq * (prompt_len + n_new) + 64
    cparams.n_batch = max(prompt_len, n_seq)
    cparams.n_ubatch = cparams.n_batch
    cparams.n_seq_max = n_seq
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.type_k = GGML_TYPE[kv]
    cparams.type_v = GGML_TYPE[kv]
    cparams.flash_attn_type = 1 if flash else 0
    cparams.kv_unified = True
    ctx = llama_cpp.llama_init_from_model(mdl, cparams)
    if not ctx:  # e.g. a quantized V cache without flash attention
        llama_cpp.llama_model_free(mdl)
        raise RuntimeError("llama.cpp refused this context configuration")
    batch = llama_cpp.llama_batch_init(cparams.n_batch, 0, n_seq)

    def submit(tokens: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(tokens)
        for i, (tok, pos, seq, want) in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = want
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    try:
        for s in range(n_seq):
            prompt = [(17 * s + 31 * i) % 40000 + 100 for i in range(prompt_len)]
            submit([(t, i, s, i == prompt_len - 1) for i, t in enumerate(prompt)])
        t0 = time.perf_counter()
        for step in range(n_new):
            submit([(504 + s, prompt_len + step, s, True) for s in range(n_seq)])
        dt = time.perf_counter() - t0
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(mdl)
    return {"kv": kv, "flash_attn": flash, "n_seq": n_seq, "tokens_per_s": n_seq * n_new / dt}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    out = []
    if cfg.get("mode") == "aggregate":
        for case in cfg["cases"]:
            try:
                out.append(
                    aggregate_rate(
                        cfg["model"],
                        case["kv"],
                        case["flash_attn"],
                        case["n_seq"],
                        cfg["prompt_len"],
                        cfg["n_new"],
                        cfg["threads"],
                    )
                )
            except Exception as e:
                out.append({**case, "error": str(e)})
        print(json.dumps({"version": llama_cpp.__version__, "results": out}))
        return
    for case in cfg["cases"]:
        print(f"llama.cpp case {case}", file=sys.stderr, flush=True)
        try:
            out.append(
                decode_rate(
                    cfg["model"], case["kv"], case["flash_attn"], case["depth"], cfg["n_decode"], cfg["threads"]
                )
            )
        except Exception as e:  # a configuration llama.cpp refuses (e.g. quantized V without flash attention)
            out.append({**case, "error": str(e)})
    print(json.dumps({"version": llama_cpp.__version__, "results": out}))


if __name__ == "__main__":
    main()
