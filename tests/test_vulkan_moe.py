"""qwen3moe on the device (issue 16, docs/GPU.md "Routed experts on the device"), on Mesa's lavapipe.

Engine(backend="vulkan") runs the routed experts through native/device_forward.cpp's moe_ffn: the router's
matmul on the device, top-k and softmax weights on the host by model.cpp's rule (moe_route), the routed
rows gathered into expert-grouped rows (gather_rows), each expert's gate/up/down matmuls over views into the
stacked expert tensors (matmul_view), SwiGLU, and each token's weighted mix of its experts' rows
(combine_rows). Checked here: each new op on both backends against float64 NumPy; the engine's logits
against the CPU engine (backend "cpu") and backend "cpu-ops" (the device forward over the CPU backend's
ops) for prefill and decode; greedy ids; batch invariance (bit-equal logits alone and together); a model
whose shapes make every expert's slice and group of rows need padding to their aligned views.

Skipped, with the reason, when the module has no Vulkan backend or no device is present;
KVSWARM_REQUIRE_VULKAN=1 (CI) makes that a failure. KVSWARM_VULKAN_DEVICE=N picks a device.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tinymodels
import vulkan_helpers  # tests/
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from test_architectures import CHUNK as REF_CHUNK
from test_architectures import REF_LOGIT_TOL, qwen3moe_reference
from test_architectures import prompt as ref_prompt
from tinymodels import TINY_SPECS, tiny_model
from vulkan_device import vulkan_device  # tests/
from vulkan_helpers import assert_batch_invariant, device_of, greedy_run, rel_err

from worker import _native
from worker.engine import Engine

# Named limits.
# Logits, as a share of the largest |logit| of the CPU engine's rows. Every engine here computes in float32
# (the CPU engine with float_activations, so quantized weights are decoded and dotted in float as the shaders
# do); they differ in summation order only, and pick the same experts wherever a token's second and third
# router probabilities are further apart than float32 rounding (the tiny model's router, std 3/sqrt(E),
# separates them widely at most tokens; a flipped choice would move the logits by O(1), far past the
# limit, so the limit also checks the choice). n-term float32 sums err by
# ~n * 2^-24 relative per op (n <= 256 here, the experts' down projection: 1.5e-5), and with f16 KV (the
# default) an element of K or V whose float32 inputs differ that much may round to the neighbouring half
# (2^-11 relative). Measured 2.3e-5 on the tiny qwen3moe (F32, Q8_0 and Q4_0 weights, device vs cpu-ops;
# the dense tiny qwen3 measures 1.7e-5 alike); the limit allows 4x that.
MOE_REL_LIMIT = 1e-4

# Against the float64 NumPy forward of tests/test_architectures.py (f32 KV, F32 weights): its limit on
# max |logit - reference| (REF_LOGIT_TOL, 1e-3, logits of std ~4); the device measures 5.2e-5, the CPU
# engine 2.0e-5.

# The integer-dot path (float_activations False, where the device has shaderIntegerDotProduct): the device
# and the CPU engine quantize the same activations with the same encoding and sum exact integer dots, so
# they differ by float32 summation order as above (measured 6.8e-7), unless an 8-bit rounding lands on the
# other side of its boundary (a whole step, ~1e-2 here); none does at these prompts: MOE_REL_LIMIT holds.

# Greedy ids must agree where the CPU engine's best logit leads the second by more than this share of the
# largest |logit| (closer, float32 rounding may legitimately pick either).
GREEDY_CLEAR_MARGIN = 1e-2
# matmul_view: as tests/test_vulkan.py's MATMUL_REL_LIMIT, relative to sum |w x| per output (a product
# passes through at most ~45 float32 roundings: 2.7e-6).
MATMUL_REL_LIMIT = 1e-5
# combine_rows: K products and K sums in float32 per output, relative to sum_k |w_k s_k|:
# 2 * K * 2^-24 = 3.6e-7 for K = 3.
COMBINE_REL_LIMIT = 1e-6

VIEW_ALIGN = 256  # kBufferViewAlign (native/backend/backend.h): every matmul_view offset is a multiple
BACKENDS = ("cpu", "vulkan")
PROMPT = [1, 5, 9, 33, 70, 2, 8, 100, 11, 12, 13, 40, 41, 42, 43, 44, 45]
SCORED = 4  # logits compared for the last SCORED tokens of a prompt
BLOCK_TOKENS = 4  # small blocks: a prompt spans many, prefill chunks start inside them
CHUNK = 5  # max_batch_tokens: prefill runs in chunks of several tokens (several rows per expert)


@pytest.fixture(scope="module")
def device() -> int:
    return vulkan_device()


# This file's engines (float activations unless asked), scored positions and greedy margin.
make_engine = partial(vulkan_helpers.make_engine, block_tokens=BLOCK_TOKENS, max_batch_tokens=CHUNK)
tail_logits = partial(vulkan_helpers.tail_logits, scored=SCORED)
clear_argmax_agrees = partial(vulkan_helpers.clear_argmax_agrees, margin=GREEDY_CLEAR_MARGIN)


# ---------------------------------------------------------------------------
# The new ops against float64 NumPy, on both backends
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_rows(device: int, backend: str) -> None:
    T, n = 7, 37  # odd width: the shader's last workgroup is partial
    rng = np.random.default_rng(1)
    src = rng.standard_normal((T, n)).astype(np.float32)
    idx = np.array([3, 0, -1, 6, 3, T, 2, -7, 5], dtype=np.int32)  # repeats, and rows outside [0, T)
    want = np.zeros((len(idx), n), dtype=np.float32)
    for r, s in enumerate(idx):
        if 0 <= s < T:
            want[r] = src[s]
    got = _native._backend_gather_rows(backend, device_of(backend, device), src, idx)
    assert got.shape == want.shape
    assert np.array_equal(got, want)  # a copy is exact; zeros for the rows outside


@pytest.mark.parametrize("backend", BACKENDS)
def test_combine_rows(device: int, backend: str) -> None:
    R, n, T, K = 11, 37, 5, 3
    rng = np.random.default_rng(2)
    src = rng.standard_normal((R, n)).astype(np.float32)
    idx = rng.integers(0, R, size=(T, K)).astype(np.int32)
    idx[1, 2] = -1  # adds nothing
    idx[3, 0] = R  # outside too
    weight = rng.random((T, K)).astype(np.float32)
    want = np.zeros((T, n))
    scale = np.zeros((T, n))
    for t in range(T):
        for k in range(K):
            if 0 <= idx[t, k] < R:
                term = float(weight[t, k]) * src[idx[t, k]].astype(np.float64)
                want[t] += term
                scale[t] += np.abs(term)
    got = _native._backend_combine_rows(backend, device_of(backend, device), src, idx, weight)
    assert got.shape == (T, n)
    assert np.all(np.abs(got - want) <= COMBINE_REL_LIMIT * scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_ops_past_one_dispatch_axis(device: int, backend: str) -> None:
    """More rows than one dispatch axis holds (65535 workgroups): Vulkan spreads them over y and z."""
    rows = 65535 + 77
    rng = np.random.default_rng(5)
    src = rng.standard_normal((9, 1)).astype(np.float32)
    idx = rng.integers(-1, 9, size=rows).astype(np.int32)
    got = _native._backend_gather_rows(backend, device_of(backend, device), src, idx)
    assert np.array_equal(got[:, 0], np.where(idx >= 0, src[np.maximum(idx, 0), 0], 0.0).astype(np.float32))
    weight = np.full((rows, 1), 0.5, dtype=np.float32)  # 0.5 * x is exact
    mixed = _native._backend_combine_rows(backend, device_of(backend, device), src, idx[:, None], weight)
    assert np.array_equal(mixed, 0.5 * got)


def _stacked(wt: str, n_mat: int, rows: int, cols: int, seed: int) -> tuple[bytes, int]:
    """n_mat matrices (rows, cols) as `wt` bytes, matrix m at byte m * stride (stride: its bytes rounded up to
    VIEW_ALIGN, zeros between), and that stride."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_mat, rows, cols)).astype(np.float32)
    mats = [quantize(w[m], GGMLQuantizationType[wt]).tobytes() for m in range(n_mat)]
    stride = -(-len(mats[0]) // VIEW_ALIGN) * VIEW_ALIGN
    return b"".join(m + bytes(stride - len(m)) for m in mats), stride


def _dequantized(wt: str, raw: bytes, rows: int, cols: int) -> np.ndarray:
    """(rows, cols) float64 from the CPU reference kernel's dequantizer."""
    rb = len(raw) // rows
    return np.stack([_native._kernel_dequant("ref", wt, raw[r * rb : (r + 1) * rb], cols) for r in range(rows)]).astype(
        np.float64
    )


@pytest.mark.parametrize("wt", ["F32", "Q8_0", "Q4_0"])
@pytest.mark.parametrize(("backend", "integer_dot"), [("cpu", False), ("vulkan", False), ("vulkan", True)])
def test_matmul_view(device: int, backend: str, integer_dot: bool, wt: str) -> None:
    """Expert 1 of a stack of 3 (rows 37, cols 64) against rows [x_row0, x_row0 + T) of a larger x, into rows
    [y_row0, y_row0 + T) of a NaN-filled y: NaN left outside, bit-equal to matmul() on the same slice and
    rows inside (on Vulkan's float path and, where the device has it, its integer-dot path), and the float64
    product on the float paths."""
    n_mat, rows, cols, T = 3, 37, 64, 5
    raw, stride = _stacked(wt, n_mat, rows, cols, seed=3)
    assert stride % VIEW_ALIGN == 0
    rng = np.random.default_rng(4)
    x_rows, x_row0 = 12, 4  # 4 rows of 64 floats: 1024 bytes, aligned
    x = rng.standard_normal((x_rows, cols)).astype(np.float32)
    y_row0 = 64  # 64 rows of 37 floats: 9472 bytes = 37 * 256, aligned
    y_floats = (y_row0 + T + 3) * rows
    dev = device_of(backend, device)
    got = _native._backend_matmul_view(
        backend, dev, wt, raw, stride, rows, cols, x.ravel(), x_row0 * cols * 4, T, y_floats, y_row0 * rows * 4,
        integer_dot=integer_dot,
    )  # fmt: skip
    assert got.shape == (y_floats,)
    inside = got[y_row0 * rows : (y_row0 + T) * rows].reshape(T, rows)
    outside = np.concatenate([got[: y_row0 * rows], got[(y_row0 + T) * rows :]])
    assert np.isnan(outside).all()  # the op wrote its view only
    slice_raw = raw[stride : stride + _row_bytes(wt, cols) * rows]  # matrix 1
    xs = x[x_row0 : x_row0 + T]
    plain = _native._backend_matmul(backend, dev, wt, slice_raw, rows, cols, xs, integer_dot=integer_dot)
    assert np.array_equal(inside, plain)
    # The CPU backend's block formats quantize x (its matmul's rule), as the integer-dot path does.
    if (backend == "vulkan" and not integer_dot) or wt == "F32":
        wd = _dequantized(wt, slice_raw, rows, cols)
        want = xs.astype(np.float64) @ wd.T
        scale = np.abs(xs.astype(np.float64)) @ np.abs(wd).T
        assert np.all(np.abs(inside - want) <= MATMUL_REL_LIMIT * scale)


def _row_bytes(wt: str, cols: int) -> int:
    return {"F32": 4 * cols, "Q8_0": cols // 32 * 34, "Q4_0": cols // 32 * 18}[wt]


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_view_refuses_bad_views(device: int, backend: str) -> None:
    rows, cols, T = 8, 64, 2
    raw = np.ones((2 * rows, cols), dtype=np.float32).tobytes()
    x = np.ones(T * cols + 64, dtype=np.float32)
    dev = device_of(backend, device)

    def run(w_offset: int, x_offset: int, y_offset: int) -> np.ndarray:
        return _native._backend_matmul_view(
            backend, dev, "F32", raw, w_offset, rows, cols, x, x_offset, T, 4 * T * rows, y_offset
        )

    assert np.all(run(rows * cols * 4, 0, 0)[: T * rows] == cols)  # the second matrix, aligned: fine
    with pytest.raises(ValueError, match="weights offset 4 is not a multiple of 256"):
        run(4, 0, 0)
    with pytest.raises(ValueError, match="x offset 128 is not a multiple of 256"):
        run(0, 128, 0)
    with pytest.raises(ValueError, match="weights view .* lies outside its buffer"):
        run(2 * rows * cols * 4, 0, 0)
    with pytest.raises(ValueError, match="y view .* lies outside its buffer"):
        run(0, 0, 4 * T * rows * 4)


# ---------------------------------------------------------------------------
# The engine: logits, greedy decode, batch invariance
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("weight_type", ["F32", "Q8_0", "Q4_0"])
def test_logits_match_cpu_engine(device: int, weight_type: str) -> None:
    path = tiny_model("qwen3moe", weight_type)
    logits = {}
    mem = {}
    for backend in ("cpu", "cpu-ops", "vulkan"):
        eng = make_engine(path, backend, device)
        logits[backend] = tail_logits(eng, PROMPT)
        mem[backend] = eng.memory()
    assert rel_err(logits["vulkan"], logits["cpu-ops"]) <= MOE_REL_LIMIT
    assert rel_err(logits["vulkan"], logits["cpu"]) <= MOE_REL_LIMIT
    assert rel_err(logits["cpu-ops"], logits["cpu"]) <= MOE_REL_LIMIT
    clear_argmax_agrees(logits["vulkan"], logits["cpu"])
    # The KV accounting is the CPU pool's (the bytes live on the device).
    kv_fields = ("bytes_per_token", "block_bytes", "bytes_reserved", "bytes_used", "bytes_allocated", "blocks_in_use")
    assert {k: mem["vulkan"][k] for k in kv_fields} == {k: mem["cpu"][k] for k in kv_fields}


def test_matches_float64_reference(device: int) -> None:
    """The device's logits against tests/test_architectures.py's float64 NumPy forward of the tiny qwen3moe
    (the one that also checks the CPU engine), 40 tokens in chunks of its CHUNK."""
    eng = Engine(
        tiny_model("qwen3moe", "F32"), backend="vulkan", device=device, kv_k="f32", kv_v="f32",
        float_activations=True, max_batch_tokens=REF_CHUNK,
    )  # fmt: skip
    toks = ref_prompt(eng.config["n_vocab"], 40, seed=7)
    want, choices = qwen3moe_reference(eng.config["n_vocab"], toks)
    assert all(len(np.unique(c)) >= 4 for c in choices)  # the routing really mixes experts
    got = eng.score(eng.add_sequence([], generate=False), toks).astype(np.float64)
    assert float(np.abs(got - want).max()) <= REF_LOGIT_TOL


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_0"])
def test_integer_dot_path(device: int, weight_type: str) -> None:
    """8-bit activations (float_activations False): the device's matmuls, the experts' matmul_view included,
    take the integer-dot path where it has one and match the CPU engine's 8-bit activations; on a device
    without it the float path matches the CPU engine with float activations."""
    path = tiny_model("qwen3moe", weight_type)
    vk = make_engine(path, "vulkan", device, float_activations=False)
    got = tail_logits(vk, PROMPT)
    float_ref = vk.dot_path != "integer dot"
    for backend in ("cpu", "cpu-ops"):
        ref = tail_logits(make_engine(path, backend, device, float_activations=float_ref), PROMPT)
        assert rel_err(got, ref) <= MOE_REL_LIMIT, (backend, vk.dot_path)
        clear_argmax_agrees(got, ref)


def test_greedy_decode_matches_cpu_engine(device: int) -> None:
    """Prefill and five decode steps: every step's logits within MOE_REL_LIMIT of the CPU engine's and of
    cpu-ops', and the greedy ids equal up to the CPU engine's first unclear step."""
    path = tiny_model("qwen3moe", "Q8_0")
    n_new = 5
    runs = {b: greedy_run(make_engine(path, b, device), PROMPT[:9], n_new) for b in ("cpu", "cpu-ops", "vulkan")}
    cpu_ids, cpu_rows = runs["cpu"]
    assert len(cpu_ids) == n_new
    margins = [float(np.diff(np.sort(r)[-2:])[0] / np.abs(r).max()) for r in cpu_rows]
    clear = next((i for i, m in enumerate(margins) if m <= GREEDY_CLEAR_MARGIN), n_new)
    assert clear >= 1
    for b in ("cpu-ops", "vulkan"):
        ids, rows = runs[b]
        assert ids[:clear] == cpu_ids[:clear]
        for i in range(clear):  # the same history up to here, so the same logits
            assert rel_err(rows[i][None], cpu_rows[i][None]) <= MOE_REL_LIMIT
    assert runs["vulkan"][0][:clear] == runs["cpu-ops"][0][:clear]


@pytest.mark.parametrize(("backend", "float_activations"), [("vulkan", True), ("vulkan", False), ("cpu-ops", True)])
def test_batch_invariance(device: int, backend: str, float_activations: bool) -> None:
    """A sequence's logits at every step are bit-equal alone and together with others: their tokens share
    the experts' grouped rows (each expert's matmul runs over other sequences' rows too), decodes and prefill
    chunks in the same steps. float_activations False: the integer-dot path where the device has it."""
    eng = make_engine(
        tiny_model("qwen3moe", "Q8_0"), backend, device, max_batch_tokens=6, float_activations=float_activations
    )
    n_vocab = eng.config["n_vocab"]
    prompts = [[(31 * i + 7 * s) % n_vocab for i in range(n)] for s, n in ((1, 5), (2, 11), (3, 1))]
    assert_batch_invariant(eng, prompts, n_new=3)


# A qwen3moe whose shapes need padding: n_embd 96 (384-byte rows: expert groups of rows start at even rows),
# n_ff_exp 64, Q8_0 (an expert's gate slice is 64 rows of 102 bytes = 6528, not a multiple of 256, so the
# device stores each expert at a padded stride).
ODD_SPEC = dataclasses.replace(TINY_SPECS["qwen3moe"], n_embd=96, n_ff_exp=64, seed=205)


@pytest.fixture(scope="module")
def odd_moe_file() -> Path:
    """The ODD_SPEC file, written once into the tiny models' cache (keyed as tiny_model keys its files)."""
    path = tinymodels.cache_dir() / f"tiny-qwen3moe-odd-Q8_0-{tinymodels._key(ODD_SPEC, 'Q8_0')}.gguf"
    if not path.is_file():
        tmp = tinymodels._atomic_target(path)
        try:
            tinymodels._write(ODD_SPEC, "Q8_0", tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def test_padded_views(device: int, odd_moe_file: Path) -> None:
    """The device's padded expert strides and aligned row groups give the CPU engine's logits."""
    row_bytes = ODD_SPEC.n_embd // 32 * 34
    assert (ODD_SPEC.n_ff_exp * row_bytes) % VIEW_ALIGN != 0  # the stride is padded
    assert (ODD_SPEC.n_embd * 4) % VIEW_ALIGN != 0  # the row groups are padded
    logits = {b: tail_logits(make_engine(odd_moe_file, b, device), PROMPT) for b in ("cpu", "cpu-ops", "vulkan")}
    assert rel_err(logits["vulkan"], logits["cpu-ops"]) <= MOE_REL_LIMIT
    assert rel_err(logits["vulkan"], logits["cpu"]) <= MOE_REL_LIMIT
    clear_argmax_agrees(logits["vulkan"], logits["cpu"])
