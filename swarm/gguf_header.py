"""Model geometry from a GGUF header, in pure Python (no engine import).

The planner needs only the header: layer and head counts, the maximum context
and the bytes of every tensor. The file is untrusted input: every count and
length is checked against the bytes left before it is used.

GGUF layout (v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor
count, u64 metadata count, metadata (key string, u32 type, value), then tensor
infos (name string, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.errors import ModelFileError
from swarm.planner import ModelGeometry
from swarm.planner.geometry import LayerKV
from worker.models import attention_layout

# ggml type id -> (name, elements per block, bytes per block), from ggml's type table.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),  # f16 scale + 16 bytes of nibbles
    3: ("Q4_1", 32, 20),  # f16 scale + f16 min + 16 bytes
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),  # f16 scale + 32 int8
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
}
# ggml type id -> (elements per block, bytes per block)
GGML_BLOCKS: dict[int, tuple[int, int]] = {t: (n, b) for t, (_, n, b) in GGML_TYPES.items()}

# metadata value type -> struct format of a scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Matmul weights of one layer: what one decode step streams (the engine's rule); a layer has
# attention and either a dense FFN (ffn_*) or routed experts (ffn_*_exps, read per routed expert),
# optionally a router (ffn_gate_inp) and shared experts (ffn_*_shexp).
_ATTN_MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output")
_DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")
_SHARED_MATMULS = ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
_EXPERT_MATMULS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# Scalar arrays of at most this many items are kept (per-layer values such as head_count_kv).
_MAX_KEPT_ARRAY = 4096


class _Reader:
    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(
            f"{self.path}: {what} at byte {self.pos} (file is {len(self.buf)} bytes). "
            "To fix: the file is truncated or not GGUF; download it again or pass another --model"
        )

    def take(self, n: int) -> bytes:
        if n < 0 or n > len(self.buf) - self.pos:
            raise self.fail(f"a field of {n} bytes runs past the end")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail("a string is not UTF-8") from e

    def skip_string(self) -> None:
        n = self.scalar("<Q")
        if n > len(self.buf) - self.pos:
            raise self.fail(f"a string of {n} bytes runs past the end")
        self.pos += n

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype])
                if count > (len(self.buf) - self.pos) // size:
                    raise self.fail(f"an array of {count} items runs past the end")
                if keep and count <= _MAX_KEPT_ARRAY:  # per-layer values; token scores and types are skipped
                    fmt = _SCALARS[etype]
                    return [struct.unpack_from(fmt, self.take(size))[0] for _ in range(count)]
                self.pos += count * size
                return None
            if etype == _STRING:
                if count > len(self.buf) - self.pos:  # every string takes at least its 8-byte length
                    raise self.fail(f"an array of {count} strings runs past the end")
                for _ in range(count):
                    self.skip_string()
                return None
            raise self.fail(f"array element type {etype} is not a GGUF scalar or string type")
        raise self.fail(f"metadata value type {vtype} is unknown")


@dataclass(frozen=True)
class TensorInfo:
    ggml_type: int
    dims: tuple[int, ...]  # innermost first
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True)
class Header:
    """A GGUF file's metadata and tensor table (no tensor data)."""

    path: Path
    version: int
    file_bytes: int
    metadata: dict[str, Any]  # strings and scalars; scalar arrays of <= _MAX_KEPT_ARRAY items; else None
    tensors: dict[str, TensorInfo]


def read_header(path: str | Path) -> Header:
    """Reads a GGUF file's header without loading its tensors (the file is untrusted: every length is checked)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file. To fix: pass the path of a .gguf file")
    size = path.stat().st_size
    if size < 24:  # magic, version, two counts (and mmap refuses an empty file)
        raise ModelFileError(f"{path}: truncated ({size} bytes, no GGUF header). To fix: download it again")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf, path)
        if r.take(4) != b"GGUF":
            raise ModelFileError(f"{path}: not a GGUF file (bad magic). To fix: pass a .gguf model file")
        version = r.scalar("<I")
        if version not in (2, 3):
            raise ModelFileError(f"{path}: GGUF version {version} is not supported (2 or 3). To fix: convert it again")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        if n_tensors > len(buf) or n_kv > len(buf):
            raise r.fail(f"counts {n_tensors} tensors / {n_kv} metadata entries are larger than the file")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("<I")
            meta[key] = r.value(vtype, keep=True)
        tensors: dict[str, TensorInfo] = {}
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            if n_dims > 4:
                raise r.fail(f"tensor '{name}' has {n_dims} dimensions (at most 4)")
            dims = tuple(r.scalar("<Q") for _ in range(n_dims))
            ggml_type = r.scalar("<I")
            r.scalar("<Q")  # data offset
            if ggml_type not in GGML_TYPES:
                raise r.fail(f"tensor '{name}' has unknown ggml type {ggml_type}")
            _, block, block_bytes = GGML_TYPES[ggml_type]
            n = math.prod(dims)
            if n % block:
                raise r.fail(f"tensor '{name}' has {n} elements, not a multiple of its block of {block}")
            nbytes = n // block * block_bytes
            if nbytes > len(buf):
                raise r.fail(f"tensor '{name}' claims {nbytes} bytes, more than the file")
            tensors[name] = TensorInfo(ggml_type, dims, nbytes)
    return Header(path, version, size, meta, tensors)


def read_geometry(path: str | Path) -> ModelGeometry:
    """Reads the geometry of a GGUF model (llama, qwen2, qwen3, qwen3moe, gemma3, ...) without loading it."""
    return geometry_of(read_header(path))


def geometry_of(h: Header) -> ModelGeometry:
    path, meta, tensors = h.path, h.metadata, h.tensors
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: metadata lacks general.architecture. To fix: use a llama.cpp-converted GGUF")

    def need(key: str) -> int:
        v = meta.get(f"{arch}.{key}")
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelFileError(f"{path}: metadata {arch}.{key} is missing or not a positive integer ({v!r})")
        return v

    def count(key: str) -> int:  # an optional count: 0 when absent
        v = meta.get(f"{arch}.{key}", 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ModelFileError(f"{path}: metadata {arch}.{key} is not a non-negative integer ({v!r})")
        return v

    n_embd, n_layer = need("embedding_length"), need("block_count")
    heads = meta.get(f"{arch}.attention.head_count")  # one count, or one per layer
    n_head = max(heads) if isinstance(heads, list) and heads else need("attention.head_count")
    try:
        layout = attention_layout(meta, n_layer)
    except ValueError as e:
        raise ModelFileError(f"{path}: {e}") from None
    if "token_embd.weight" not in tensors or len(tensors["token_embd.weight"].dims) != 2:
        raise ModelFileError(f"{path}: a 2-D tensor token_embd.weight (n_embd, n_vocab) is missing")
    n_expert, n_used = count("expert_count"), count("expert_used_count")
    output = tensors.get("output.weight", tensors["token_embd.weight"])
    stream, expert_bytes = output.nbytes, 0
    for layer in range(n_layer):
        p = f"blk.{layer}."
        for m in _ATTN_MATMULS:
            if p + m + ".weight" not in tensors:
                raise ModelFileError(f"{path}: tensor {p}{m}.weight is missing")
        experts = [tensors.get(p + m + ".weight") for m in _EXPERT_MATMULS]
        dense = [tensors.get(p + m + ".weight") for m in _DENSE_FFN]
        present = [t for t in experts if t is not None]
        if len(present) == len(experts) and n_expert:
            for t in present:
                if t.nbytes % n_expert:
                    raise ModelFileError(f"{path}: {p}ffn_*_exps bytes are not a multiple of {n_expert} experts")
                expert_bytes += t.nbytes // n_expert
        elif any(t is None for t in dense[1:]):
            missing = next(m for m, t in zip(_DENSE_FFN, dense, strict=True) if t is None and m != "ffn_gate")
            raise ModelFileError(f"{path}: tensor {p}{missing}.weight is missing (and no experts ffn_*_exps)")
        stream += sum(t.nbytes for t in dense if t is not None)
        stream += sum(tensors[p + m + ".weight"].nbytes for m in (*_ATTN_MATMULS, *_SHARED_MATMULS)
                      if p + m + ".weight" in tensors)  # fmt: skip
    if expert_bytes and not 0 < n_used <= n_expert:
        raise ModelFileError(f"{path}: {arch}.expert_used_count {n_used!r} is not in 1..{n_expert}")
    ff = meta.get(f"{arch}.feed_forward_length")  # may be a per-layer list: the widest
    ff = max(ff) if isinstance(ff, list) and ff and all(isinstance(x, int) for x in ff) else ff
    ff_exp = count("expert_feed_forward_length")
    if expert_bytes and not ff_exp:  # the width from the tensor: ffn_gate_exps (n_embd, n_ff_exp, E)
        ff_exp = next(t.dims[1] for name, t in tensors.items() if name.endswith(".ffn_gate_exps.weight"))
    n_ff = max(ff if isinstance(ff, int) else 0, n_used * ff_exp if expert_bytes else 0)
    if n_ff <= 0:
        raise ModelFileError(f"{path}: metadata {arch}.feed_forward_length is missing or not a positive integer")
    layers = tuple(LayerKV(*row) for row in layout)
    uniform = all(lk == LayerKV(layers[0].n_kv_head, layers[0].key_dim, layers[0].key_dim) for lk in layers)
    return ModelGeometry(
        name=str(meta.get("general.name") or path.stem),
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=max(lk.n_kv_head for lk in layers),
        head_dim=layers[0].key_dim,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=tensors["token_embd.weight"].dims[1],
        n_ctx=need("context_length"),
        weight_stream_bytes=stream + n_used * expert_bytes,
        resident_bytes=sum(t.nbytes for t in tensors.values()),
        layers=() if uniform else layers,
        expert_count=n_expert if expert_bytes else 0,
        expert_used_count=n_used if expert_bytes else 0,
        expert_bytes=expert_bytes,
        expert_ff=ff_exp if expert_bytes else 0,
        architecture=arch,
    )
