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
    llm = llama_cpp.Llama(
        model_path=model, n_ctx=depth + n_decode + 64, n_batch=512, n_threads=threads, n_threads_batch=threads,
        type_k=GGML_TYPE[kv], type_v=GGML_TYPE[kv], flash_attn=flash, verbose=False, logits_all=False,
    )
    prompt = [(17 + 31 * i) % 40000 + 100 for i in range(max(depth, 1))]
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    tok = 504
    t0 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    return {"kv": kv, "flash_attn": flash, "depth": depth, "tokens_per_s": n_decode / decode_s,
            "prefill_tokens_per_s": len(prompt) / prefill_s}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    out = []
    for case in cfg["cases"]:
        try:
            out.append(decode_rate(cfg["model"], case["kv"], case["flash_attn"], case["depth"], cfg["n_decode"],
                                   cfg["threads"]))
        except Exception as e:  # a configuration llama.cpp refuses (e.g. quantized V without flash attention)
            out.append({**case, "error": str(e)})
    print(json.dumps({"version": llama_cpp.__version__, "results": out}))


if __name__ == "__main__":
    main()
