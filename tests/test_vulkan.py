"""The Vulkan backend's shaders against the CPU reference kernels and float64 NumPy, on Mesa's lavapipe.

Skipped, with the reason, when the module was built without Vulkan or no Vulkan device is present;
KVSWARM_REQUIRE_VULKAN=1 (CI) turns that into a failure. KVSWARM_VULKAN_DEVICE=N picks a device;
by default lavapipe, else device 0. Shapes are small: lavapipe runs on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from test_kquants import elements_per_block, random_blocks
from vulkan_device import vulkan_device  # tests/
from vulkan_helpers import run_pytest

from swarm.cli import main as swarm_main
from worker import _native

# The weight formats with a Vulkan matmul shader: matmul.comp (F32, F16, Q4_0, Q4_1, Q8_0) and
# matmul_kquant.comp (the rest). Every format the CPU engine reads (test_every_cpu_weight_type_has_a_shader).
VULKAN_WEIGHT_TYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
)  # fmt: skip
# Formats gguf-py's quantize() writes; the others get random valid blocks (test_kquants.random_blocks).
GGUF_PY_QUANTIZES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")

# Named error limits. The shaders accumulate in float32; the references are float64.
# matmul: every product passes through at most ~45 float32 roundings before the output, relative to
# sum |w x|: 2-3 in decoding the weight (scale products, min), 32 in a thread's sum over its chunk of
# 32 elements, ceil(cols / (32 * 64)) in its running sum over chunks, 6 in the workgroup's tree sum
# of 64 threads: 45 * 2^-24 = 2.7e-6 for cols <= 768 here.
MATMUL_REL_LIMIT = 1e-5
# rms_norm: a float32 sum of squares and inversesqrt (the Vulkan spec allows 2 ulp for inversesqrt).
RMS_NORM_REL_LIMIT = 1e-5
# RoPE: angles up to 63 rad carry ~63 * 2^-24 = 4e-6 rad of float32 rounding, plus the driver's sin/cos
# (lavapipe's are accurate to ~1e-7); inputs are of unit scale, so an absolute limit.
ROPE_ABS_LIMIT = 1e-4
# gated FFN products: exp / tanh in float32, a few ulp relative to |act(g) u| (plus a floor near zero).
GATED_REL_LIMIT = 1e-5
GATED_ABS_FLOOR = 1e-6


@pytest.fixture(scope="module")
def device() -> int:
    return vulkan_device()


def _dequantized_rows(wt: str, raw: bytes, rows: int, cols: int) -> np.ndarray:
    """(rows, cols) float64 from the CPU reference kernel's dequantizer, one row at a time."""
    rb = len(raw) // rows
    return np.stack([_native._kernel_dequant("ref", wt, raw[r * rb : (r + 1) * rb], cols) for r in range(rows)]).astype(
        np.float64
    )


# ---- device facts ----


def test_device_facts(device: int) -> None:
    d = _native.vulkan_devices()[device]
    major, minor, _ = (int(p) for p in d["api_version"].split("."))
    assert (major, minor) >= (1, 1)
    assert d["name"]
    assert d["device_local_bytes"] > 0
    assert d["subgroup_size"] > 0 and d["subgroup_size"] & (d["subgroup_size"] - 1) == 0  # a power of two
    assert d["max_workgroup_size"] >= 128  # the Vulkan minimum; the shaders use at most 256
    assert d["device_local_budget"] == 0 or d["memory_budget_ext"]
    if d["integer_dot_4x8_accelerated"]:
        assert d["integer_dot_product"]
    if d["driver_name"] == "llvmpipe":  # lavapipe: a CPU device from Mesa
        assert d["type"] == "cpu"
        assert d["vendor"] == "Mesa"


def test_swarm_devices_lists_cpu_and_vulkan(device: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert swarm_main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cpu"]["isa_levels"] == _native.isa_levels()
    assert data["vulkan"]["built"] is True
    assert data["vulkan"]["problem"] is None
    assert [d["name"] for d in data["vulkan"]["devices"]] == [d["name"] for d in _native.vulkan_devices()]
    assert swarm_main(["devices"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[1].startswith("cpu ")
    assert f"vulkan:{device}" in table
    assert data["vulkan"]["devices"][device]["name"] in table


def test_missing_loader_is_a_clear_error() -> None:
    """No libvulkan.so.1 (here: a loader path that does not exist): `swarm devices` still lists the CPU and
    says what to install; asking for a Vulkan backend raises naming the same fix. Runs in any build."""
    env = dict(os.environ, KVSWARM_VULKAN_LOADER="/nonexistent/libvulkan.so.1")
    code = (
        "import json, sys\n"
        "from worker import _native\n"
        "from swarm.cli import main\n"
        "main(['devices', '--json'])\n"
        "try:\n"
        "    _native._backend_name('vulkan', 0)\n"
        "except RuntimeError as e:\n"
        "    print(json.dumps({'error': str(e)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    decoder = json.JSONDecoder()
    devices, end = decoder.raw_decode(out)
    error = json.loads(out[end:].strip())["error"]
    assert devices["cpu"]["cpus"] >= 1
    assert devices["vulkan"]["devices"] == []
    if _native.has_vulkan():
        assert "/nonexistent/libvulkan.so.1" in devices["vulkan"]["problem"]
        assert "apt-get install libvulkan1" in devices["vulkan"]["problem"]
        assert "apt-get install libvulkan1" in error
    else:
        assert "not built" in devices["vulkan"]["problem"]
        assert "apt-get install libvulkan-dev glslc" in error


def test_bad_requests_name_the_fix(device: int) -> None:
    n = len(_native.vulkan_devices())
    with pytest.raises(ValueError, match=f"vulkan device {n} does not exist.*swarm devices"):
        _native._backend_name("vulkan", n)
    with pytest.raises(ValueError, match="unknown backend 'metal' \\(expected cpu or vulkan\\)"):
        _native._backend_name("metal", 0)
    x = np.zeros((1, 256), np.float32)
    with pytest.raises(ValueError, match="unknown weight type 'Q1_0' \\(supported: F32, F16"):
        _native._backend_matmul("vulkan", device, "Q1_0", bytes(144), 1, 256, x)
    with pytest.raises(ValueError, match="143 weight bytes, expected rows \\* row_bytes\\(Q4_K, cols\\)"):
        _native._backend_matmul("vulkan", device, "Q4_K", bytes(143), 1, 256, x)


def test_every_cpu_weight_type_has_a_shader() -> None:
    """The CPU engine's list of weight formats (from its error for an unknown one) is VULKAN_WEIGHT_TYPES."""
    with pytest.raises(ValueError) as e:
        _native._backend_matmul("cpu", 0, "Q1_0", b"", 1, 32, np.zeros((1, 32), np.float32))
    cpu_types = str(e.value).split("(supported: ")[1].rstrip(")").split(", ")
    assert sorted(cpu_types) == sorted(VULKAN_WEIGHT_TYPES)


# ---- shaders ----


def _weights(wt: str, rows: int, seed: int) -> tuple[bytes, int]:
    """(raw GGUF rows, cols) of a weight matrix in format wt. cols: 101 (odd, not a multiple of 32) for the
    float formats, 96 = 3 blocks for the 32-element formats, 768 = 3 super-blocks for the 256-element ones."""
    rng = np.random.default_rng(seed)
    if wt in ("F32", "F16", "BF16"):
        cols = 101
    else:
        cols = 3 * elements_per_block(wt)
    if wt in GGUF_PY_QUANTIZES:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        return quantize(w, GGMLQuantizationType[wt]).tobytes(), cols
    return random_blocks(wt, rows * 3, seed).tobytes(), cols


@pytest.mark.parametrize("T", [1, 19])  # 19: two full passes of 8 activation rows and a partial one
@pytest.mark.parametrize("wt", VULKAN_WEIGHT_TYPES)
def test_matmul(device: int, wt: str, T: int) -> None:
    rows = 37  # odd
    raw, cols = _weights(wt, rows, seed=100 + T)
    rng = np.random.default_rng(200 + T)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    wd = _dequantized_rows(wt, raw, rows, cols)  # the CPU reference kernel's weights
    want = x.astype(np.float64) @ wd.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(wd).T  # sum |w x| per output
    got = _native._backend_matmul("vulkan", device, wt, raw, rows, cols, x)
    assert got.shape == (T, rows)
    assert np.all(np.abs(got - want) <= MATMUL_REL_LIMIT * scale)
    if wt in ("F32", "F16", "BF16"):  # the CPU backend's float path agrees too (its block formats quantize x)
        cpu = _native._backend_matmul("cpu", 0, wt, raw, rows, cols, x)
        assert np.all(np.abs(got - cpu) <= 2 * MATMUL_REL_LIMIT * scale)


def test_matmul_plain_variant(device: int) -> None:
    """test_matmul again with KVSWARM_VULKAN_SUBGROUP=0 (in a fresh process: the backend reads it once), so
    the workgroup-reduction variant of every matmul shader runs too on a device with subgroup arithmetic."""
    if not _native.vulkan_devices()[device]["subgroup_arithmetic"]:
        pytest.skip("this device runs the plain variant in test_matmul already")
    env = dict(os.environ, KVSWARM_VULKAN_SUBGROUP="0", KVSWARM_VULKAN_DEVICE=str(device))
    run_pytest([f"{__file__}::test_matmul"], env, passed=2 * len(VULKAN_WEIGHT_TYPES))


@pytest.mark.parametrize("T", [1, 5])
def test_rms_norm(device: int, T: int) -> None:
    n, eps = 333, 1e-5  # 333: odd, more than the shader's 128 threads
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((T, n)) * 3.0).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps) * w.astype(np.float64)
    got = _native._backend_rms_norm("vulkan", device, x, w, eps)
    assert np.all(np.abs(got - want) <= RMS_NORM_REL_LIMIT * np.maximum(np.abs(want), 1.0))
    cpu = _native._backend_rms_norm("cpu", 0, x, w, eps)
    assert np.all(np.abs(got - cpu) <= RMS_NORM_REL_LIMIT * np.maximum(np.abs(want), 1.0))


def _rope_ref(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, style: int) -> np.ndarray:
    """float64 RoPE: pair i turns by pos * base^(-2i/n_rot); style 0 pairs (2i, 2i+1), style 1 (i, i + n_rot/2)."""
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    i = np.arange(half)
    theta = pos.astype(np.float64)[:, None] * base ** (-2.0 * i / n_rot)  # (T, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    ia, ib = (2 * i, 2 * i + 1) if style == 0 else (i, i + half)
    a, b = out[:, :, ia].copy(), out[:, :, ib].copy()
    out[:, :, ia] = a * c - b * s
    out[:, :, ib] = a * s + b * c
    return out


@pytest.mark.parametrize("n_rot", [64, 32])  # 32: a partial rotation leaves dims 32..63 as they are
@pytest.mark.parametrize("style", [0, 1])
def test_rope(device: int, style: int, n_rot: int) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 3, 64)).astype(np.float32)  # (T, n_head, head_dim)
    pos = np.array([0, 1, 17, 63], dtype=np.int32)
    want = _rope_ref(x, pos, n_rot, 10000.0, style)
    got = _native._backend_rope("vulkan", device, x, pos, n_rot, 10000.0, style)
    assert np.abs(got - want).max() <= ROPE_ABS_LIMIT
    assert np.array_equal(got[:, :, n_rot:], x[:, :, n_rot:])
    assert np.array_equal(got[0], x[0])  # position 0 turns by nothing
    cpu = _native._backend_rope("cpu", 0, x, pos, n_rot, 10000.0, style)
    assert np.abs(got - cpu).max() <= 2 * ROPE_ABS_LIMIT


@pytest.mark.parametrize("act", [0, 1])  # 0: SwiGLU (silu), 1: GeGLU (gelu, tanh approximation)
def test_gated(device: int, act: int) -> None:
    n = 1001  # not a multiple of the shader's 256 threads
    rng = np.random.default_rng(13)
    g = (rng.standard_normal(n) * 6.0).astype(np.float32)
    g[:4] = [-60.0, 60.0, 0.0, -1e-3]  # saturated ends (tanh clamp, exp overflow) and near zero
    u = rng.standard_normal(n).astype(np.float32)
    g64 = g.astype(np.float64)
    if act == 0:
        a = g64 / (1.0 + np.exp(-g64))
    else:
        a = 0.5 * g64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g64 + 0.044715 * g64**3)))
    want = a * u.astype(np.float64)
    got = _native._backend_gated("vulkan", device, act, g, u)
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - want) <= GATED_REL_LIMIT * np.abs(want) + GATED_ABS_FLOOR)
    cpu = _native._backend_gated("cpu", 0, act, g, u)
    assert np.all(np.abs(got - cpu) <= 2 * GATED_REL_LIMIT * np.abs(want) + GATED_ABS_FLOOR)


# ---- flash-decode attention over a paged pool ----

# Attention outputs are convex combinations of unit-scale V rows; scores are float32 dots of 64 terms and
# the softmax runs in float32 (online, chunk by chunk, on Vulkan), so float32 rounding of a few ulp.
ATTN_ABS_LIMIT = 2e-5
ATTN_KV_PAIRS = [("f32", "f32"), ("f16", "f16"), ("q8_0", "q8_0"), ("q8_head", "q4_0"), ("q4_0", "f16")]


def _paged_case(kv_k: str, kv_v: str, n_past: int, T: int, seed: int) -> tuple[dict[str, Any], np.ndarray]:
    """A pool in kv_cache.h's layout ([layer][K | V][kv head][slot] rows per block) of 2 layers, filled
    with random bytes, with layer 1's K/V rows of one sequence written through a shuffled block table.
    Returns (the _backend_attention arguments, the float64 reference output (T, n_head, head_dim))."""
    n_layer, layer, n_head, n_kv, hd, bt = 2, 1, 4, 2, 64, 16
    rng = np.random.default_rng(seed)
    k_row, v_row = _native.kv_row_bytes(kv_k, hd), _native.kv_row_bytes(kv_v, hd)
    layer_bytes = n_kv * bt * (k_row + v_row)
    block_bytes = n_layer * layer_bytes
    k_offset = layer * layer_bytes
    v_offset = k_offset + n_kv * bt * k_row
    n_blocks = (n_past + bt - 1) // bt
    pool_blocks = n_blocks + 3  # unused blocks hold garbage that must never be read
    table = rng.permutation(pool_blocks)[:n_blocks].astype(np.int32)
    pool = bytearray(rng.integers(0, 256, pool_blocks * block_bytes, dtype=np.uint8).tobytes())
    k = np.zeros((n_past, n_kv, hd))
    v = np.zeros((n_past, n_kv, hd))
    for p in range(n_past):
        base = int(table[p // bt]) * block_bytes
        for h in range(n_kv):
            kd, kb = _native._kv_roundtrip("ref", kv_k, rng.standard_normal(hd).astype(np.float32))
            vd, vb = _native._kv_roundtrip("ref", kv_v, rng.standard_normal(hd).astype(np.float32))
            k[p, h], v[p, h] = kd, vd  # what the stored rows decode to
            ko = base + k_offset + (h * bt + p % bt) * k_row
            vo = base + v_offset + (h * bt + p % bt) * v_row
            pool[ko : ko + k_row] = kb
            pool[vo : vo + v_row] = vb
    q = rng.standard_normal((T, n_head, hd)).astype(np.float32)
    scale = 1.0 / np.sqrt(hd)
    want = np.zeros((T, n_head, hd))
    for t in range(T):
        visible = n_past - T + t + 1
        for hq in range(n_head):
            kh = hq // (n_head // n_kv)
            s = scale * (k[:visible, kh] @ q[t, hq].astype(np.float64))
            w = np.exp(s - s.max())
            want[t, hq] = (w / w.sum()) @ v[:visible, kh]
    args = dict(
        q=q, pool=bytes(pool), blocks=table, n_head_kv=n_kv, block_tokens=bt, n_past=n_past, scale=float(scale),
        block_bytes=block_bytes, k_offset=k_offset, v_offset=v_offset, kv_k=kv_k, kv_v=kv_v,
    )  # fmt: skip
    return args, want


@pytest.mark.parametrize(("kv_k", "kv_v"), ATTN_KV_PAIRS)
def test_attention_cpu_backend(kv_k: str, kv_v: str) -> None:
    args, want = _paged_case(kv_k, kv_v, n_past=37, T=3, seed=17)
    got = _native._backend_attention("cpu", 0, **args)
    assert np.abs(got - want).max() <= ATTN_ABS_LIMIT


@pytest.mark.parametrize(("kv_k", "kv_v"), ATTN_KV_PAIRS)
def test_attention(device: int, kv_k: str, kv_v: str) -> None:
    # 150 positions: three chunks of the shader's online softmax (64 each), the last block partial;
    # T = 2 rows with causal masks one position apart (a chunk of prefill).
    args, want = _paged_case(kv_k, kv_v, n_past=150, T=2, seed=19)
    got = _native._backend_attention("vulkan", device, **args)
    assert np.abs(got - want).max() <= ATTN_ABS_LIMIT


def test_attention_rejects_a_block_outside_the_pool(device: int) -> None:
    args, _ = _paged_case("f16", "f16", n_past=20, T=1, seed=23)
    args["blocks"] = np.array([0, 99], dtype=np.int32)
    for backend, dev in (("cpu", 0), ("vulkan", device)):
        with pytest.raises(ValueError, match="block table entry 1 = 99 lies outside the pool of 5 blocks"):
            _native._backend_attention(backend, dev, **args)
