"""What the planner knows of a model and of the engine's memory: geometry, settings, scratch bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker.formats import QUANTIZED, FormatPair, kv_row_bytes
from worker.settings import EngineSettings

# The engine's attention splits contexts into chunks of this many positions (model.cpp kChunkPositions).
_ATTN_CHUNK = 512
# Rows of a matmul tile in the engine's per-thread scratch (model.cpp kRowTile = kernels.h kMaxRows).
_ROW_TILE = 16
# Bytes of one int8 activation block of 32 values plus two f32 scales (kernels.h BlockQ8A).
_ACT_BLOCK_BYTES = 40


@dataclass(frozen=True)
class LayerKV:
    """What one attention layer caches per position: KV heads, key and value widths, its window."""

    n_kv_head: int
    key_dim: int  # values per key head (GGUF <arch>.attention.key_length)
    value_dim: int  # values per value head (<arch>.attention.value_length)
    window: int = 0  # sliding-window positions the layer attends to; 0 = global (the whole context)

    def row_bytes(self, pair: FormatPair) -> int:
        """Bytes one cached position takes in this layer (every KV head's key and value)."""
        return self.n_kv_head * (kv_row_bytes(pair[0], self.key_dim) + kv_row_bytes(pair[1], self.value_dim))


@dataclass(frozen=True)
class ModelGeometry:
    """What the planner needs of a model (read from the GGUF header).

    The first eleven fields describe a uniform dense model (every layer global with n_kv_head heads
    of head_dim); `layers` overrides them per layer (head dims apart from n_embd / n_head, sliding
    windows) and the expert fields describe a mixture of experts.
    """

    name: str
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int  # key width per head (key_length); = n_embd / n_head unless the file says otherwise
    n_embd: int
    n_ff: int
    n_vocab: int
    n_ctx: int  # maximum context
    weight_stream_bytes: int  # weights one decode step of ONE sequence reads (matmuls + output; k experts)
    resident_bytes: int  # every tensor of the file (what stays mapped)
    layers: tuple[LayerKV, ...] = ()  # per layer; () = n_layer global layers of (n_kv_head, head_dim, head_dim)
    expert_count: int = 0  # E routed experts per layer (0: dense)
    expert_used_count: int = 0  # k experts each token is routed to
    expert_bytes: int = 0  # bytes of one routed expert summed over the layers (gate + up + down)
    expert_ff: int = 0  # an expert's FFN width (expert_feed_forward_length)
    architecture: str = "llama"

    def __post_init__(self) -> None:
        if self.layers and len(self.layers) != self.n_layer:
            raise ValueError(f"ModelGeometry: {len(self.layers)} layer entries for {self.n_layer} layers")
        if self.expert_count and not 0 < self.expert_used_count <= self.expert_count:
            raise ValueError(f"ModelGeometry: expert_used_count {self.expert_used_count} not in 1..{self.expert_count}")
        if len(self.windows) > 1:
            raise ValueError(f"ModelGeometry: sliding layers of different windows {sorted(self.windows)}")

    # -- attention layers ------------------------------------------------------------------

    @property
    def kv_layers(self) -> tuple[LayerKV, ...]:
        """Every layer's cache shape (derived from the uniform fields when `layers` is empty)."""
        return self.layers or (LayerKV(self.n_kv_head, self.head_dim, self.head_dim),) * self.n_layer

    @property
    def windows(self) -> frozenset[int]:
        return frozenset(layer.window for layer in self.layers if layer.window)

    @property
    def sliding_window(self) -> int:
        """W of the sliding layers, 0 when every layer is global."""
        return max(self.windows, default=0)

    @property
    def n_sliding(self) -> int:
        return sum(1 for layer in self.kv_layers if layer.window)

    @property
    def value_dim(self) -> int:
        return max(layer.value_dim for layer in self.kv_layers)

    def kv_bytes_per_token(self, pair: FormatPair) -> int:
        """Bytes one position takes in every layer: what a full-attention cache holds per token."""
        return sum(layer.row_bytes(pair) for layer in self.kv_layers)

    def class_bytes_per_token(self, pair: FormatPair) -> tuple[int, int]:
        """(global layers', sliding layers') bytes per cached position: the engine's two block classes."""
        g = sum(layer.row_bytes(pair) for layer in self.kv_layers if not layer.window)
        return g, self.kv_bytes_per_token(pair) - g

    def sliding_blocks(self, context: int, settings: EngineSettings) -> int:
        """Blocks of the sliding class one sequence of `context` positions holds at most (docs/PLANNER.md).

        A step that takes a sequence from n_past to n_past + c (c <= max_batch_tokens = C) needs
        positions [n_past - W + 1, n_past + c): at most W + C - 1 positions, which span at most
        ceil((W + C - 2) / B) + 1 blocks of B; never more than the whole sequence's ceil(n / B).
        """
        if not self.n_sliding or context <= 0:
            return 0
        b, w, c = settings.block_tokens, self.sliding_window, settings.max_batch_tokens
        return min(-(-context // b), -(-(w + c - 2) // b) + 1)

    def kv_bytes(self, context: int, pair: FormatPair, settings: EngineSettings) -> int:
        """KV bytes one sequence of `context` positions reserves (no prefix sharing): both classes."""
        b = settings.block_tokens
        g, s = self.class_bytes_per_token(pair)
        global_blocks = -(-context // b) if g else 0
        return b * (g * global_blocks + s * self.sliding_blocks(context, settings))

    def attended_positions(self, context: int) -> int:
        """(layer, cached position) pairs one decode step of a sequence at `context` reads."""
        return sum(min(context, layer.window) if layer.window else context for layer in self.kv_layers)

    def supports(self, pair: FormatPair) -> bool:
        k, v = pair
        return all(
            (k not in QUANTIZED or layer.key_dim % 32 == 0) and (v not in QUANTIZED or layer.value_dim % 32 == 0)
            for layer in self.kv_layers
        )

    # -- weights ---------------------------------------------------------------------------

    def expected_experts(self, batch: int) -> float:
        """Distinct experts a layer reads for `batch` tokens routed independently and uniformly:
        E (1 - (1 - k/E)^batch) (each expert is missed by one token with probability 1 - k/E)."""
        e, k = self.expert_count, self.expert_used_count
        if not e or batch <= 0:
            return 0.0
        return float(k) if batch == 1 else e * (1.0 - (1.0 - k / e) ** batch)

    def stream_bytes(self, batch: int) -> float:
        """Weight bytes one decode step of `batch` sequences reads: the shared weights once, plus each
        expected distinct expert once (dense models: weight_stream_bytes at every batch)."""
        if not self.expert_count:
            return float(self.weight_stream_bytes)
        shared = self.weight_stream_bytes - self.expert_used_count * self.expert_bytes
        return shared + self.expert_bytes * self.expected_experts(max(batch, 1))


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
    d, nff, hd = geom.n_embd, geom.n_ff, max(geom.head_dim, geom.value_dim)
    n_kv = max(layer.n_kv_head for layer in geom.kv_layers)
    q_dim, kv_dim = geom.n_head * hd, n_kv * hd
    group = geom.n_head // n_kv
    bt = settings.block_tokens
    chunk = max(bt, _ATTN_CHUNK // bt * bt)
    floats = rows * (d + max(d, nff) + 2 * q_dim + 2 * kv_dim + 2 * nff)  # x, xn, q, attn, k, v, gate, up
    floats += n_seqs * (d + geom.n_vocab)  # logits input rows and logits
    floats += settings.threads * max(_ROW_TILE * max(d, nff, q_dim), group * (_ATTN_CHUNK + hd))
    floats += rows * n_kv * math.ceil(max_context / chunk) * group * (hd + 2)  # partials
    act_blocks = rows * (max(d, nff, q_dim) // 32)
    ints = 0
    if geom.expert_count:  # router probabilities; each (row, choice)'s input, gate, up and output; routing
        e, k = geom.expert_count, geom.expert_used_count
        floats += rows * (e + k * (2 * d + 2 * geom.expert_ff) + k)  # probs, moe_in/gate/up/out, weights
        ints += rows * 2 * k + e + 1  # choice, row, first
    return 4 * floats + 4 * ints + _ACT_BLOCK_BYTES * act_blocks
