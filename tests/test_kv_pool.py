"""Paged KV pool: exact byte accounting, budgets, block reuse."""

from __future__ import annotations

import pytest

from worker.engine import Engine, KvBudgetError, Sampling

# Default model geometry: 30 layers, 3 KV heads, head_dim 64.
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64
# Bytes of one (token, kv head) row of 64 elements, written out per format:
ROW_BYTES = {
    "f32": 64 * 4,  # 256
    "f16": 64 * 2,  # 128
    "q8_0": (64 // 32) * (2 + 32),  # 2 blocks x (f16 scale + 32 int8) = 68
    "q8_head": 64 * 1 + 4,  # 64 int8 + one f32 scale = 68
    "q4_0": (64 // 32) * (2 + 16),  # 2 blocks x (f16 scale + 16 nibble bytes) = 36
}


def test_f16_bytes_per_token_hand_formula(default_model) -> None:  # type: ignore[no-untyped-def]
    eng = Engine(default_model, kv_k="f16", kv_v="f16")
    # 30 layers x 3 KV heads x 64 x 2 (K and V) x 2 bytes
    assert eng.memory()["bytes_per_token"] == 30 * 3 * 64 * 2 * 2 == 23_040


@pytest.mark.parametrize("kv_k", list(ROW_BYTES))
@pytest.mark.parametrize("kv_v", ["f16", "q4_0", "q8_head"])
def test_bytes_per_token_every_format(default_model, kv_k: str, kv_v: str) -> None:  # type: ignore[no-untyped-def]
    mem = Engine(default_model, kv_k=kv_k, kv_v=kv_v).memory()
    assert mem["bytes_per_token"] == LAYERS * KV_HEADS * (ROW_BYTES[kv_k] + ROW_BYTES[kv_v])
    assert mem["block_bytes"] == mem["bytes_per_token"] * mem["block_tokens"]


def test_reserved_used_and_reuse(tiny_models) -> None:  # type: ignore[no-untyped-def]
    eng = Engine(tiny_models["F32"], kv_k="q8_0", kv_v="f16", block_tokens=16)
    bpt = eng.memory()["bytes_per_token"]
    # tiny model: 2 layers x 2 kv heads x (q8_0 row 34 + f16 row 64) for head_dim 32
    assert bpt == 2 * 2 * (34 + 64)
    a = eng.add_sequence(list(range(20)), generate=False)
    b = eng.add_sequence(list(range(5)), generate=False)
    while eng.busy():
        eng.step()
    mem = eng.memory()
    assert mem["bytes_used"] == (20 + 5) * bpt
    assert mem["blocks_in_use"] == 2 + 1  # ceil(20/16) + ceil(5/16)
    assert mem["bytes_reserved"] == 3 * 16 * bpt
    eng.free(a)
    assert eng.memory()["blocks_in_use"] == 1
    eng.free(b)
    c = eng.add_sequence(list(range(40)), generate=False)
    while eng.busy():
        eng.step()
    mem = eng.memory()
    assert mem["blocks_in_use"] == 3
    assert mem["bytes_allocated"] == 3 * 16 * bpt  # freed blocks were reused, nothing new allocated
    eng.free(c)


def test_budget_refuses_to_grow(tiny_models) -> None:  # type: ignore[no-untyped-def]
    probe = Engine(tiny_models["F32"], kv_k="f16", kv_v="f16", block_tokens=16).memory()
    budget = 3 * probe["block_bytes"]  # room for 48 positions
    eng = Engine(tiny_models["F32"], kv_k="f16", kv_v="f16", block_tokens=16, kv_budget_bytes=budget)
    seq = eng.add_sequence([], generate=False)
    eng.score(seq, list(range(48)))
    with pytest.raises(KvBudgetError, match="budget"):
        eng.score(seq, [1])
    assert eng.memory()["bytes_reserved"] <= budget
    # A generating sequence that hits the budget stops with a reason instead of failing the step.
    eng.free(seq)
    gen = eng.add_sequence(list(range(40)), Sampling(max_new_tokens=100))
    made = 0
    while eng.busy():
        made += len(eng.step())
    info = eng.info(gen)
    assert info["finish_reason"] == "kv_budget"
    assert info["n_past"] == 48 and made == 48 - 40 + 1
    assert eng.memory()["bytes_reserved"] <= budget


def test_budget_smaller_than_a_block_is_rejected(tiny_models) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KvBudgetError, match="smaller than one block"):
        Engine(tiny_models["F32"], kv_budget_bytes=100)


def test_fill_kv_accounts_and_decodes_on(tiny_models) -> None:  # type: ignore[no-untyped-def]
    """The calibration aid reserves real blocks and the sequence keeps decoding after it."""
    eng = Engine(tiny_models["Q4_0"], kv_k="q8_head", kv_v="q4_0")
    bpt = eng.memory()["bytes_per_token"]
    seq = eng.add_sequence([], generate=False)
    eng.fill_kv(seq, 100, seed=3)
    assert eng.info(seq)["n_past"] == 100
    assert eng.memory()["bytes_used"] == 100 * bpt
    assert eng.memory()["blocks_in_use"] == 7  # ceil(100 / 16)
    eng.append(seq, [5, 6], Sampling(max_new_tokens=4))
    made = 0
    while eng.busy():
        made += len(eng.step())
    assert made == 4 and eng.info(seq)["n_past"] == 105
    with pytest.raises(ValueError, match="context"):
        eng.fill_kv(seq, 1000)


def test_bandwidth_probe_returns_a_rate_and_rejects_tiny_buffers() -> None:
    import math

    from worker import _native

    rate = _native.measure_read_bandwidth(1, 1 << 24, 1)
    assert math.isfinite(rate) and rate > 0
    with pytest.raises(ValueError, match="1 MiB"):
        _native.measure_read_bandwidth(1, 1000, 1)
