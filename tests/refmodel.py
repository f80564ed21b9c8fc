"""Independent float64 reference for tiny Llama-architecture GGUF models.

This module is test infrastructure only.  It does three things, none of which
touch the kvswarm engine:

* ``write_tiny_llama`` writes a small random Llama model as a GGUF v3 file
  (through ``gguf.GGUFWriter``), with the 2-D weights stored in one of
  F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1.
* ``load_reference`` reads such a file back with ``gguf.GGUFReader`` and
  dequantizes every tensor to float64 with ``gguf.quants.dequantize``.
* ``RefModel.forward`` runs the Llama forward pass in float64 numpy and returns
  the logits at every position.  An optional ``kv_roundtrip`` hook applies a
  lossy transform to every cached K/V vector, and the ``rt_*`` helpers below
  emulate the KV storage formats the engine may use.

Shape conventions
-----------------
GGUF lists a tensor's dimensions as ``[ne0, ne1]`` with ``ne0`` the contiguous
(input) dimension.  The numpy arrays handed to the writer and obtained from the
reader are row-major with shape ``(ne1, ne0)``, i.e. ``(out_features,
in_features)`` for a projection matrix.  A projection is therefore applied as
``y = x @ W.T``.  In the comments below:

    T    number of tokens            E    n_embd
    H    n_head                      Hkv  n_head_kv
    D    head_dim = E // H           F    n_ff
    V    vocab size
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

__all__ = [
    "WEIGHT_TYPES",
    "KVRoundtrip",
    "LayerWeights",
    "RefModel",
    "load_reference",
    "rms_norm",
    "rope_normal",
    "rt_f16",
    "rt_q4_0",
    "rt_q8_0",
    "rt_q8_act",
    "rt_q8_query_head",
    "rt_q8_head",
    "silu",
    "tiny_llama_weights",
    "write_tiny_llama",
]

# Storage types accepted for the 2-D matrices (1-D norm weights are always F32).
WEIGHT_TYPES: dict[str, gguf.GGMLQuantizationType] = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "BF16": gguf.GGMLQuantizationType.BF16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
}

# general.file_type value matching each weight type (informational only).
_FILE_TYPES: dict[str, int] = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
}

# A per-vector transform (D,) float64 -> (D,) float64.
VecFn = Callable[[np.ndarray], np.ndarray]
# (fk, fv): applied to each token's post-RoPE K vector and V vector, per kv head.
KVRoundtrip = tuple[VecFn, VecFn]


# ---------------------------------------------------------------------------
# Writing a tiny random model
# ---------------------------------------------------------------------------


def tiny_llama_weights(
    *,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    vocab: int,
    tied: bool,
    seed: int,
) -> dict[str, np.ndarray]:
    """The float32 weights write_tiny_llama stores (before quantization).

    Returns GGUF tensor name -> float32 array, numpy shape (ne1, ne0) for
    matrices and (ne0,) for norm weights, in file order.
    """
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        # numpy (n_out, n_in) == GGUF [n_in, n_out]; std gain/sqrt(fan_in)
        return rng.normal(0.0, gain / np.sqrt(n_in), size=(n_out, n_in)).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        # (n,) weights around 1
        return (1.0 + 0.1 * rng.normal(size=n)).astype(np.float32)

    # Embedding rows have norm ~2.5, so with a tied output (and output_norm ~1,
    # normed activations of norm sqrt(E)) the logits have std ~2.5 and |max| ~10:
    # informative without saturating the softmax.  All other projections use
    # std 1/sqrt(fan_in), which keeps the residual stream O(1) over the layers.
    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = rng.normal(0.0, 2.5 / np.sqrt(n_embd), size=(vocab, n_embd)).astype(np.float32)  # (V, E)
    for il in range(n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm_w(n_embd)  # (E,)
        w[p + "attn_q.weight"] = mat(n_head * head_dim, n_embd)  # (H*D, E)
        w[p + "attn_k.weight"] = mat(n_head_kv * head_dim, n_embd)  # (Hkv*D, E)
        w[p + "attn_v.weight"] = mat(n_head_kv * head_dim, n_embd)  # (Hkv*D, E)
        w[p + "attn_output.weight"] = mat(n_embd, n_head * head_dim)  # (E, H*D)
        w[p + "ffn_norm.weight"] = norm_w(n_embd)  # (E,)
        w[p + "ffn_gate.weight"] = mat(n_ff, n_embd)  # (F, E)
        w[p + "ffn_up.weight"] = mat(n_ff, n_embd)  # (F, E)
        w[p + "ffn_down.weight"] = mat(n_embd, n_ff)  # (E, F)
    w["output_norm.weight"] = norm_w(n_embd)  # (E,)
    if not tied:
        w["output.weight"] = mat(vocab, n_embd, gain=2.5)  # (V, E)
    return w


def write_tiny_llama(
    path: str | Path,
    *,
    weight_type: str = "F32",
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 160,
    vocab: int = 257,
    context_length: int = 256,
    rope_base: float = 10000.0,
    eps: float = 1e-5,
    tied: bool = True,
    seed: int = 0,
    arch: str = "llama",
) -> dict[str, Any]:
    """Write a random Llama-architecture GGUF v3 file and return its hyper-parameters.

    Every 2-D matrix is stored as ``weight_type``; norm weights are F32.  With
    ``tied=True`` no ``output.weight`` is written and the output projection is
    ``token_embd.weight``.  The same ``seed`` always yields the same weights
    (before quantization), whatever ``weight_type`` is.
    """
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {sorted(WEIGHT_TYPES)}, got {weight_type!r}")
    if n_embd % n_head != 0:
        raise ValueError("n_embd must be divisible by n_head")
    if n_head % n_head_kv != 0:
        raise ValueError("n_head must be divisible by n_head_kv")
    head_dim = n_embd // n_head
    if head_dim % 2 != 0:
        raise ValueError("head_dim must be even for RoPE")
    qtype = WEIGHT_TYPES[weight_type]
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    # Every matrix's contiguous dim (ne0) is n_embd, n_head*head_dim (== n_embd) or n_ff.
    for name, ne0 in (("n_embd", n_embd), ("n_ff", n_ff)):
        if ne0 % block_size != 0:
            raise ValueError(f"{name}={ne0} is not a multiple of the {weight_type} block size {block_size}")

    weights = tiny_llama_weights(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        vocab=vocab,
        tied=tied,
        seed=seed,
    )

    writer = gguf.GGUFWriter(str(path), arch)  # also writes general.architecture
    writer.add_name(f"kvswarm-tiny-{arch}-{weight_type}")
    writer.add_file_type(int(_FILE_TYPES[weight_type]))
    writer.add_block_count(n_layer)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_freq_base(float(rope_base))
    writer.add_layer_norm_rms_eps(float(eps))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)

    for name, arr in weights.items():
        if arr.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, arr)
        else:
            # F16 comes back as a float16 array of the logical shape; BF16 and the
            # block formats come back as uint8 of shape (ne1, bytes_per_row).  With
            # raw_dtype set, add_tensor converts a uint8 byte shape back to the
            # logical shape for the tensor info, so no raw_shape is needed.
            data = quantize(arr, qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    return {
        "arch": arch,
        "weight_type": weight_type,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": head_dim,
        "n_rot": head_dim,
        "n_ff": n_ff,
        "vocab": vocab,
        "context_length": context_length,
        # stored as float32 in the file; return the values the reader will see
        "rope_base": float(np.float32(rope_base)),
        "eps": float(np.float32(eps)),
        "tied": tied,
        "seed": seed,
    }


# ---------------------------------------------------------------------------
# Reading the model back
# ---------------------------------------------------------------------------


def _field_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """Scalar or string value of a GGUF metadata key (``default`` if absent)."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


@dataclass
class LayerWeights:
    """Dequantized float64 weights of one transformer block."""

    attn_norm: np.ndarray  # (E,)
    wq: np.ndarray  # (H*D, E)
    wk: np.ndarray  # (Hkv*D, E)
    wv: np.ndarray  # (Hkv*D, E)
    wo: np.ndarray  # (E, H*D)
    ffn_norm: np.ndarray  # (E,)
    w_gate: np.ndarray  # (F, E)
    w_up: np.ndarray  # (F, E)
    w_down: np.ndarray  # (E, F)


def load_reference(path: str | Path) -> RefModel:
    """Read a Llama GGUF and dequantize every tensor to float64."""
    reader = gguf.GGUFReader(str(path))
    arch = _field_value(reader, "general.architecture")
    if arch is None:
        raise ValueError(f"{path}: missing general.architecture")

    # name -> float64 array shaped (ne1, ne0) (or (ne0,) for 1-D tensors)
    tensors: dict[str, np.ndarray] = {}
    # name -> GGML type name, e.g. "Q4_0"
    tensor_types: dict[str, str] = {}
    for t in reader.tensors:
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        # t.data is the raw storage: (ne1, ne0) for F32/F16, uint8 (ne1, row_bytes)
        # for BF16 and block formats; dequantize returns the logical (ne1, ne0).
        logical_shape = tuple(int(d) for d in reversed(t.shape))
        arr = np.asarray(dequantize(t.data, qtype), dtype=np.float64).reshape(logical_shape)
        tensors[t.name] = arr
        tensor_types[t.name] = qtype.name

    n_embd = int(_field_value(reader, f"{arch}.embedding_length"))
    n_head = int(_field_value(reader, f"{arch}.attention.head_count"))
    head_dim = n_embd // n_head
    hparams: dict[str, Any] = {
        "arch": arch,
        "n_layer": int(_field_value(reader, f"{arch}.block_count")),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": int(_field_value(reader, f"{arch}.attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "n_rot": int(_field_value(reader, f"{arch}.rope.dimension_count", head_dim)),
        "n_ff": int(_field_value(reader, f"{arch}.feed_forward_length")),
        "vocab": int(_field_value(reader, f"{arch}.vocab_size", tensors["token_embd.weight"].shape[0])),
        "context_length": int(_field_value(reader, f"{arch}.context_length")),
        "rope_base": float(_field_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        "eps": float(_field_value(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "tied": "output.weight" not in tensors,
        "weight_type": tensor_types["token_embd.weight"],
    }
    return RefModel(hparams, tensors, tensor_types)


# ---------------------------------------------------------------------------
# Building blocks of the forward pass (float64)
# ---------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis.  x: (..., E), w: (E,)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def rope_normal(x: np.ndarray, pos: np.ndarray, base: float, n_rot: int | None = None) -> np.ndarray:
    """llama.cpp NORMAL (non-NEOX) RoPE: rotate adjacent pairs (x[2i], x[2i+1]).

    x: (T, nh, D); pos: (T,) integer positions.  Pair i (i < n_rot/2) is rotated
    by angle pos * base**(-2i/n_rot); dims >= n_rot pass through unchanged.
    """
    d = x.shape[-1]
    n_rot = d if n_rot is None else n_rot
    i = np.arange(n_rot // 2, dtype=np.float64)
    theta = np.asarray(pos, dtype=np.float64)[:, None] * base ** (-2.0 * i / n_rot)  # (T, n_rot/2)
    cos = np.cos(theta)[:, None, :]  # (T, 1, n_rot/2)
    sin = np.sin(theta)[:, None, :]
    x0 = x[..., 0:n_rot:2]  # (T, nh, n_rot/2)
    x1 = x[..., 1:n_rot:2]
    out = x.astype(np.float64, copy=True)
    out[..., 0:n_rot:2] = x0 * cos - x1 * sin
    out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def _per_vector(fn: VecFn, x: np.ndarray) -> np.ndarray:
    """Apply fn to every (D,) vector of x (T, nh, D), each given as its own copy."""
    out = np.empty(x.shape, dtype=np.float64)
    for j in range(x.shape[0]):
        for g in range(x.shape[1]):
            out[j, g] = np.asarray(fn(x[j, g].copy()), dtype=np.float64).reshape(x.shape[2])
    return out


# ---------------------------------------------------------------------------
# The reference model
# ---------------------------------------------------------------------------


class RefModel:
    """float64 Llama forward over dequantized GGUF weights.

    Attributes:
        hparams:      dict of hyper-parameters (keys as returned by write_tiny_llama).
        tensors:      GGUF tensor name -> float64 array, numpy shape (ne1, ne0).
        tensor_types: GGUF tensor name -> stored GGML type name ("F32", "Q4_0", ...).
        tok_embd:     (V, E) token embeddings.
        layers:       list of LayerWeights, one per block.
        output_norm:  (E,)
        output:       (V, E) output projection (tok_embd itself when tied).
    """

    def __init__(self, hparams: dict[str, Any], tensors: dict[str, np.ndarray], tensor_types: dict[str, str]) -> None:
        self.hparams = hparams
        self.tensors = tensors
        self.tensor_types = tensor_types
        self.n_layer: int = hparams["n_layer"]
        self.n_embd: int = hparams["n_embd"]
        self.n_head: int = hparams["n_head"]
        self.n_head_kv: int = hparams["n_head_kv"]
        self.head_dim: int = hparams["head_dim"]
        self.n_rot: int = hparams["n_rot"]
        self.eps: float = hparams["eps"]
        self.rope_base: float = hparams["rope_base"]
        self.vocab: int = hparams["vocab"]

        self.tok_embd = tensors["token_embd.weight"]
        self.layers = [
            LayerWeights(
                attn_norm=tensors[f"blk.{il}.attn_norm.weight"],
                wq=tensors[f"blk.{il}.attn_q.weight"],
                wk=tensors[f"blk.{il}.attn_k.weight"],
                wv=tensors[f"blk.{il}.attn_v.weight"],
                wo=tensors[f"blk.{il}.attn_output.weight"],
                ffn_norm=tensors[f"blk.{il}.ffn_norm.weight"],
                w_gate=tensors[f"blk.{il}.ffn_gate.weight"],
                w_up=tensors[f"blk.{il}.ffn_up.weight"],
                w_down=tensors[f"blk.{il}.ffn_down.weight"],
            )
            for il in range(self.n_layer)
        ]
        self.output_norm = tensors["output_norm.weight"]
        self.output = tensors.get("output.weight", self.tok_embd)

    # -- pieces ------------------------------------------------------------

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """(T,) token ids -> (T, E) embeddings."""
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("tokens must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise ValueError(f"token id out of range [0, {self.vocab})")
        return self.tok_embd[ids].copy()

    def qkv(
        self,
        il: int,
        h: np.ndarray,
        pos: np.ndarray,
        kv_roundtrip: KVRoundtrip | None = None,
        act: ActRoundtrip | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Projections for block il from normed input h (T, E).

        Returns q (T, H, D) and k (T, Hkv, D) after RoPE, and v (T, Hkv, D); k and v
        have been passed through kv_roundtrip (as stored in the KV cache).
        """
        lw = self.layers[il]
        t = h.shape[0]
        d = self.head_dim
        h = _act(act, h)
        q = (h @ lw.wq.T).reshape(t, self.n_head, d)
        k = (h @ lw.wk.T).reshape(t, self.n_head_kv, d)
        v = (h @ lw.wv.T).reshape(t, self.n_head_kv, d)
        q = rope_normal(q, pos, self.rope_base, self.n_rot)
        k = rope_normal(k, pos, self.rope_base, self.n_rot)
        if kv_roundtrip is not None:
            fk, fv = kv_roundtrip[0], kv_roundtrip[1]
            k = _per_vector(fk, k)
            v = _per_vector(fv, v)
            if len(kv_roundtrip) > 2:  # optional query transform (engines that quantize q for int8 keys)
                q = _per_vector(kv_roundtrip[2], q)
        return q, k, v

    def attention(
        self, il: int, h: np.ndarray, kv_roundtrip: KVRoundtrip | None = None, act: ActRoundtrip | None = None
    ) -> np.ndarray:
        """Causal GQA self-attention of block il for a prompt at positions 0..T-1.

        h: (T, E) normed input.  Returns the concatenated head outputs (T, H*D),
        i.e. the input of attn_output (before Wo).
        """
        t = h.shape[0]
        pos = np.arange(t)
        q, k, v = self.qkv(il, h, pos, kv_roundtrip, act)
        group = self.n_head // self.n_head_kv
        # query head hq reads kv head hq // group
        k = np.repeat(k, group, axis=1)  # (T, H, D)
        v = np.repeat(v, group, axis=1)  # (T, H, D)
        scores = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(self.head_dim)  # (H, Tq, Tk)
        causal = np.tril(np.ones((t, t), dtype=bool))
        scores = np.where(causal[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out = np.einsum("hij,jhd->ihd", p, v)  # (T, H, D)
        return out.reshape(t, self.n_head * self.head_dim)

    def ffn(self, il: int, h: np.ndarray, act: ActRoundtrip | None = None) -> np.ndarray:
        """SwiGLU feed-forward of block il.  h: (T, E) normed input -> (T, E)."""
        lw = self.layers[il]
        h = _act(act, h)
        return _act(act, silu(h @ lw.w_gate.T) * (h @ lw.w_up.T)) @ lw.w_down.T

    def block(
        self, il: int, x: np.ndarray, kv_roundtrip: KVRoundtrip | None = None, act: ActRoundtrip | None = None
    ) -> np.ndarray:
        """One transformer block on the residual stream x (T, E) -> (T, E)."""
        lw = self.layers[il]
        h = rms_norm(x, lw.attn_norm, self.eps)
        x = x + _act(act, self.attention(il, h, kv_roundtrip, act)) @ lw.wo.T
        h = rms_norm(x, lw.ffn_norm, self.eps)
        return x + self.ffn(il, h, act)

    def head(self, x: np.ndarray, act: ActRoundtrip | None = None) -> np.ndarray:
        """Final norm and output projection: (T, E) -> (T, V) logits."""
        return _act(act, rms_norm(x, self.output_norm, self.eps)) @ self.output.T

    # -- full pass ------------------------------------------------------------

    def forward(
        self, tokens: Sequence[int], kv_roundtrip: KVRoundtrip | None = None, act_roundtrip: ActRoundtrip | None = None
    ) -> np.ndarray:
        """Logits (T, V) float64 at every position of a prompt starting at position 0.

        kv_roundtrip = (fk, fv) transforms each token's post-RoPE K vector and its
        V vector, per kv head ((D,) -> (D,)), before attention uses them; an
        optional third callable transforms each query head vector.
        act_roundtrip transforms every matrix-product input (T, n) -> (T, n),
        emulating engines that quantize activations for integer dot products.
        """
        x = self.embed(tokens)  # (T, E)
        for il in range(self.n_layer):
            x = self.block(il, x, kv_roundtrip, act_roundtrip)
        return self.head(x, act_roundtrip)


# ---------------------------------------------------------------------------
# KV storage format emulation (for kv_roundtrip); input/output float64 (D,)
# ---------------------------------------------------------------------------


ActRoundtrip = Callable[[np.ndarray], np.ndarray]


def _act(act: ActRoundtrip | None, x: np.ndarray) -> np.ndarray:
    return x if act is None else act(x)


def rt_q8_act(x: np.ndarray) -> np.ndarray:
    """8-bit activation blocks along the last axis (a multiple of 32): d = max|x|/127
    in float32 (not rounded to f16), q = round-half-even(x/d), value q*d."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(*shape[:-1], shape[-1] // 32, 32)
    d = (np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint(b * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(shape)


def rt_q8_query_head(x: np.ndarray) -> np.ndarray:
    """One 8-bit scale for a whole query head vector (D,): s = max|x|/127 in float32,
    q = round-half-even(x/s), value q*s (queries scored against q8_head keys)."""
    xf = np.asarray(x, dtype=np.float32)
    s = np.float32(np.abs(xf).max() / np.float32(127))
    inv = np.float32(1) / s if s != 0 else np.float32(0)
    return np.rint(xf * inv).astype(np.float64) * np.float64(s)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C roundf: round to nearest, ties away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _blocks32(x: np.ndarray) -> np.ndarray:
    """(D,) -> float32 (D/32, 32); D must be a multiple of 32."""
    x = np.asarray(x, dtype=np.float32)
    if x.size % 32 != 0:
        raise ValueError(f"length {x.size} is not a multiple of the block size 32")
    return x.reshape(-1, 32)


def rt_f16(x: np.ndarray) -> np.ndarray:
    """Store as IEEE half (via the f32 activation) and read back."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def rt_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml Q8_0 round trip: per block of 32, d = amax/127, q = roundf(x/d), value = q*f16(d)."""
    shape = np.shape(x)
    b = _blocks32(x)  # (nb, 32) f32
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)  # (nb, 1)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.clip(_round_half_away(b * inv), -128, 127)  # int8 range
    d16 = d.astype(np.float16).astype(np.float64)  # scale as stored
    return (q.astype(np.float64) * d16).reshape(shape)


def rt_q4_0(x: np.ndarray) -> np.ndarray:
    """ggml Q4_0 round trip (same math as ggml / gguf.quants, in float32).

    Per block of 32: max = the element of largest |x| with its sign; d = max / -8;
    q = clamp(trunc(x/d + 8.5), 0, 15); value = (q - 8) * f16(d).
    """
    shape = np.shape(x)
    b = _blocks32(x)  # (nb, 32) f32
    imax = np.abs(b).argmax(axis=1)[:, None]
    mx = np.take_along_axis(b, imax, axis=1)  # (nb, 1) signed
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    # x*inv lies in [-8, 8] up to rounding, so x*inv + 8.5 >= 0 and trunc == floor
    q = np.clip(np.trunc((b * inv + np.float32(8.5)).astype(np.float32)), 0, 15)
    d16 = d.astype(np.float16).astype(np.float64)
    return ((q.astype(np.float64) - 8.0) * d16).reshape(shape)


def rt_q8_head(x: np.ndarray) -> np.ndarray:
    """One f32 scale per head vector: s = amax/127, q = round(x/s) in [-127, 127], value = q*s."""
    v = np.asarray(x, dtype=np.float32)
    s = np.float32(np.abs(v).max() / np.float32(127))
    if s == 0:
        return np.zeros(np.shape(x), dtype=np.float64)
    q = np.clip(_round_half_away(v / s), -127, 127)
    return q.astype(np.float64) * np.float64(s)
