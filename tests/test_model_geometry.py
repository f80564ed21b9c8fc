"""The planner's geometry of every architecture, against an independent header reader, hand figures
and the engine's own KV reservation (to the block: the plan's bytes fit, one byte less does not).

Expected values come from the engine's own header reader (native, written apart from the Python one
under test; the `gguf` package's reader takes 30 s on a 262k-token vocabulary) and from the rules written here by hand
(docs/PLANNER.md): key/value widths from <arch>.attention.key_length/value_length, Gemma 3's every
sixth layer global, sliding blocks min(ceil(n/B), ceil((W + C - 2)/B) + 1), experts E(1 - (1 - k/E)^B).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import tinymodels
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.gguf_header import read_geometry
from swarm.planner import (
    AgentGroup,
    Calibration,
    DeviceProfile,
    EngineSettings,
    ModelGeometry,
    Policy,
    plan,
    scratch_bytes,
)
from swarm.planner.geometry import LayerKV
from worker.engine import Engine, KvBudgetError, Sampling, read_gguf

FAMILIES = sorted(tinymodels.TINY_SPECS)
GEMMA = "gemma3-270m"


def _path(name: str) -> Path:
    return tinymodels.gemma_file() if name == GEMMA else tinymodels.tiny_model(name)


def _by_hand(path: Path) -> tuple[str, list[tuple[int, int, int, int]]]:
    """(architecture, per layer (kv heads, key width, value width, window)) from the native reader."""
    meta = read_gguf(path)["metadata"]
    arch = meta["general.architecture"]
    n_layer = meta[f"{arch}.block_count"]
    n_head = meta[f"{arch}.attention.head_count"]
    n_kv = meta.get(f"{arch}.attention.head_count_kv", n_head)
    key = meta.get(f"{arch}.attention.key_length", meta[f"{arch}.embedding_length"] // n_head)
    value = meta.get(f"{arch}.attention.value_length", key)
    window = meta.get(f"{arch}.attention.sliding_window", 0)
    # Gemma 3: five sliding layers, then a global one (layers 5, 11, 17 of the 270M file are global).
    slides = [arch == "gemma3" and (i + 1) % 6 != 0 for i in range(n_layer)]
    return arch, [(n_kv, key, value, window if s else 0) for s in slides]


@pytest.mark.parametrize("name", [*FAMILIES, GEMMA])
def test_geometry_of_every_architecture(name: str) -> None:
    path = _path(name)
    geom = read_geometry(path)
    arch, layers = _by_hand(path)
    assert geom.architecture == arch
    assert [(lk.n_kv_head, lk.key_dim, lk.value_dim, lk.window) for lk in geom.kv_layers] == layers
    f16 = sum(h * (k + v) * 2 for h, k, v, _ in layers)  # 2 bytes a value
    assert geom.kv_bytes_per_token(("f16", "f16")) == f16
    q8 = sum(h * (k // 32 + v // 32) * 34 for h, k, v, _ in layers)  # 34-byte blocks of 32
    assert geom.kv_bytes_per_token(("q8_0", "q8_0")) == q8
    if name == "qwen3":
        spec = tinymodels.TINY_SPECS["qwen3"]
        assert geom.head_dim == spec.head_dim != spec.n_embd // spec.n_head


def test_gemma_32k_context_example() -> None:
    """docs/PLANNER.md's example: one 32,768-token sequence of Gemma 3 270M at f16."""
    geom = read_geometry(tinymodels.gemma_file())
    s = EngineSettings()  # B = 16, C = 256
    per_layer = 1 * (256 + 256) * 2  # one KV head, key and value of 256 values, f16: 1,024 bytes a position
    assert geom.class_bytes_per_token(("f16", "f16")) == (3 * per_layer, 15 * per_layer)
    sliding_blocks = min(32768 // 16, math.ceil((512 + 256 - 2) / 16) + 1)
    assert sliding_blocks == 49 == geom.sliding_blocks(32768, s)
    planned = 32768 * 3 * per_layer + sliding_blocks * 16 * 15 * per_layer
    assert planned == 112_705_536 == geom.kv_bytes(32768, ("f16", "f16"), s)
    exact_window = 32768 * 3 * per_layer + 512 * 15 * per_layer  # the "about 108 MB"
    assert exact_window == 108_527_616
    assert geom.kv_bytes_per_token(("f16", "f16")) * 32768 == 603_979_776  # if every layer kept every position


def test_moe_weight_stream_grows_with_distinct_experts() -> None:
    path = tinymodels.tiny_model("qwen3moe")
    geom = read_geometry(path)
    e, k = 8, 2
    assert (geom.expert_count, geom.expert_used_count) == (e, k)
    experts = sum(t["nbytes"] for t in read_gguf(path)["tensors"] if t["name"].endswith("_exps.weight"))
    assert geom.expert_bytes * e == experts
    # expected distinct experts per layer, by hand: 8 (1 - (3/4)^B)
    for batch, distinct in ((1, 2.0), (2, 3.5), (4, 8 * (1 - 81 / 256)), (64, 8 * (1 - 0.75**64))):
        assert geom.expected_experts(batch) == pytest.approx(distinct, rel=1e-12)
        shared = geom.weight_stream_bytes - k * experts // e
        assert geom.stream_bytes(batch) == pytest.approx(shared + distinct * experts / e, rel=1e-12)
    assert geom.stream_bytes(10**6) == pytest.approx(geom.weight_stream_bytes + (e - k) * experts / e, rel=1e-12)
    dense = read_geometry(tinymodels.tiny_model("qwen3"))
    assert dense.stream_bytes(1) == dense.stream_bytes(16) == dense.weight_stream_bytes
    # A catalog prediction follows the same curve: more sequences, more expert bytes a step.
    cal = Calibration.from_bandwidth(geom, 1e9, [("f16", "f16")])
    assert cal.weight_time(1) == pytest.approx(geom.stream_bytes(1) / 1e9, rel=1e-12)
    assert cal.weight_time(4) == pytest.approx(geom.stream_bytes(4) / 1e9, rel=1e-12)
    assert cal.weight_time(10**5) <= geom.stream_bytes(10**6) / 1e9 * (1 + 1e-12)


def _run_to(eng: Engine, n: int, n_vocab: int, seed: int) -> int:
    """One sequence to n positions: one token first, so every prefill chunk of C starts one past a block
    boundary (the alignment at which the sliding blocks of a chunk reach their bound), then n - 1 positions
    in chunks of C, sampling one token at the end."""
    rng = np.random.default_rng(seed)
    sid = eng.add_sequence([int(rng.integers(3, n_vocab))], Sampling(max_new_tokens=1))
    while eng.busy():
        eng.step()
    eng.append(sid, [int(t) for t in rng.integers(3, n_vocab, size=n - 2)], Sampling(max_new_tokens=1))
    while eng.busy():
        eng.step()
    return sid


CASES = [(f, fmt) for f in FAMILIES for fmt in ("f16", "q8_0")] + [(GEMMA, "f16")]


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_planned_kv_bytes_equal_what_the_engine_reserves(name: str, fmt: str) -> None:
    path = _path(name)
    geom = read_geometry(path)
    # tiny files: window 32 (gemma3), context 512; C = 64 makes four full chunks. Gemma: W 512, C 256.
    engine = EngineSettings(block_tokens=16, max_batch_tokens=256 if name == GEMMA else 64)
    b, c = engine.block_tokens, engine.max_batch_tokens
    n = 1 + (3 if name == GEMMA else 4) * c
    pair = (fmt, fmt)
    dev = DeviceProfile("host", "local", "cpu", 8 * 10**9, Calibration.from_bandwidth(geom, 20e9, [pair]))
    p = plan(geom, [dev], [AgentGroup("a", 1, n)], Policy.allow([fmt]), settings=engine)
    w = p.worker("host")
    # by hand: the global layers' ceil(n / B) blocks; the sliding layers' bounded blocks
    g_bpt = sum(lk.row_bytes(pair) for lk in geom.kv_layers if not lk.window)
    s_bpt = sum(lk.row_bytes(pair) for lk in geom.kv_layers if lk.window)
    W = geom.sliding_window
    s_blocks = min(math.ceil(n / b), math.ceil((W + c - 2) / b) + 1) if W else 0
    assert w.kv_bytes == b * (g_bpt * math.ceil(n / b) + s_bpt * s_blocks)
    assert (w.kv_blocks, w.sliding_blocks) == (math.ceil(n / b), s_blocks)

    eng = Engine(path, kv_k=fmt, kv_v=fmt, kv_budget_bytes=w.kv_bytes, block_tokens=b, max_batch_tokens=c)
    n_vocab = eng.config["n_vocab"]
    sid = _run_to(eng, n, n_vocab, seed=n)
    info = eng.info(sid)
    assert info["finish_reason"] == "max_tokens" and info["n_past"] == n, info  # the plan's budget sufficed
    mem = eng.memory()
    assert mem["blocks_in_use"] == math.ceil(n / b)
    if W:
        assert mem["sliding_window"] == W
        # between steps the window's blocks: [n - W + 1, n)
        assert mem["swa_blocks_in_use"] == (n - 1) // b - (n - W + 1) // b + 1
        assert mem["bytes_reserved"] == b * (g_bpt * math.ceil(n / b) + s_bpt * mem["swa_blocks_in_use"])
    else:
        assert mem["bytes_reserved"] == w.kv_bytes  # to the block
    assert mem["scratch_bytes"] <= scratch_bytes(geom, engine, 1, n) == w.scratch_bytes
    # the engine counts every expert in weight_bytes: what a step reads once the batch has routed to all
    assert mem["weight_bytes"] == round(geom.stream_bytes(10**9))

    # One byte less than the plan: the engine cannot hold the peak (the last chunk's window, or the last block).
    short = Engine(path, kv_k=fmt, kv_v=fmt, kv_budget_bytes=w.kv_bytes - 1, block_tokens=b, max_batch_tokens=c)
    try:
        sid = _run_to(short, n, n_vocab, seed=n)
        refused = short.info(sid)["finish_reason"] == "kv_budget"
    except KvBudgetError:
        refused = True
    assert refused


# -- the sliding-block bound against a simulation of the engine's rule -------------------------------


def _peak_sliding_blocks(chunks: list[int], b: int, w: int) -> int:
    """Most sliding blocks a sequence holds over a schedule of steps (the engine's rule, docs/PLANNER.md):
    a step from n_past to n_past + c holds blocks covering [max(0, n_past - W + 1), n_past + c)."""
    n_past, peak = 0, 0
    for c in chunks:
        lo, hi = max(0, n_past - w + 1), n_past + c  # positions [lo, hi)
        peak = max(peak, (hi - 1) // b - lo // b + 1)
        n_past += c
    return peak


def _sliding_geometry(w: int) -> ModelGeometry:
    layers = (LayerKV(1, 32, 32, w), LayerKV(1, 32, 32, 0))
    return ModelGeometry("t", 2, 1, 1, 32, 32, 64, 100, 1 << 20, 1, 1, layers=layers)


@settings(max_examples=200, deadline=None)
@given(
    b=st.integers(1, 32),
    w=st.integers(1, 600),
    c=st.integers(1, 300),
    n=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
)
def test_sliding_bound_holds_for_any_schedule_and_is_reached(b: int, w: int, c: int, n: int, seed: int) -> None:
    geom = _sliding_geometry(w)
    bound = geom.sliding_blocks(n, EngineSettings(block_tokens=b, max_batch_tokens=c))
    assert bound == min(math.ceil(n / b), math.ceil((w + c - 2) / b) + 1)  # as written in docs/PLANNER.md
    rng = np.random.default_rng(seed)
    chunks, left = [], n
    while left:  # any steps of at most C tokens (decode steps are chunks of 1)
        chunks.append(int(rng.integers(1, min(c, left) + 1)))
        left -= chunks[-1]
    assert _peak_sliding_blocks(chunks, b, w) <= bound
    # Reached: o tokens first (o = 1..B sets the alignment), then full chunks of C, when n leaves room.
    best = 0
    for o in range(1, b + 1):
        full = (n - o) // c
        best = max(best, _peak_sliding_blocks([o] + [c] * full, b, w))
    if n >= w + 2 * c + 2 * b:
        assert best == bound
