"""What each KV format costs in model quality on the real default model:
teacher-forced over 256 tokens of text, top-1 agreement with the f32 cache and
mean KL(f32 || format) of the next-token distribution. The floors are set from
the measurement recorded in docs/KV_QUALITY.md, with headroom.

The reference is the f32 cache with float32 activations. Each format is
measured twice: with float32 activations (what the KV format alone costs) and
with the engine's default 8-bit activation blocks (what a user gets)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import Engine

TEXT = (
    "The harbour town woke slowly. Fishing boats came in on the morning tide, their decks stacked with crates "
    "of silver mackerel, and the gulls followed them in long, complaining circles. At the end of the pier an old "
    "engineer named Marta opened the door of the pump house, as she had every day for thirty-one years, and "
    "checked the gauges one by one. The tide tables said the water would rise two metres before noon. She wrote "
    "the readings in a notebook with a green cover: pressure, flow, temperature of the bearings. Her grandson, "
    "who was eleven and wanted to build rockets, asked why she still used paper when the council had installed "
    'sensors that sent everything to a server in the city. "Because the server does not smell the oil," she '
    'said, "and it does not hear the second pump when its bearing starts to sing." He laughed, but he listened. '
    "By ten o'clock the wind had turned to the north-east, and the sea beyond the breakwater was the colour of "
    "slate. Marta started the second pump early. At eleven the storm drains in the lower streets began to fill, "
    "and the new sensors, which had been calibrated on a calm day in July, reported that all was well. The "
    "notebook said otherwise, and the notebook was right. That evening the council sent a van with two young "
    "technicians and a box of spare parts, and they stayed until midnight learning how the old machines worked."
)
N_TOKENS = 256

# Floors from the measurement in docs/KV_QUALITY.md (measured: see the doc), with headroom.
# Keys are (K format, V format).
MIN_TOP1 = {
    ("f16", "f16"): 0.99,
    ("q8_0", "q8_0"): 0.95,
    ("q8_head", "q8_head"): 0.93,
    ("q8_0", "q4_0"): 0.90,
    ("q4_0", "q4_0"): 0.68,
}
MAX_MEAN_KL = {
    ("f16", "f16"): 1e-4,
    ("q8_0", "q8_0"): 3e-3,
    ("q8_head", "q8_head"): 3e-3,
    ("q8_0", "q4_0"): 0.03,
    ("q4_0", "q4_0"): 0.2,
}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@pytest.fixture(scope="module")
def reference(default_model):  # type: ignore[no-untyped-def]
    eng = Engine(default_model, kv_k="f32", kv_v="f32", float_activations=True)
    tokens = eng.tokenizer.encode(TEXT)
    assert len(tokens) >= N_TOKENS, len(tokens)
    tokens = tokens[:N_TOKENS]
    return tokens, log_softmax(eng.score(eng.add_sequence([], generate=False), tokens))


def quality(default_model, tokens, ref_logp, kv_k: str, kv_v: str, fast: bool = False) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    eng = Engine(default_model, kv_k=kv_k, kv_v=kv_v, float_activations=not fast)
    logp = log_softmax(eng.score(eng.add_sequence([], generate=False), tokens))
    top1 = float(np.mean(logp.argmax(axis=1) == ref_logp.argmax(axis=1)))
    kl = float(np.mean(np.sum(np.exp(ref_logp) * (ref_logp - logp), axis=1)))
    return top1, kl


# With 8-bit activations (the default) every format, f32 included, also carries
# the activations' rounding (measured: f32 0.957 / 2.8e-3 alone).
MIN_TOP1_FAST = {
    **MIN_TOP1,
    ("f32", "f32"): 0.92,
    ("f16", "f16"): 0.92,
    ("q8_0", "q8_0"): 0.92,
    ("q8_head", "q8_head"): 0.92,
    ("q8_0", "q4_0"): 0.88,
}
MAX_MEAN_KL_FAST = {
    **MAX_MEAN_KL,
    ("f32", "f32"): 0.01,
    ("f16", "f16"): 0.01,
    ("q8_0", "q8_0"): 0.012,
    ("q8_head", "q8_head"): 0.012,
    ("q8_0", "q4_0"): 0.04,
}


@pytest.mark.parametrize("fmt", list(MIN_TOP1), ids=["/".join(f) for f in MIN_TOP1])
def test_kv_format_quality_floor(default_model, reference, fmt: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    tokens, ref_logp = reference
    top1, kl = quality(default_model, tokens, ref_logp, *fmt)
    print(f"KV {fmt[0]}/{fmt[1]}, float activations: top-1 agreement with f32 {top1:.4f}, mean KL {kl:.3g}")
    assert top1 >= MIN_TOP1[fmt], f"{fmt}: top-1 agreement {top1:.4f}"
    assert kl <= MAX_MEAN_KL[fmt], f"{fmt}: mean KL {kl:.3g}"


@pytest.mark.parametrize("fmt", list(MIN_TOP1_FAST), ids=["/".join(f) for f in MIN_TOP1_FAST])
def test_kv_format_quality_floor_int8_activations(default_model, reference, fmt: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    tokens, ref_logp = reference
    top1, kl = quality(default_model, tokens, ref_logp, *fmt, fast=True)
    print(f"KV {fmt[0]}/{fmt[1]}, 8-bit activations: top-1 agreement with f32 {top1:.4f}, mean KL {kl:.3g}")
    assert top1 >= MIN_TOP1_FAST[fmt], f"{fmt}: top-1 agreement {top1:.4f}"
    assert kl <= MAX_MEAN_KL_FAST[fmt], f"{fmt}: mean KL {kl:.3g}"


def test_narrower_formats_cost_more(default_model, reference) -> None:  # type: ignore[no-untyped-def]
    """Ordering sanity: q4_0 keys cost more than q8_0 keys, which cost more than f16."""
    tokens, ref_logp = reference
    kl = {f: quality(default_model, tokens, ref_logp, f, "f16")[1] for f in ("f16", "q8_0", "q4_0")}
    assert kl["f16"] < kl["q8_0"] < kl["q4_0"]
