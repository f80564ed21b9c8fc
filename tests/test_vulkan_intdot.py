"""The Vulkan backend's integer-dot path (issue 16) against the CPU reference kernels, on Mesa's lavapipe.

Where the device has shaderIntegerDotProduct, Engine(backend="vulkan") quantizes activations to 8-bit blocks
(quantize_q8.comp, kernels/ref.cpp's quantize_act) and multiplies quantized weights with packed 4x8-bit dots
(matmul_dot.comp: Q4_0, Q4_1, Q8_0; matmul_dot_kquant.comp: Q5_0, Q5_1, the K-quants, IQ4), and scores
q8_0 / q8_head / q4_0 keys against 8-bit queries (attention_rows.comp INTDOT=1), as the CPU engine does.
Checked here:
- every integer-dot matmul shader against float64 sums of kernels/ref.cpp's dot_q terms over the CPU
  reference kernel's quantized activations (the integer sums are exact, so only float32 rounding of a few
  scale products and of the sum over blocks remains), both the subgroup and the plain variant; the newer
  formats also against the reference kernel's dot_q itself;
- engine logits against the CPU engine (integer activations) on the tiny models, weight formats x K formats;
- the same tests with KVSWARM_VULKAN_INTDOT=0 (the float path, against the CPU engine with float activations);
- the default model with quantized keys against the CPU engine (docs/GPU.md "What is left", item 2).

Skipped, with the reason, without a Vulkan device (KVSWARM_REQUIRE_VULKAN=1 makes that a failure); the
integer-dot cases skip on a device without shaderIntegerDotProduct. KVSWARM_VULKAN_DEVICE=N picks a device.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import vulkan_helpers  # tests/
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from test_kquants import NEW_TYPES, elements_per_block, random_blocks
from tinymodels import default_model_file, tiny_model
from vulkan_device import vulkan_device  # tests/
from vulkan_helpers import assert_batch_invariant, rel_err, run_pytest

from worker import _native
from worker.engine import Engine

QK = 32  # elements per block of every integer-dot format and of the 8-bit activations
U = 2.0**-24  # float32 unit roundoff
INTDOT_WEIGHT_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # matmul_dot.comp's formats
# matmul_dot_kquant.comp's: Q5_0, Q5_1, the K-quants, IQ4_NL, IQ4_XS (test_kquants.NEW_TYPES)
INTDOT_NEW_TYPES = tuple(NEW_TYPES)
QUANTIZED_KEYS = ("q8_0", "q8_head", "q4_0")  # attention_rows.comp INTDOT=1's key formats

# Named limits.
# matmul, per output, relative to sum_b M_b (M_b: the magnitudes of block b's float terms, below): the
# integer sum of a block is exact on both sides; its terms take at most 3 roundings (dot_q's chain: the
# product d_w * d_a, fma(s, d_w d_a, acc), Q4's fma with ds_a), the running sum over a thread's blocks one
# per block, and the sum of the threads at most 8 levels of the workgroup's tree (or subgroup) sum of up to
# 256 threads: (3 + nb + 8) * 2^-24.
MATMUL_ROUNDINGS_PER_BLOCK = 3
MATMUL_TREE_LEVELS = 8
# The newer formats: dot_q's chain per block (exact integer half sums times integer scales, then two or three
# fmas with the float scales) against float64 over gguf-py's dequantized weights and the reference kernel's
# quantized activations, relative to sum |w| |x_hat|, with test_kquants.py's allowance of 8 float32
# roundings per block, plus the tree as above.
NEW_ROUNDINGS_PER_BLOCK = 8
# Engine logits, as a share of the largest |logit| of the CPU engine's rows. Both engines quantize the same
# activations and queries with the same encoding and sum exact integer dots; their float32 values differ by
# summation order (n-term sums err by ~n * 2^-24 relative, n <= 576 here: 3e-5 per op). Where no 8-bit
# rounding lands on the other side of its boundary ("exact" cells below), the logits agree to that: measured
# 1e-7 to 8e-7 on lavapipe.
INT_REL_LIMIT = 1e-4
# Where one does ("flips" cells: 4-bit or per-head keys stored from values 1e-7 apart), a quant moves by a
# whole step and the model amplifies it (the device alone moves its logits by 1.4e-2 when only its matmul's
# summation order changes, KVSWARM_VULKAN_SUBGROUP=0). A flip is one rounding of the many the 8-bit path makes
# going the other way, so its effect is a share of the whole rounding's: the CPU engine's logits with 8-bit
# activations and keys against float activations and f32 K/V, measured in the test (measured shares 0.15 to
# 0.32 on the tiny models; the limit allows 0.5).
FLIP_SHARE_LIMIT = 0.5
# The float path (KVSWARM_VULKAN_INTDOT=0) against the CPU engine with float activations: float32 summation
# order only (test_vulkan_engine.py's FLOAT_REL_LIMIT); with quantized keys the CPU engine still scores
# 8-bit queries and the device float ones (its QUERY_Q8_REL_LIMIT, measured 1.2e-2).
FLOAT_REL_LIMIT = 1e-4
QUERY_Q8_REL_LIMIT = 5e-2
# Greedy ids must agree where the reference's best logit leads the second by more than this share of the
# largest |logit| (test_vulkan_engine.py's).
GREEDY_CLEAR_MARGIN = 1e-2

PROMPT = [1, 5, 9, 33, 70, 2, 8, 100, 11, 12, 13, 40, 41, 42, 43, 44, 45]
SCORED = 4  # logits compared for the last SCORED tokens of a prompt
BLOCK_TOKENS = 4  # small blocks: a prompt spans many
CHUNK = 5  # max_batch_tokens: prefill chunks start inside blocks


@pytest.fixture(scope="module")
def device() -> int:
    return vulkan_device()


def has_intdot(device: int) -> bool:
    return bool(_native.vulkan_devices()[device]["integer_dot_product"])


def need_intdot(device: int) -> None:
    if not has_intdot(device):
        pytest.skip("this Vulkan device has no shaderIntegerDotProduct: the float path runs (test_vulkan.py)")


# ---------------------------------------------------------------------------
# The device and the path it takes
# ---------------------------------------------------------------------------


def test_path_follows_the_device(device: int) -> None:
    """Integer dots where the device offers them (enabled at vkCreateDevice: the shaders would not build
    pipelines otherwise), float where it does not or when asked for float activations."""
    want = "integer dot" if has_intdot(device) else "float"
    if os.environ.get("KVSWARM_VULKAN_INTDOT") == "0":
        want = "float"
    assert _native._backend_dot_path("vulkan", device, integer_dot=True) == want
    assert _native._backend_dot_path("vulkan", device) == "float"  # the op hooks' float path (test_vulkan.py)
    path = tiny_model("llama", "Q8_0")
    assert Engine(path, backend="vulkan", device=device).dot_path == want
    assert Engine(path, backend="vulkan", device=device, float_activations=True).dot_path == "float"
    assert Engine(path).dot_path == "integer dot"
    assert Engine(path, float_activations=True).dot_path == "float"


# ---------------------------------------------------------------------------
# matmul_dot.comp against the reference kernel's dot_q, term by term in float64
# ---------------------------------------------------------------------------


def _weight_blocks(wt: str, raw: bytes, rows: int, nb: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d (rows, nb), m (rows, nb), q (rows, nb, 32) int64) of GGUF rows: quants as dot_q reads them (Q4:
    nibble values 0..15, element i < 16 in the low nibble of byte i, 16 + i in its high nibble)."""
    block_bytes = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[wt]
    b = np.frombuffer(raw, np.uint8).reshape(rows, nb, block_bytes)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = np.zeros_like(d)
    if wt == "Q8_0":
        return d, m, b[..., 2:].view(np.int8).astype(np.int64)
    if wt == "Q4_1":
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    qs = b[..., block_bytes - 16 :].astype(np.int64)
    return d, m, np.concatenate([qs & 15, qs >> 4], axis=-1)


def _reference(wt: str, raw: bytes, rows: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(want (T, rows), bound (T, rows)): float64 sums over blocks of dot_q's terms on the reference kernel's
    quantized activations, and sum_b M_b (the magnitudes of each term's float operands)."""
    T, cols = x.shape
    nb = cols // QK
    dw, mw, qw = _weight_blocks(wt, raw, rows, nb)
    want = np.empty((T, rows))
    mag = np.empty((T, rows))
    for t in range(T):
        qa, da, dsa = (np.asarray(v, np.float64) for v in _native._kernel_quantize_act("ref", x[t]))
        s = np.einsum("rbi,bi->rb", qw, qa.reshape(nb, QK).astype(np.int64)).astype(np.float64)  # exact
        if wt == "Q4_0":  # d_w * (d_a * s - 8 * ds_a)
            terms = dw * (da * s - 8.0 * dsa)
            m_b = np.abs(dw) * (np.abs(da * s) + np.abs(8.0 * dsa))
        elif wt == "Q4_1":  # d_w * d_a * s + m_w * ds_a
            terms = dw * da * s + mw * dsa
            m_b = np.abs(dw * da * s) + np.abs(mw * dsa)
        else:  # d_w * d_a * s
            terms = dw * da * s
            m_b = np.abs(terms)
        want[t], mag[t] = terms.sum(1), m_b.sum(1)
    return want, (MATMUL_ROUNDINGS_PER_BLOCK + nb + MATMUL_TREE_LEVELS) * U * mag


@pytest.mark.parametrize("nb", [3, 70])  # 70 blocks: more than the 64 threads of a workgroup
@pytest.mark.parametrize("T", [1, 19])  # 19: two full passes of 8 activation rows and a partial one
@pytest.mark.parametrize("wt", INTDOT_WEIGHT_TYPES)
def test_matmul_integer_dot(device: int, wt: str, T: int, nb: int) -> None:
    need_intdot(device)
    if os.environ.get("KVSWARM_VULKAN_INTDOT") == "0":
        pytest.skip("KVSWARM_VULKAN_INTDOT=0: the float path (test_vulkan.py::test_matmul)")
    rows, cols = 37, nb * QK  # odd rows
    rng = np.random.default_rng(1000 * nb + T)
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGMLQuantizationType[wt]).tobytes()
    # Activations with an outlier column (as real ones have): most blocks use a small part of their 8 bits.
    x = rng.standard_normal((T, cols)).astype(np.float32)
    x[:, 5] *= 40.0
    want, bound = _reference(wt, raw, rows, x)
    got = _native._backend_matmul("vulkan", device, wt, raw, rows, cols, x, integer_dot=True)
    assert got.shape == (T, rows) and np.isfinite(got).all()
    assert np.all(np.abs(got - want) <= bound)
    # One activation quant a step off would move an output by d_w * d_a * |q_w|: far past the bound.
    assert np.all(bound < 1e-3 * np.abs(want).max())


@pytest.mark.parametrize("T", [1, 19])
@pytest.mark.parametrize("wt", INTDOT_NEW_TYPES)
def test_matmul_integer_dot_new_formats(device: int, wt: str, T: int) -> None:
    need_intdot(device)
    if os.environ.get("KVSWARM_VULKAN_INTDOT") == "0":
        pytest.skip("KVSWARM_VULKAN_INTDOT=0: the float path (test_vulkan.py::test_matmul)")
    rows, per_row = 37, 3 * 256 // elements_per_block(wt)  # 768 elements: 24 blocks of 32 per row
    cols = per_row * elements_per_block(wt)
    nb = cols // QK
    raw = random_blocks(wt, rows * per_row, seed=300 + T + len(wt))
    w = dequantize(raw.reshape(-1), GGMLQuantizationType[wt]).reshape(rows, cols).astype(np.float64)
    rng = np.random.default_rng(400 + T)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    x[:, 5] *= 40.0
    x_hat = np.empty((T, cols))
    for t in range(T):
        q, d, _ = _native._kernel_quantize_act("ref", x[t])
        x_hat[t] = q.astype(np.float64) * np.repeat(d.astype(np.float64), QK)
    want = x_hat @ w.T
    bound = (NEW_ROUNDINGS_PER_BLOCK + nb + MATMUL_TREE_LEVELS) * U * (np.abs(x_hat) @ np.abs(w).T)
    got = _native._backend_matmul("vulkan", device, wt, raw.tobytes(), rows, cols, x, integer_dot=True)
    assert got.shape == (T, rows) and np.isfinite(got).all()
    assert np.all(np.abs(got - want) <= bound)
    # The reference kernel's own dot_q of each row agrees within both sums' roundings.
    rb = len(raw.tobytes()) // rows
    ref = np.array([[_native._kernel_dot_q("ref", wt, raw.tobytes()[r * rb : (r + 1) * rb], x[t]) for r in range(rows)]
                    for t in range(T)])  # fmt: skip
    assert np.all(np.abs(got - ref) <= 2 * bound)


def test_matmul_integer_dot_plain_variant(device: int) -> None:
    """test_matmul_integer_dot(_new_formats) again with KVSWARM_VULKAN_SUBGROUP=0 (a fresh process: the backend reads it
    once), so the workgroup-reduction variant of every matmul_dot shader runs too."""
    need_intdot(device)
    if not _native.vulkan_devices()[device]["subgroup_arithmetic"]:
        pytest.skip("this device runs the plain variant in test_matmul_integer_dot already")
    env = dict(os.environ, KVSWARM_VULKAN_SUBGROUP="0", KVSWARM_VULKAN_DEVICE=str(device))
    env.pop("KVSWARM_VULKAN_INTDOT", None)
    names = ("test_matmul_integer_dot", "test_matmul_integer_dot_new_formats")
    run_pytest(
        [f"{__file__}::{t}" for t in names], env, passed=len(INTDOT_WEIGHT_TYPES) * 4 + len(INTDOT_NEW_TYPES) * 2
    )


# ---------------------------------------------------------------------------
# attention_rows.comp INTDOT=1 against the reference kernel's attn_scores
# ---------------------------------------------------------------------------

# The device's scores are the reference kernel's (the same quantized query, exact integer dots, the same
# chain of float operations per position), so what remains is the float32 softmax and V sum over the
# positions: outputs are convex combinations of unit-scale V rows, a few float32 ulp (test_vulkan.py's
# ATTN_ABS_LIMIT).
ATTN_ABS_LIMIT = 2e-5
ATTN_INT_PAIRS = [("q8_0", "q8_0"), ("q8_head", "f16"), ("q4_0", "q4_0"), ("q8_head", "q8_head"), ("q4_0", "f32")]


@pytest.mark.parametrize(("kv_k", "kv_v"), ATTN_INT_PAIRS)
def test_attention_rows_integer_dot(device: int, kv_k: str, kv_v: str) -> None:
    """Two sequences' rows over their own block tables in one pool: 150 and 37 positions (three chunks of
    the shader's online softmax; a partial last block), GQA 2:1, head_dim 64."""
    need_intdot(device)
    if os.environ.get("KVSWARM_VULKAN_INTDOT") == "0":
        pytest.skip("KVSWARM_VULKAN_INTDOT=0: the float path (test_vulkan.py::test_attention)")
    n_head, n_kv, hd, bt = 4, 2, 64, 16
    lengths = (150, 37)
    rng = np.random.default_rng(29)
    k_row, v_row = _native.kv_row_bytes(kv_k, hd), _native.kv_row_bytes(kv_v, hd)
    block_bytes = n_kv * bt * (k_row + v_row)
    v_offset = n_kv * bt * k_row
    n_blocks = [(n + bt - 1) // bt for n in lengths]
    pool_blocks = sum(n_blocks) + 2  # unused blocks hold garbage that must never be read
    order = rng.permutation(pool_blocks).astype(np.int32)
    tables = [order[: n_blocks[0]], order[n_blocks[0] : n_blocks[0] + n_blocks[1]]]
    pool = bytearray(rng.integers(0, 256, pool_blocks * block_bytes, dtype=np.uint8).tobytes())
    kf = [rng.standard_normal((n, n_kv, hd)).astype(np.float32) for n in lengths]  # the rows before storing
    vf = [rng.standard_normal((n, n_kv, hd)).astype(np.float32) for n in lengths]
    for seq, n in enumerate(lengths):
        for pos in range(n):
            base = int(tables[seq][pos // bt]) * block_bytes
            for h in range(n_kv):
                ko = base + (h * bt + pos % bt) * k_row
                vo = base + v_offset + (h * bt + pos % bt) * v_row
                pool[ko : ko + k_row] = _native._kv_roundtrip("ref", kv_k, kf[seq][pos, h])[1]
                pool[vo : vo + v_row] = _native._kv_roundtrip("ref", kv_v, vf[seq][pos, h])[1]
    # Rows: the last position of sequence 0, then two rows of sequence 1 (a prefill chunk, causal).
    rows = np.array([[lengths[0] - 1, 0], [lengths[1] - 2, n_blocks[0]], [lengths[1] - 1, n_blocks[0]]], np.int32)
    seq_of = [0, 1, 1]
    q = rng.standard_normal((len(rows), n_head, hd)).astype(np.float32)
    scale = np.float32(1.0 / np.sqrt(hd))
    got = _native._backend_attention_rows(
        "vulkan", device, q, bytes(pool), np.concatenate(tables), rows, n_head_kv=n_kv, block_tokens=bt,
        scale=float(scale), block_bytes=block_bytes, k_offset=0, v_offset=v_offset, kv_k=kv_k, kv_v=kv_v,
        integer_dot=True,
    )  # fmt: skip
    assert got.shape == q.shape and np.isfinite(got).all()
    want = np.empty(q.shape)
    group = n_head // n_kv
    for t, (pos, _) in enumerate(rows):
        seq, n = seq_of[t], pos + 1
        for kh in range(n_kv):
            qs = q[t, kh * group : (kh + 1) * group] * scale  # float32, as both engines scale the query
            w0 = np.zeros((group, n), np.float32)
            scores, _ = _native._kernel_attn_rows("ref", kv_k, kv_v, kf[seq][:n, kh], vf[seq][:n, kh], qs, w0)
            v = np.stack([_native._kv_roundtrip("ref", kv_v, vf[seq][p, kh])[0] for p in range(n)]).astype(np.float64)
            e = np.exp(scores.astype(np.float64) - scores.max(axis=1, keepdims=True))
            want[t, kh * group : (kh + 1) * group] = (e / e.sum(axis=1, keepdims=True)) @ v
    assert np.abs(got - want).max() <= ATTN_ABS_LIMIT
    # The float path's (float queries) differs by the query's 8-bit rounding: far past the limit.
    float_path = _native._backend_attention_rows(
        "vulkan", device, q, bytes(pool), np.concatenate(tables), rows, n_head_kv=n_kv, block_tokens=bt,
        scale=float(scale), block_bytes=block_bytes, k_offset=0, v_offset=v_offset, kv_k=kv_k, kv_v=kv_v,
    )  # fmt: skip
    assert np.abs(float_path - want).max() > 10 * ATTN_ABS_LIMIT


# ---------------------------------------------------------------------------
# Engine logits against the CPU engine: weight formats x K formats
# ---------------------------------------------------------------------------


# This file's scored positions and greedy margin.
tail_logits = partial(vulkan_helpers.tail_logits, scored=SCORED)
clear_argmax_agrees = partial(vulkan_helpers.clear_argmax_agrees, margin=GREEDY_CLEAR_MARGIN)


def cpu_reference(vk: Engine, path: Path, isa: str, **kw: Any) -> tuple[Engine, float]:
    """The CPU engine that computes what the device engine `vk` computes, and the limit against it: integer
    activations on the integer-dot path; float activations (and so float-query rounding alone apart, for
    quantized keys) on the float path."""
    integer = vk.dot_path == "integer dot"
    cpu = Engine(path, isa=isa, float_activations=not integer, **kw)
    if integer:
        return cpu, INT_REL_LIMIT
    return cpu, QUERY_Q8_REL_LIMIT if kw.get("kv_k") in QUANTIZED_KEYS else FLOAT_REL_LIMIT


CELLS = [  # (family, weight type, K format, V format, "exact" | "flips" on lavapipe: see INT_REL_LIMIT)
    ("llama", "Q8_0", "f16", "f16", "exact"),
    ("llama", "Q4_0", "q8_0", "q8_0", "exact"),
    ("llama", "Q4_1", "q4_0", "f16", "exact"),
    ("llama", "Q8_0", "q8_head", "q4_0", "flips"),
    ("qwen2", "F32", "q8_0", "f32", "exact"),  # GQA 2:1; float weights: the integer-dot scores alone
    ("qwen2", "F32", "q8_head", "q8_head", "exact"),
    ("qwen2", "Q8_0", "q4_0", "q4_0", "flips"),
    ("qwen3", "Q8_0", "q8_0", "f16", "exact"),  # per-head q/k norms before the scores
    ("gemma3", "Q8_0", "q8_head", "f16", "flips"),  # sliding-window layers
    ("llama", "Q4_K_M", "q8_0", "f16", "exact"),  # llama.cpp's mix: Q5_0, Q4_K, Q6_K, Q8_0 (matmul_dot_kquant)
    ("qwen2", "Q4_K_M", "q8_0", "f16", "exact"),
]


@pytest.mark.parametrize(("family", "weight_type", "kv_k", "kv_v", "regime"), CELLS)
def test_logits_match_cpu_engine(device: int, family: str, weight_type: str, kv_k: str, kv_v: str, regime: str) -> None:
    path = tiny_model(family, weight_type)
    kw: dict[str, Any] = {"kv_k": kv_k, "kv_v": kv_v, "block_tokens": BLOCK_TOKENS, "max_batch_tokens": CHUNK}
    vk = Engine(path, backend="vulkan", device=device, **kw)
    got = tail_logits(vk, PROMPT)
    # Against the reference kernels (kernels/ref.cpp: the integer path's definition).
    cpu, limit = cpu_reference(vk, path, "ref", **kw)
    ref = tail_logits(cpu, PROMPT)
    if vk.dot_path == "integer dot" and regime == "flips":
        float_kv = {**kw, "kv_k": "f32", "kv_v": "f32"}
        rounding = rel_err(ref, tail_logits(Engine(path, isa="ref", float_activations=True, **float_kv), PROMPT))
        limit = FLIP_SHARE_LIMIT * rounding
    assert rel_err(got, ref) <= limit, vk.dot_path
    clear_argmax_agrees(got, ref)


def test_batch_invariance(device: int) -> None:
    """On the integer-dot path too a sequence's logits are bit-equal alone and in a batch of four (decodes and
    prefill chunks of the others in the same steps): each row is quantized, multiplied and scored alone."""
    eng = Engine(
        tiny_model("llama", "Q4_1"), backend="vulkan", device=device, kv_k="q8_0", kv_v="q4_0",
        block_tokens=BLOCK_TOKENS, max_batch_tokens=6,
    )  # fmt: skip
    n_vocab = eng.config["n_vocab"]
    prompts = [[(31 * i + 7 * s) % n_vocab for i in range(n)] for s, n in ((1, 5), (2, 13), (3, 1), (4, 9))]
    assert_batch_invariant(eng, prompts, n_new=3)


def test_float_path_when_asked(device: int) -> None:
    """KVSWARM_VULKAN_INTDOT=0 (a fresh process: the backend reads it once) runs this file's engine tests on
    the float path, against the CPU engine with float activations."""
    need_intdot(device)
    env = dict(os.environ, KVSWARM_VULKAN_INTDOT="0", KVSWARM_VULKAN_DEVICE=str(device))
    tests = [f"{__file__}::{t}" for t in ("test_path_follows_the_device", "test_logits_match_cpu_engine")]
    run_pytest(tests, env, passed=1 + len(CELLS))


# ---------------------------------------------------------------------------
# The default model with quantized keys (docs/GPU.md "What is left", item 2)
# ---------------------------------------------------------------------------

# SmolLM2-135M amplifies a rounding flip more than the tiny models do: on lavapipe the device alone moves its
# logits by 2.7e-2 when only its matmul's summation order changes (2e-4 on the float path), and the integer
# path differs from the CPU engine by 4.2e-2 with q8_0 K/V: 0.59 of the whole 8-bit rounding's effect (7.1e-2:
# the CPU engine with 8-bit activations and keys against float activations and f32 K/V). A float tolerance
# cannot hold there (docs/GPU.md); the bound is on the steps instead:
# - layer 0's K and V rows, whose inputs (the embedding rows) are the same bytes on both engines: no quant
#   more than one step from the CPU engine's (a flip is one step), at most FLIPPED_SHARE_LIMIT of them one
#   step off (measured 0.4% of K's, 1.8% of V's), every scale within a step of its own;
# - the logits: flips are some of the 8-bit roundings going the other way, so they move the logits by less
#   than the whole rounding does (DEFAULT_FLIP_SHARE_LIMIT of it, measured in the test).
FLIPPED_SHARE_LIMIT = 0.05
DEFAULT_FLIP_SHARE_LIMIT = 1.0
Q8_0_ROW_BLOCK_BYTES = 34  # BlockQ8_0 {f16 d; i8 qs[32]}
SNAPSHOT_HEADER_BYTES = 88  # kv_transfer.h KvSnapshotHeader
SNAPSHOT_CHECKSUM_BYTES = 8


def layer0_q8_0_rows(blob: bytes, cfg: dict[str, Any], n_past: int) -> tuple[np.ndarray, np.ndarray]:
    """(scales (2, n_head_kv * n_past, blocks) float64, quants (2, ..., 32) int64) of layer 0's K and V rows
    in a q8_0 / q8_0 KV snapshot (kv_transfer.h: header, layer flags, tokens, then per layer K then V rows,
    each kv head's positions in order)."""
    n_layer, n_kv, hd = cfg["n_layer"], cfg["n_head_kv"], cfg["head_dim"]
    row_bytes = hd // QK * Q8_0_ROW_BLOCK_BYTES
    rows_bytes = n_kv * n_past * row_bytes  # one part of one layer
    first = SNAPSHOT_HEADER_BYTES + n_layer + 4 * n_past
    assert len(blob) == first + 2 * n_layer * rows_bytes + SNAPSHOT_CHECKSUM_BYTES
    b = np.frombuffer(blob, np.uint8)[first : first + 2 * rows_bytes].reshape(2, n_kv * n_past, hd // QK, -1)
    scales = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    return scales, b[..., 2:].view(np.int8).astype(np.int64)


def test_default_model_quantized_keys(device: int) -> None:
    need_intdot(device)
    if os.environ.get("KVSWARM_VULKAN_INTDOT") == "0":
        pytest.skip("KVSWARM_VULKAN_INTDOT=0: the float path's default-model cells are test_vulkan_engine.py's")
    path = default_model_file()
    runs: dict[str, tuple[np.ndarray, bytes]] = {}
    for name, opts in (("cpu", {"isa": "ref"}), ("vulkan", {"backend": "vulkan", "device": device})):
        eng = Engine(path, kv_k="q8_0", kv_v="q8_0", **opts)
        assert eng.dot_path == "integer dot"
        prompt = eng.encode_prompt("The capital of France is")  # one prefill step, two scored positions
        sid = eng.add_sequence(prompt[:-2], generate=False)
        while eng.busy():
            eng.step()
        logits = eng.score(sid, prompt[-2:])
        runs[name] = (logits, eng.export_kv(sid))
        cfg = eng.config
    float_eng = Engine(path, isa="ref", float_activations=True, kv_k="f32", kv_v="f32")
    rounding = rel_err(runs["cpu"][0], tail_logits(float_eng, prompt, scored=2))

    (ds_cpu, q_cpu), (ds_vk, q_vk) = (layer0_q8_0_rows(runs[n][1], cfg, len(prompt)) for n in ("cpu", "vulkan"))
    steps = np.abs(q_vk - q_cpu)
    assert steps.max() <= 1
    assert (steps > 0).mean() <= FLIPPED_SHARE_LIMIT
    # A scale is amax / 127 of the row's values before rounding: where they move by less than a step, so does
    # amax (plus one f16 rounding of d: 10 fraction bits).
    assert np.all(np.abs(ds_vk - ds_cpu) <= np.abs(ds_cpu) * (1.0 / 127.0 + 2.0**-10))

    assert rel_err(runs["vulkan"][0], runs["cpu"][0]) <= DEFAULT_FLIP_SHARE_LIMIT * rounding
