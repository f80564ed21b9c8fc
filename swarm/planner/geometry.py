"""What the planner knows of a model and of the engine's memory: geometry, settings, scratch bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker.formats import QUANTIZED, FormatPair, kv_row_bytes
from worker.settings import EngineSettings

# The engine's attention splits contexts into chunks of this many positions (model.cpp kChunkPositions).
_ATTN_CHUNK = 512
# Rows of a matmul tile in the engine's per-thread scratch (model.cpp kRowTile).
_ROW_TILE = 8
# Bytes of one int8 activation block of 32 values plus two f32 scales (kernels.h BlockQ8A).
_ACT_BLOCK_BYTES = 40


@dataclass(frozen=True)
class ModelGeometry:
    """What the planner needs of a model (read from the GGUF header)."""

    name: str
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_embd: int
    n_ff: int
    n_vocab: int
    n_ctx: int  # maximum context
    weight_stream_bytes: int  # weights one decode step reads (matmuls + output)
    resident_bytes: int  # every tensor of the file (what stays mapped)

    def kv_bytes_per_token(self, pair: FormatPair) -> int:
        k, v = pair
        return self.n_layer * self.n_kv_head * (kv_row_bytes(k, self.head_dim) + kv_row_bytes(v, self.head_dim))

    def supports(self, pair: FormatPair) -> bool:
        return all(f not in QUANTIZED or self.head_dim % 32 == 0 for f in pair)


def scratch_bytes(geom: ModelGeometry, settings: EngineSettings, n_seqs: int, max_context: int) -> int:
    """Upper bound of the engine's scratch (MemoryStats.scratch_bytes) for n_seqs sequences.

    A step holds at most max(n_seqs, max_batch_tokens) rows: every generating
    sequence decodes one token and prefill fills the rest of max_batch_tokens.
    Logits are kept for one row per sequence. Attention keeps partial softmax
    state for each (row, kv head, 512-position chunk).
    """
    if n_seqs <= 0:
        return 0
    rows = max(n_seqs, settings.max_batch_tokens)
    d, nff, hd = geom.n_embd, geom.n_ff, geom.head_dim
    q_dim, kv_dim = geom.n_head * hd, geom.n_kv_head * hd
    group = geom.n_head // geom.n_kv_head
    bt = settings.block_tokens
    chunk = max(bt, _ATTN_CHUNK // bt * bt)
    floats = rows * (d + max(d, nff) + 2 * q_dim + 2 * kv_dim + 2 * nff)  # x, xn, q, attn, k, v, gate, up
    floats += n_seqs * (d + geom.n_vocab)  # logits input rows and logits
    floats += settings.threads * max(_ROW_TILE * max(d, nff, q_dim), group * (_ATTN_CHUNK + hd))
    floats += rows * geom.n_kv_head * math.ceil(max_context / chunk) * group * (hd + 2)  # partials
    act_blocks = rows * (max(d, nff, q_dim) // 32)
    return 4 * floats + _ACT_BLOCK_BYTES * act_blocks
