"""KV formats: the one list, their row bytes, and K/V pair names (dependency-free: no compiled module).

The native engine (native/kv_format.h) defines the same formats; tests/test_formats.py checks that
this list and `kv_row_bytes` agree with `worker._native.kv_row_bytes`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

KV_FORMATS = ("f32", "f16", "q8_0", "q8_head", "q4_0")
QUANTIZED = frozenset({"q8_0", "q8_head", "q4_0"})

FormatPair = tuple[str, str]  # (K format, V format)


def pair_name(pair: FormatPair) -> str:
    """('q8_0', 'q8_0') -> 'q8_0'; ('q8_0', 'f16') -> 'q8_0/f16'."""
    return pair[0] if pair[0] == pair[1] else f"{pair[0]}/{pair[1]}"


def parse_pair(name: str) -> FormatPair:
    """'q8_0' -> (q8_0, q8_0); 'q8_0/f16' -> (q8_0, f16)."""
    parts = name.split("/")
    if len(parts) not in (1, 2) or any(p not in KV_FORMATS for p in parts):
        raise ValueError(
            f"'{name}' is not a KV format or K/V pair. To fix: use one of {', '.join(KV_FORMATS)} or 'K/V'"
        )
    return (parts[0], parts[-1])


def all_pairs(formats: Iterable[str] = KV_FORMATS) -> tuple[FormatPair, ...]:
    """Every (K, V) combination of `formats`, K-major."""
    fs = tuple(formats)
    return tuple(itertools.product(fs, fs))


def kv_row_bytes(fmt: str, head_dim: int) -> int:
    """Bytes of one (position, kv head) row of head_dim values; mirrors native kv_row_bytes."""
    if fmt == "f32":
        return 4 * head_dim
    if fmt == "f16":
        return 2 * head_dim
    if fmt not in QUANTIZED:
        raise ValueError(f"unknown KV format '{fmt}'. To fix: use one of {', '.join(KV_FORMATS)}")
    if head_dim % 32:
        raise ValueError(f"KV format {fmt} needs head_dim divisible by 32, got {head_dim}")
    if fmt == "q8_0":
        return head_dim // 32 * (2 + 32)  # blocks of f16 scale + 32 int8
    if fmt == "q4_0":
        return head_dim // 32 * (2 + 16)  # blocks of f16 scale + 16 nibble bytes
    return head_dim + 4  # q8_head: int8 per value + one f32 scale per (position, head)
