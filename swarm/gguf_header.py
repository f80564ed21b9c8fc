"""Model geometry from a GGUF header, in pure Python (no engine import).

The planner needs only the header: layer and head counts, the maximum context
and the bytes of every tensor. The file is untrusted input: every count and
length is checked against the bytes left before it is used.

GGUF layout (v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor
count, u64 metadata count, metadata (key string, u32 type, value), then tensor
infos (name string, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from swarm.errors import ModelFileError
from swarm.planner import ModelGeometry

# ggml type id -> (elements per block, bytes per block), from ggml's type table.
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0: f16 scale + 16 bytes of nibbles
    3: (32, 20),  # Q4_1: f16 scale + f16 min + 16 bytes
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0: f16 scale + 32 int8
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    30: (1, 2),  # BF16
}

# metadata value type -> struct format of a scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Matmul weights of one layer: what one decode step streams (the engine's rule).
_LAYER_MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


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
                self.pos += count * size  # arrays (token scores, types) are not needed for geometry
                return None
            if etype == _STRING:
                if count > len(self.buf) - self.pos:  # every string takes at least its 8-byte length
                    raise self.fail(f"an array of {count} strings runs past the end")
                for _ in range(count):
                    self.skip_string()
                return None
            raise self.fail(f"array element type {etype} is not a GGUF scalar or string type")
        raise self.fail(f"metadata value type {vtype} is unknown")


def read_geometry(path: str | Path) -> ModelGeometry:
    """Reads the geometry of a Llama-family GGUF model without loading it."""
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
        tensors: dict[str, int] = {}  # {name: bytes}
        shapes: dict[str, list[int]] = {}  # {name: dims, innermost first}
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            if n_dims > 4:
                raise r.fail(f"tensor '{name}' has {n_dims} dimensions (at most 4)")
            dims = [r.scalar("<Q") for _ in range(n_dims)]
            ggml_type = r.scalar("<I")
            r.scalar("<Q")  # data offset
            if ggml_type not in GGML_BLOCKS:
                raise r.fail(f"tensor '{name}' has unknown ggml type {ggml_type}")
            block, block_bytes = GGML_BLOCKS[ggml_type]
            n = 1
            for d in dims:
                n *= d
            if n % block:
                raise r.fail(f"tensor '{name}' has {n} elements, not a multiple of its block of {block}")
            nbytes = n // block * block_bytes
            if nbytes > len(buf):
                raise r.fail(f"tensor '{name}' claims {nbytes} bytes, more than the file")
            tensors[name] = nbytes
            shapes[name] = dims
    return _geometry(path, meta, tensors, shapes)


def _geometry(path: Path, meta: dict[str, Any], tensors: dict[str, int], shapes: dict[str, list[int]]) -> ModelGeometry:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: metadata lacks general.architecture. To fix: use a llama.cpp-converted GGUF")

    def need(key: str) -> int:
        v = meta.get(f"{arch}.{key}")
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelFileError(f"{path}: metadata {arch}.{key} is missing or not a positive integer ({v!r})")
        return v

    n_embd, n_head = need("embedding_length"), need("attention.head_count")
    n_head_kv = meta.get(f"{arch}.attention.head_count_kv", n_head)
    if not isinstance(n_head_kv, int) or n_head_kv <= 0 or n_head % n_head_kv:
        raise ModelFileError(f"{path}: head_count_kv {n_head_kv!r} does not divide head_count {n_head}")
    if n_embd % n_head:
        raise ModelFileError(f"{path}: embedding_length {n_embd} is not divisible by head_count {n_head}")
    n_layer = need("block_count")
    if "token_embd.weight" not in tensors or len(shapes["token_embd.weight"]) != 2:
        raise ModelFileError(f"{path}: a 2-D tensor token_embd.weight (n_embd, n_vocab) is missing")
    output = tensors.get("output.weight", tensors["token_embd.weight"])
    stream = output
    for layer in range(n_layer):
        for m in _LAYER_MATMULS:
            name = f"blk.{layer}.{m}.weight"
            if name not in tensors:
                raise ModelFileError(f"{path}: tensor {name} is missing")
            stream += tensors[name]
    n_vocab = shapes["token_embd.weight"][1]
    return ModelGeometry(
        name=str(meta.get("general.name") or path.stem),
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_head_kv,
        head_dim=n_embd // n_head,
        n_embd=n_embd,
        n_ff=need("feed_forward_length"),
        n_vocab=n_vocab,
        n_ctx=need("context_length"),
        weight_stream_bytes=stream,
        resident_bytes=sum(tensors.values()),
    )
