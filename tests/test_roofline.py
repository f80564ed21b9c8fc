"""The engine's roofline timers (Engine.set_timers / timers): the bytes a step reads, counted by the
engine, against a hand calculation from the GGUF tensor table and the model geometry; the time
split adds up to the step; off means nothing is counted; reading resets. No speed assertion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tinymodels import tiny_model

from worker import _native
from worker.engine import Engine, Sampling

# Bytes of one (position, kv head) row of head_dim values, from each format's definition:
# f32 4 bytes a value, f16 2; q8_0 blocks of 32 int8 + one fp16 scale (34 bytes); q4_0 blocks of
# 16 bytes of nibbles + one fp16 scale (18 bytes); q8_head one f32 scale for the row + head_dim int8.
ROW_BYTES = {
    "f32": lambda hd: 4 * hd,
    "f16": lambda hd: 2 * hd,
    "q8_0": lambda hd: hd // 32 * 34,
    "q4_0": lambda hd: hd // 32 * 18,
    "q8_head": lambda hd: 4 + hd,
}
LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def tensor_bytes(path: Path) -> dict[str, int]:
    """{tensor name: bytes in the file} from the GGUF tensor table."""
    return {t["name"]: int(t["nbytes"]) for t in _native.read_gguf(str(path))["tensors"]}


def step_weight_bytes(path: Path, n_layer: int, n_vocab: int, tokens: int, logits: bool) -> int:
    """Weights one step streams: every layer matrix once, the output matrix once if any row needs logits
    (the token embedding when tied), and one embedding row per token."""
    nb = tensor_bytes(path)
    layers = sum(nb[f"blk.{layer}.{m}.weight"] for layer in range(n_layer) for m in LAYER_MATRICES)
    output = nb.get("output.weight", nb["token_embd.weight"])
    embd_row = nb["token_embd.weight"] // n_vocab
    return layers + (output if logits else 0) + tokens * embd_row


def timed(engine: Engine, run: Any) -> dict[str, float]:
    engine.set_timers(True)
    engine.reset_timers()
    run()
    t = engine.timers()
    engine.set_timers(False)
    return t


def check_split(t: dict[str, float]) -> None:
    """weights and attention are timed inside the step, other is the rest: they sum to the total."""
    assert t["weights_s"] > 0.0 and t["attention_s"] > 0.0
    assert t["weights_s"] + t["attention_s"] <= t["total_s"]
    assert t["other_s"] >= 0.0
    assert t["weights_s"] + t["attention_s"] + t["other_s"] == pytest.approx(t["total_s"], rel=1e-12, abs=1e-15)


@pytest.fixture(scope="module")
def engines(default_model: Path) -> dict[str, Engine]:
    return {kv: Engine(default_model, kv_k=kv, kv_v=kv, threads=2) for kv in ROW_BYTES}


@pytest.mark.parametrize("kv", list(ROW_BYTES))
def test_decode_step_bytes_match_geometry(engines: dict[str, Engine], default_model: Path, kv: str) -> None:
    eng = engines[kv]
    c = eng.config
    depths = [0, 37, 100]  # cached positions per sequence before the step (0: one prompt token prefilled)
    seqs = []
    for depth in depths:
        if depth == 0:
            s = eng.add_sequence([504], Sampling(max_new_tokens=2, stop_tokens=()))
        else:
            s = eng.add_sequence([], generate=False)
            eng.fill_kv(s, depth, seed=3)
            eng.append(s, [504], Sampling(max_new_tokens=2, stop_tokens=()))
        seqs.append(s)
    # Step 1: the three pending tokens (each sequence's last position), all sampled.
    t = timed(eng, eng.step)
    for s in seqs:
        eng.free(s)
    assert t["steps"] == 1 and t["tokens"] == 3
    assert t["weight_bytes"] == step_weight_bytes(default_model, c["n_layer"], c["n_vocab"], 3, True)
    # Each token at position p attends to p + 1 positions: depth + 1 (the fresh prompt: 1).
    positions = sum(max(d, 0) + 1 for d in depths)
    row = ROW_BYTES[kv](c["head_dim"]) * 2  # a K row and a V row
    assert t["kv_bytes"] == c["n_layer"] * c["n_head_kv"] * positions * row
    check_split(t)


def test_prefill_bytes_and_several_steps(engines: dict[str, Engine], default_model: Path) -> None:
    eng = engines["q8_0"]
    c = eng.config
    n = 20
    s = eng.add_sequence([100 + i for i in range(n)], Sampling(max_new_tokens=3, stop_tokens=()))

    def run() -> None:
        while eng.busy():
            eng.step()

    t = timed(eng, run)
    eng.free(s)
    # Step 1 prefills 20 tokens (logits for the last only), steps 2-3 decode at positions 20 and 21
    # (the third sampled token is not fed back: the turn ended).
    assert t["steps"] == 3 and t["tokens"] == n + 2
    w = step_weight_bytes(default_model, c["n_layer"], c["n_vocab"], n, True)
    w += 2 * step_weight_bytes(default_model, c["n_layer"], c["n_vocab"], 1, True)
    assert t["weight_bytes"] == w
    positions = sum(p + 1 for p in range(n)) + (n + 1) + (n + 2)  # token at position p reads p + 1 rows
    assert t["kv_bytes"] == c["n_layer"] * c["n_head_kv"] * positions * 2 * ROW_BYTES["q8_0"](c["head_dim"])
    check_split(t)


def test_sliding_window_layers_read_only_the_window() -> None:
    path = tiny_model("gemma3", "F32")
    eng = Engine(path, kv_k="f16", kv_v="f16", threads=2)
    c = eng.config
    window, n_swa = c["sliding_window"], c["n_layer_swa"]
    assert window > 0 and 0 < n_swa < c["n_layer"]
    depth = 3 * window + 5  # well past the window
    s = eng.add_sequence([], generate=False)
    eng.fill_kv(s, depth, seed=2)
    eng.append(s, [2], Sampling(max_new_tokens=1, stop_tokens=()))
    t = timed(eng, eng.step)
    eng.free(s)
    n_ctx = depth + 1
    positions = (c["n_layer"] - n_swa) * n_ctx + n_swa * min(window, n_ctx)
    assert t["kv_bytes"] == positions * c["n_head_kv"] * 2 * ROW_BYTES["f16"](c["head_dim"])
    assert t["weight_bytes"] == step_weight_bytes(path, c["n_layer"], c["n_vocab"], 1, True)
    check_split(t)


def test_off_counts_nothing_and_reading_resets(engines: dict[str, Engine]) -> None:
    eng = engines["f16"]
    zero = {"steps": 0, "tokens": 0, "weight_bytes": 0, "kv_bytes": 0, "total_s": 0.0, "weights_s": 0.0}

    def decode() -> None:
        s = eng.add_sequence([7, 8, 9], Sampling(max_new_tokens=2, stop_tokens=()))
        while eng.busy():
            eng.step()
        eng.free(s)

    eng.set_timers(False)
    eng.reset_timers()
    decode()
    off = eng.timers()
    assert off["on"] is False and {k: off[k] for k in zero} == zero

    eng.set_timers(True)
    decode()
    kept = eng.timers(reset=False)
    assert kept["steps"] == 2 and kept["weight_bytes"] > 0
    first = eng.timers()  # reads the same sums, then resets
    assert {k: first[k] for k in zero} == {k: kept[k] for k in zero}
    after = eng.timers()
    assert after["on"] is True and {k: after[k] for k in zero} == zero
    decode()
    eng.reset_timers()
    assert {k: eng.timers()[k] for k in zero} == zero
    eng.set_timers(False)
