"""Every ISA level's kernels against the scalar reference and against numpy /
gguf-py (an independent implementation of the ggml block layouts)."""

from __future__ import annotations

import numpy as np
import pytest
import refmodel
from conftest import ISA_LEVELS
from gguf.quants import dequantize, quantize

from worker import _native

# Relative limit for a float32 dot product of n terms against float64.
DOT_REL_LIMIT = 1e-5
# Dequantization is exact arithmetic on small integers times an f16 scale (one
# float32 multiply, or a fused multiply-add for Q4_1), so levels agree to float32 rounding.
DEQUANT_LIMIT = 1e-6

QTYPES = refmodel.WEIGHT_TYPES  # {name: gguf type} for every weight format


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("n", [1, 7, 31, 64, 577])
def test_dot(isa: str, n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    want = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    got = _native._kernel_dot(isa, a, b)
    scale = float(np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert abs(got - want) <= DOT_REL_LIMIT * scale


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("wt", list(QTYPES))
def test_dequant_matches_gguf_py(isa: str, wt: str) -> None:
    # 96 elements = 3 blocks for the quantized types; 101 (odd) for the plain ones.
    n = 96 if wt.startswith("Q") else 101
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) * 2.0).astype(np.float32)
    raw = quantize(x.reshape(1, n), QTYPES[wt])
    want = dequantize(raw, QTYPES[wt]).reshape(n).astype(np.float64)
    got = _native._kernel_dequant(isa, wt, raw.tobytes(), n).astype(np.float64)
    assert np.abs(got - want).max() <= DEQUANT_LIMIT * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_kv_blocks_are_ggml_layout(isa: str, fmt: str) -> None:
    """Stored q8_0 / q4_0 KV rows are byte-identical to gguf-py's ggml blocks."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(64).astype(np.float32)
    qtype = QTYPES[fmt.upper()]
    values, raw = _native._kv_roundtrip(isa, fmt, x)
    assert raw == quantize(x.reshape(1, 64), qtype).tobytes()
    np.testing.assert_allclose(
        values,
        dequantize(np.frombuffer(raw, np.uint8).reshape(1, -1), qtype).ravel(),
        rtol=0,
        atol=DEQUANT_LIMIT * 4,
    )


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("fmt", ["f32", "f16", "q8_0", "q8_head", "q4_0"])
def test_kv_roundtrip_matches_numpy_emulation(isa: str, fmt: str) -> None:
    emulate = {
        "f32": lambda v: v,
        "f16": refmodel.rt_f16,
        "q8_0": refmodel.rt_q8_0,
        "q8_head": refmodel.rt_q8_head,
        "q4_0": refmodel.rt_q4_0,
    }[fmt]
    rng = np.random.default_rng(9)
    for _ in range(20):
        x = (rng.standard_normal(64) * rng.uniform(0.01, 10)).astype(np.float32)
        got, raw = _native._kv_roundtrip(isa, fmt, x)
        assert len(raw) == _native.kv_row_bytes(fmt, 64)
        want = emulate(x.astype(np.float64))
        step = np.abs(x).max() / (7 if fmt == "q4_0" else 127)
        # At most one quantization step apart (a rounding tie may go either way), usually equal.
        assert np.abs(got - want).max() <= step * 1.01 + 1e-6
        assert np.mean(np.abs(got - want) < 1e-5 * max(1.0, np.abs(x).max())) > 0.95


def test_f16_conversion_exact_on_special_values() -> None:
    x = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6.1e-5, 5.96e-8, 1e-9, 70000.0, np.inf, -np.inf], dtype=np.float32)
    x = np.concatenate([x, np.zeros(64 - len(x), np.float32)])
    got, _ = _native._kv_roundtrip("ref", "f16", x)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    nan_row = np.full(64, np.nan, np.float32)
    assert np.isnan(_native._kv_roundtrip("ref", "f16", nan_row)[0]).all()


def test_blocked_kv_formats_reject_odd_head_dim() -> None:
    for fmt in ("q4_0", "q8_0", "q8_head"):
        with pytest.raises(ValueError, match="multiple of 32"):
            _native.kv_row_bytes(fmt, 48)
    assert _native.kv_row_bytes("f16", 48) == 96
    assert _native.kv_row_bytes("q8_head", 96) == 96 + 4


def test_unknown_isa_level_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not available"):
        _native._kernel_dot("sve9", np.zeros(4, np.float32), np.zeros(4, np.float32))


@pytest.mark.parametrize("isa", ISA_LEVELS)
def test_quantize_act_matches_numpy(isa: str) -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(96) * 3).astype(np.float32)
    x[:32] = 0.0  # an all-zero block must give d = 0 and zeros
    q, d, ds = _native._kernel_quantize_act(isa, x)
    blocks = x.reshape(3, 32)
    want_d = np.abs(blocks).max(axis=1) / np.float32(127)
    np.testing.assert_allclose(d, want_d, rtol=1e-6)
    assert (q[:32] == 0).all() and d[0] == 0.0
    inv = np.where(want_d > 0, 1 / np.where(want_d > 0, want_d, 1), 0).astype(np.float32)
    want_q = np.rint(blocks * inv[:, None]).ravel()
    assert np.mean(q == want_q) > 0.98 and np.abs(q - want_q).max() <= 1  # ties may round either way
    np.testing.assert_allclose(ds, d * q.reshape(3, 32).sum(axis=1), rtol=1e-6)


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("wt", ["Q4_0", "Q4_1", "Q8_0"])
def test_integer_dot_matches_float64(isa: str, wt: str) -> None:
    """dot_q(w, quantize(x)) equals the float64 dot of the dequantized weights with the
    dequantized activations (both derived with numpy), to float32 rounding."""
    rng = np.random.default_rng(13)
    n = 32 * 19  # odd block count
    w = (rng.standard_normal(n) * 0.2).astype(np.float32)
    x = (rng.standard_normal(n) * 2).astype(np.float32)
    raw = quantize(w.reshape(1, n), QTYPES[wt])
    wd = dequantize(raw, QTYPES[wt]).ravel().astype(np.float64)
    q, d, _ = _native._kernel_quantize_act(isa, x)
    xd = q.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
    want = float(wd @ xd)
    got = _native._kernel_dot_q(isa, wt, raw.tobytes(), x)
    assert abs(got - want) <= 1e-5 * float(np.abs(wd) @ np.abs(xd))


ATTN_FORMATS = ["f32", "f16", "q8_0", "q8_head", "q4_0"]


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("kf", ATTN_FORMATS)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_attention_kernels_match_float64(isa: str, kf: str, group: int) -> None:
    """One K row scored against a GQA group of queries, one V row accumulated."""
    rng = np.random.default_rng(17)
    hd = 64
    k = rng.standard_normal(hd).astype(np.float32)
    v = rng.standard_normal(hd).astype(np.float32)
    q = rng.standard_normal((group, hd)).astype(np.float32)
    w = rng.uniform(0, 1, group).astype(np.float32)
    scores, acc = _native._kernel_attn(isa, kf, kf, k, v, q, w)
    kd = _native._kv_roundtrip("ref", kf, k)[0].astype(np.float64)
    vd = _native._kv_roundtrip("ref", kf, v)[0].astype(np.float64)
    if kf in ("f32", "f16"):
        qd = q.astype(np.float64)
    elif kf == "q8_head":  # one 8-bit scale per query head
        qd = np.stack([refmodel.rt_q8_query_head(row) for row in q])
    else:  # integer keys: queries are quantized to 8-bit blocks first
        qd = np.stack([refmodel.rt_q8_act(row) for row in q])
    want_scores = qd @ kd
    scale = np.abs(qd) @ np.abs(kd)
    assert (np.abs(scores - want_scores) <= 1e-5 * scale + 1e-6).all()
    np.testing.assert_allclose(acc, w[:, None].astype(np.float64) * vd[None, :], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("kf", ATTN_FORMATS)
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8, 12])
@pytest.mark.parametrize("hd", [64, 96, 128])
def test_attention_blocks_match_float64(isa: str, kf: str, group: int, hd: int) -> None:
    """A block of 21 K/V rows (8-row score groups and a tail) scored against a GQA group and
    accumulated with softmax-like weights: every group size the bodies specialise on (1-8) and a
    run-time one (12); head dims with a pair of 32-element blocks and an odd one (96)."""
    rng = np.random.default_rng(29 + group + hd)
    cnt = 21
    k = rng.standard_normal((cnt, hd)).astype(np.float32)
    v = rng.standard_normal((cnt, hd)).astype(np.float32)
    q = rng.standard_normal((group, hd)).astype(np.float32)
    w = rng.uniform(0, 1, (group, cnt)).astype(np.float32)
    scores, acc = _native._kernel_attn_rows(isa, kf, kf, k, v, q, w)
    kd = np.stack([_native._kv_roundtrip("ref", kf, row)[0] for row in k]).astype(np.float64)
    vd = np.stack([_native._kv_roundtrip("ref", kf, row)[0] for row in v]).astype(np.float64)
    if kf in ("f32", "f16"):
        qd = q.astype(np.float64)
    elif kf == "q8_head":
        qd = np.stack([refmodel.rt_q8_query_head(row) for row in q])
    else:
        qd = np.stack([refmodel.rt_q8_act(row) for row in q])
    want_scores = qd @ kd.T  # (G, cnt)
    assert (np.abs(scores - want_scores) <= 1e-5 * (np.abs(qd) @ np.abs(kd.T)) + 1e-6).all()
    want_acc = w.astype(np.float64) @ vd  # (G, hd)
    assert (np.abs(acc - want_acc) <= 1e-5 * (w.astype(np.float64) @ np.abs(vd)) + 1e-6).all()


@pytest.mark.parametrize("isa", ISA_LEVELS)
def test_exp_sum_matches_float64(isa: str) -> None:
    rng = np.random.default_rng(19)
    x = rng.uniform(-60, 0, 203).astype(np.float32)  # odd length: the scalar tail runs
    x[7] = 0.0
    got, total = _native._kernel_exp_sum(isa, x, 0.5)
    want = np.exp(x.astype(np.float64) - 0.5)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
    assert abs(total - want.sum()) <= 1e-5 * want.sum()
