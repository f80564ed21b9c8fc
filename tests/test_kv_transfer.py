"""KV snapshots (issue 18): Engine.export_kv / import_kv of one sequence.

Same KV format: the resumed run equals an uninterrupted one bit-exactly (tokens and logits).
Another format: the destination's rows are the snapshot's rows decoded and re-encoded, checked
byte for byte against a NumPy implementation of the formats written here from kv_format.h, and
the resumed logits stay within the quality floor of the narrower format (tests/test_kv_quality.py).
The blob is parsed here independently from the layout documented in native/kv_transfer.h.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinymodels
from conftest import KV_FORMATS
from test_kv_quality import MAX_MEAN_KL, MIN_TOP1, TEXT, log_softmax

from worker.engine import Engine, KvBudgetError, Sampling

# -- the blob, parsed from the documented layout ---------------------------------------------------

HEADER = struct.Struct("<8sII16s12IQ")  # KvSnapshotHeader: 88 bytes
HEADER_FIELDS = (
    "magic",
    "version",
    "header_bytes",
    "arch",
    "n_layer",
    "n_head_kv",
    "head_dim",
    "n_embd",
    "n_vocab",
    "sliding_window",
    "k_format",
    "v_format",
    "n_past",
    "n_tokens",
    "swa_from",
    "flags",
    "payload_bytes",
)
FORMAT_IDS = {"f32": 0, "f16": 1, "q8_0": 2, "q8_head": 3, "q4_0": 4}
FORMAT_NAMES = {v: k for k, v in FORMAT_IDS.items()}
QK = 32  # elements per q8_0 / q4_0 block


def row_bytes(fmt: str, hd: int) -> int:
    """Bytes of one row of hd elements (kv_format.h)."""
    return {"f32": 4 * hd, "f16": 2 * hd, "q8_0": hd // QK * 34, "q8_head": 4 + hd, "q4_0": hd // QK * 18}[fmt]


def parse(blob: bytes) -> dict[str, Any]:
    """{header fields..., layer_swa, tokens, rows: {(layer, "k" | "v"): (n_head_kv, positions, row bytes) uint8}}."""
    assert HEADER.size == 88
    out: dict[str, Any] = dict(zip(HEADER_FIELDS, HEADER.unpack_from(blob, 0), strict=True))
    assert out["magic"] == b"KVSWSNAP" and out["version"] == 1 and out["header_bytes"] == 88
    off = HEADER.size
    n_layer, nkv, hd = out["n_layer"], out["n_head_kv"], out["head_dim"]
    out["layer_swa"] = list(blob[off : off + n_layer])
    off += n_layer
    out["tokens"] = np.frombuffer(blob, dtype="<i4", count=out["n_tokens"], offset=off).tolist()
    off += 4 * out["n_tokens"]
    start = off
    rows = {}
    for layer in range(n_layer):
        n = out["n_past"] - (out["swa_from"] if out["layer_swa"][layer] else 0)
        for part, fmt_id in (("k", out["k_format"]), ("v", out["v_format"])):
            rb = row_bytes(FORMAT_NAMES[fmt_id], hd)
            size = nkv * n * rb
            rows[(layer, part)] = np.frombuffer(blob, dtype=np.uint8, count=size, offset=off).reshape(nkv, n, rb)
            off += size
    assert off - start == out["payload_bytes"]
    assert off + 8 == len(blob)  # the checksum closes the blob
    out["rows"] = rows
    return out


# -- KV formats in NumPy (float32 arithmetic, as kv_format.cpp and kernels/ref.cpp define them) -------


def decode(fmt: str, raw: np.ndarray, hd: int) -> np.ndarray:
    """(n, row bytes) uint8 -> (n, hd) float32."""
    raw = np.ascontiguousarray(raw)
    n = raw.shape[0]
    if fmt == "f32":
        return raw.view("<f4").reshape(n, hd).copy()
    if fmt == "f16":
        return raw.view("<f2").reshape(n, hd).astype(np.float32)
    if fmt == "q8_head":
        scale = raw[:, :4].copy().view("<f4")  # (n, 1)
        return raw[:, 4:].view(np.int8).astype(np.float32) * scale
    nb = hd // QK
    blocks = raw.reshape(n, nb, -1)
    d = blocks[:, :, :2].copy().view("<f2").astype(np.float32)  # (n, nb, 1)
    if fmt == "q8_0":
        return (blocks[:, :, 2:].view(np.int8).astype(np.float32) * d).reshape(n, hd)
    assert fmt == "q4_0"
    qs = blocks[:, :, 2:]
    lo = (qs & 0x0F).astype(np.int32) - 8  # elements 0..15 of the block
    hi = (qs >> 4).astype(np.int32) - 8  # elements 16..31
    return (np.concatenate([lo, hi], axis=2).astype(np.float32) * d).reshape(n, hd)


def encode(fmt: str, x: np.ndarray) -> np.ndarray:
    """(n, hd) float32 -> (n, row bytes) uint8."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, hd = x.shape
    if fmt == "f32":
        return x.view(np.uint8).reshape(n, -1)
    if fmt == "f16":
        return x.astype("<f2").view(np.uint8).reshape(n, -1)
    with np.errstate(divide="ignore"):
        if fmt == "q8_head":
            s = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
            inv = np.where(s != 0, np.float32(1) / s, np.float32(0)).astype(np.float32)
            q = np.rint(x * inv).astype(np.int8)
            return np.concatenate([s.view(np.uint8).reshape(n, 4), q.view(np.uint8)], axis=1)
        xb = x.reshape(n, hd // QK, QK)
        if fmt == "q8_0":
            d = (np.abs(xb).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            q = np.rint(xb * inv).astype(np.int8).view(np.uint8)
            return np.concatenate([d.astype("<f2").view(np.uint8), q], axis=2).reshape(n, -1)
        assert fmt == "q4_0"
        # The signed value of largest magnitude (the first on ties) maps to -8.
        vmax = np.take_along_axis(xb, np.abs(xb).argmax(axis=2)[:, :, None], axis=2)
        d = (vmax / np.float32(-8)).astype(np.float32)
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        code = np.minimum(15, np.trunc((xb * inv).astype(np.float32) + np.float32(8.5))).astype(np.uint8)
        packed = code[:, :, : QK // 2] | (code[:, :, QK // 2 :] << 4)
        return np.concatenate([d.astype("<f2").view(np.uint8), packed], axis=2).reshape(n, -1)


def test_numpy_formats_match_the_engine() -> None:
    """The NumPy encoder/decoder above is byte-equal to kv_store_row / kv_load_row (ref level)."""
    from worker import _native

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 64)).astype(np.float32) * np.float32(3)
    x[1] = 0.0  # an all-zero row: scale 0
    for fmt in KV_FORMATS:
        for row in x:
            decoded, raw = _native._kv_roundtrip("ref", fmt, row)
            want = encode(fmt, row[None, :])[0]
            assert np.frombuffer(raw, dtype=np.uint8).tolist() == want.tolist(), fmt
            assert np.array_equal(decode(fmt, want[None, :], 64)[0], np.asarray(decoded)), fmt


# -- helpers --------------------------------------------------------------------------------------

PROMPT = [int(t) for t in np.random.default_rng(18).integers(10, 240, size=37)]  # odd: a partial last block
TURN2 = [int(t) for t in np.random.default_rng(19).integers(10, 240, size=11)]
PROBE = [7, 100, 3, 55, 201]  # teacher-forced after the run, to compare logits


def drain(eng: Engine, seq: int) -> list[int]:
    out: list[int] = []
    while eng.busy():
        out += [t for s, t in eng.step().items() if s == seq]
    return out


def assert_same_up_to_block_order(got: np.ndarray, want: np.ndarray) -> None:
    """Logits of runs whose block_tokens differ. The attention kernels score and accumulate one block's
    run of rows per call, so another block_tokens groups the same float32 additions differently (two
    uninterrupted runs of block_tokens 16 and 5 differ the same way); on a machine with value tiles
    (AVX-512 VNNI) block_tokens 16 also sums q8_0 values in integers where 7 sums floats. A few float32
    ulps of each sum, but a later K/V row computed from those sums can round to the other side of one of
    its format's steps (f16, or q8_0's block max / 127), and that step grows through the layers.
    Allowed: 1e-5 relative plus 2e-3 absolute (logits here are |x| < 25), five times below the smallest
    difference a wrong row makes (> 1e-2 measured). Measured on gemma3, whose embedding scale and
    post-norms grow a step the most, with block_tokens 7: 1.2e-4 (AVX-512, 16-lane float loops), then
    4.7e-4 with a q8_0 V and 3.8e-4 with an f16 V once the GeGLU body moved which rows round where
    (2026-12-07; 5.8e-5 and 2.3e-4 before it), so 3e-4 had no margin."""
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-3)


def two_turns(eng: Engine, n1: int = 6, n2: int = 5) -> tuple[int, list[int], list[int]]:
    """An uninterrupted session: PROMPT and n1 greedy tokens, then TURN2 and n2 more."""
    seq = eng.add_sequence(PROMPT, Sampling(max_new_tokens=n1))
    first = drain(eng, seq)
    eng.append(seq, TURN2, Sampling(max_new_tokens=n2))
    second = drain(eng, seq)
    return seq, first, second


def resumed(src: Engine, dst: Engine, n1: int = 6, n2: int = 5) -> tuple[int, list[int], list[int], bytes]:
    """The same session, exported after turn 1 (a lazy tail), freed, imported into dst, continued there."""
    seq = src.add_sequence(PROMPT, Sampling(max_new_tokens=n1))
    first = drain(src, seq)
    blob = src.export_kv(seq)
    assert len(blob) == src.kv_export_bytes(seq)
    src.free(seq)
    new = dst.import_kv(blob)
    info = dst.info(new)
    assert info["n_tokens"] == len(PROMPT) + n1 and info["n_past"] == info["n_tokens"] - 1
    assert not dst.busy()  # the lazy tail waits for the next turn, as it did in src
    dst.append(new, TURN2, Sampling(max_new_tokens=n2))
    return new, first, drain(dst, new), blob


@pytest.fixture(scope="module")
def tiny_llama() -> Path:
    return tinymodels.tiny_model("llama", "F32")


# -- same format: bit-exact ------------------------------------------------------------------------

PAIRS = [(f, f) for f in KV_FORMATS] + [("q8_0", "f16"), ("f16", "q4_0"), ("q8_head", "q8_0")]


@pytest.mark.parametrize("kv", PAIRS, ids=["/".join(p) for p in PAIRS])
def test_same_format_resume_is_bit_exact(default_model, kv: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    k, v = kv
    ref = Engine(default_model, kv_k=k, kv_v=v)
    seq, first, second = two_turns(ref)
    want_tokens = ref.tokens(seq)
    want_logits = ref.score(seq, PROBE)
    src = Engine(default_model, kv_k=k, kv_v=v)
    dst = Engine(default_model, kv_k=k, kv_v=v)
    new, got_first, got_second, blob = resumed(src, dst)
    assert (got_first, got_second) == (first, second)
    assert dst.tokens(new) == want_tokens
    np.testing.assert_array_equal(dst.score(new, PROBE), want_logits)
    snap = parse(blob)
    assert (FORMAT_NAMES[snap["k_format"]], FORMAT_NAMES[snap["v_format"]]) == kv
    assert snap["tokens"] == PROMPT + first and snap["n_past"] == len(PROMPT) + len(first) - 1
    assert snap["flags"] == 1  # lazy tail
    cfg = ref.config
    assert (snap["n_layer"], snap["n_head_kv"], snap["head_dim"]) == (
        cfg["n_layer"],
        cfg["n_head_kv"],
        cfg["head_dim"],
    )
    assert src.memory()["blocks_in_use"] == 0


def test_other_block_tokens_and_mid_generation_ship(tiny_llama: Path) -> None:
    """Exported mid-turn (a sampled token without KV), imported into block_tokens 5 with generate=True."""
    ref = Engine(tiny_llama, kv_k="q8_0", kv_v="q8_0", block_tokens=16)
    seq = ref.add_sequence(PROMPT, Sampling(max_new_tokens=12))
    want = drain(ref, seq)
    src = Engine(tiny_llama, kv_k="q8_0", kv_v="q8_0", block_tokens=16)
    s = src.add_sequence(PROMPT, Sampling(max_new_tokens=12))
    got: list[int] = []
    while len(got) < 4:
        got += [t for i, t in src.step().items() if i == s]
    assert src.info(s)["generating"]
    blob = src.export_kv(s)
    dst = Engine(tiny_llama, kv_k="q8_0", kv_v="q8_0", block_tokens=5)
    new = dst.import_kv(blob, Sampling(max_new_tokens=12 - len(got)), generate=True)
    assert dst.info(new)["generating"]
    got += drain(dst, new)
    assert got == want
    assert dst.memory()["blocks_in_use"] == -(-(len(PROMPT) + 12 - 1) // 5)
    assert_same_up_to_block_order(dst.score(new, PROBE), ref.score(seq, PROBE))


def test_mid_prefill_snapshot_queues_the_rest(tiny_llama: Path) -> None:
    """Exported after one prefill chunk of 8: the rest of the prompt is queued in the destination."""
    ref = Engine(tiny_llama, kv_k="f16", kv_v="f16", max_batch_tokens=8)
    seq = ref.add_sequence(PROMPT, Sampling(max_new_tokens=7))
    want = drain(ref, seq)
    src = Engine(tiny_llama, kv_k="f16", kv_v="f16", max_batch_tokens=8)
    s = src.add_sequence(PROMPT, Sampling(max_new_tokens=7))
    assert src.step() == {}
    blob = src.export_kv(s)
    snap = parse(blob)
    assert (snap["n_past"], snap["n_tokens"], snap["flags"]) == (8, len(PROMPT), 0)
    dst = Engine(tiny_llama, kv_k="f16", kv_v="f16", max_batch_tokens=8, block_tokens=3)
    new = dst.import_kv(blob, Sampling(max_new_tokens=7), generate=True)
    assert dst.info(new)["n_past"] == 8
    assert drain(dst, new) == want


def test_fully_computed_sequence_imports_without_generating(tiny_llama: Path) -> None:
    """After score() every token has KV: generate=True is refused, generate=False + append continues."""
    ref = Engine(tiny_llama)
    seq = ref.add_sequence([], Sampling(), generate=False)
    ref.score(seq, PROMPT)
    src = Engine(tiny_llama)
    s = src.add_sequence([], Sampling(), generate=False)
    src.score(s, PROMPT)
    blob = src.export_kv(s)
    dst = Engine(tiny_llama)
    with pytest.raises(ValueError, match="no token to generate from"):
        dst.import_kv(blob, generate=True)
    assert dst.memory()["blocks_in_use"] == 0
    new = dst.import_kv(blob)
    ref.append(seq, TURN2, Sampling(max_new_tokens=6))
    dst.append(new, TURN2, Sampling(max_new_tokens=6))
    assert drain(dst, new) == drain(ref, seq)


@pytest.mark.parametrize("kv", [("f16", "q8_0"), ("q4_0", "f32")], ids=["f16/q8_0", "q4_0/f32"])
def test_device_pool_round_trip(tiny_llama: Path, kv: tuple[str, str]) -> None:
    """backend="cpu-ops" (the device forward over the CPU backend, the Vulkan path's reference) keeps its
    KV in a device buffer: export/import go through host copies of its blocks. Bit-exact resume, and a
    CPU engine's snapshot lands in the device pool row for row."""
    k, v = kv
    ref = Engine(tiny_llama, backend="cpu-ops", kv_k=k, kv_v=v)
    _, first, second = two_turns(ref)
    src = Engine(tiny_llama, backend="cpu-ops", kv_k=k, kv_v=v)
    dst = Engine(tiny_llama, backend="cpu-ops", kv_k=k, kv_v=v)
    _, got_first, got_second, _ = resumed(src, dst)
    assert (got_first, got_second) == (first, second)
    cpu = Engine(tiny_llama, kv_k=k, kv_v=v)
    s = cpu.add_sequence(PROMPT, Sampling(max_new_tokens=3))
    drain(cpu, s)
    blob = cpu.export_kv(s)
    dev = Engine(tiny_llama, backend="cpu-ops", kv_k=k, kv_v=v, block_tokens=6)
    back = parse(dev.export_kv(dev.import_kv(blob)))
    want = parse(blob)
    assert back["tokens"] == want["tokens"]
    for key, rows in want["rows"].items():
        assert np.array_equal(back["rows"][key], rows), key


# -- other model families ---------------------------------------------------------------------------


@pytest.mark.parametrize("dst_block_tokens", [16, 7])
@pytest.mark.parametrize("family", ["gemma3", "qwen3moe"])
def test_family_round_trip(family: str, dst_block_tokens: int) -> None:
    """gemma3: sliding layers (W 32) keep only the window; qwen3moe: experts. Both resume bit-exactly
    with the source's block_tokens; with another, the same tokens and logits up to summation order."""
    path = tinymodels.tiny_model(family, "F32")
    ref = Engine(path, kv_k="f16", kv_v="q8_0")
    seq, first, second = two_turns(ref)
    want_logits = ref.score(seq, PROBE[:2])
    src = Engine(path, kv_k="f16", kv_v="q8_0")
    dst = Engine(path, kv_k="f16", kv_v="q8_0", block_tokens=dst_block_tokens)
    new, got_first, got_second, blob = resumed(src, dst)
    assert (got_first, got_second) == (first, second)
    if dst_block_tokens == 16:
        np.testing.assert_array_equal(dst.score(new, PROBE[:2]), want_logits)
    else:
        assert_same_up_to_block_order(dst.score(new, PROBE[:2]), want_logits)
    snap = parse(blob)
    n_past = len(PROMPT) + len(first) - 1
    if family == "gemma3":
        w = ref.config["sliding_window"]
        assert w == 32 and n_past > w  # some sliding positions have left the window
        assert snap["swa_from"] == n_past - w + 1
        assert 0 < sum(snap["layer_swa"]) < snap["n_layer"]
        for layer, sliding in enumerate(snap["layer_swa"]):
            assert snap["rows"][(layer, "k")].shape[1] == (w - 1 if sliding else n_past)
    else:
        assert snap["swa_from"] == 0 and sum(snap["layer_swa"]) == 0


# -- format conversion ------------------------------------------------------------------------------

CONVERSIONS = [("f16", "q8_0"), ("f32", "q4_0"), ("q8_0", "f16"), ("f16", "q8_head"), ("q4_0", "f32")]


@pytest.mark.parametrize("conv", CONVERSIONS, ids=["->".join(c) for c in CONVERSIONS])
def test_conversion_rows_are_the_decoded_rows_reencoded(tiny_llama: Path, conv: tuple[str, str]) -> None:
    """dst rows == encode(dst format, decode(src format, src rows)), byte for byte, for K and V."""
    a, b = conv
    src = Engine(tiny_llama, kv_k=a, kv_v=a)
    s = src.add_sequence(PROMPT, Sampling(max_new_tokens=4))
    drain(src, s)
    blob = src.export_kv(s)
    dst = Engine(tiny_llama, kv_k=b, kv_v=b, block_tokens=9)
    new = dst.import_kv(blob)
    back = parse(dst.export_kv(new))
    snap = parse(blob)
    hd = snap["head_dim"]
    assert FORMAT_NAMES[back["k_format"]] == b and back["tokens"] == snap["tokens"]
    for key, raw in snap["rows"].items():
        nkv, n, _ = raw.shape
        want = encode(b, decode(a, raw.reshape(nkv * n, -1), hd))
        got = back["rows"][key].reshape(nkv * n, -1)
        if b in ("f32", "f16"):
            # Values, not bytes: the SIMD q4_0 decode gives +0.0 where the scalar one gives -0.0
            # (0 * negative scale); both are zero, and the quantized formats store them alike.
            assert np.array_equal(decode(b, got, hd), decode(b, want, hd)), key
        else:
            assert np.array_equal(got, want), key
    # The converted sequence continues (its pending lazy tail is prefilled with the next turn).
    dst.append(new, TURN2, Sampling(max_new_tokens=3))
    assert len(drain(dst, new)) == 3


def test_converted_resume_within_the_narrower_format_floor(default_model) -> None:  # type: ignore[no-untyped-def]
    """f16 -> q8_0 mid-text: teacher-forced over the rest of the text, the resumed run's next-token
    distribution stays within q8_0's floor against the f32 reference (tests/test_kv_quality.py, float
    activations: top-1 >= MIN_TOP1, mean KL <= MAX_MEAN_KL of q8_0/q8_0).

    The rule (docs/ARCHITECTURE.md, "KV snapshots"): a converted row is the source row decoded and
    encoded again, so it carries the source format's rounding and then the destination's; the resumed
    run is at least as good as the narrower format's floor. f16's own rounding (KL 3.4e-7 measured) is
    far below q8_0's (7.4e-4), so the floor of q8_0 alone applies."""
    ref_eng = Engine(default_model, kv_k="f32", kv_v="f32", float_activations=True)
    tokens = ref_eng.tokenizer.encode(TEXT)[:192]
    split = 64
    ref_logp = log_softmax(ref_eng.score(ref_eng.add_sequence([], generate=False), tokens))[split:]
    src = Engine(default_model, kv_k="f16", kv_v="f16", float_activations=True)
    s = src.add_sequence([], generate=False)
    src.score(s, tokens[:split])
    dst = Engine(default_model, kv_k="q8_0", kv_v="q8_0", float_activations=True)
    new = dst.import_kv(src.export_kv(s))
    logp = log_softmax(dst.score(new, tokens[split:]))
    top1 = float(np.mean(logp.argmax(axis=1) == ref_logp.argmax(axis=1)))
    kl = float(np.mean(np.sum(np.exp(ref_logp) * (ref_logp - logp), axis=1)))
    assert top1 >= MIN_TOP1[("q8_0", "q8_0")], top1
    assert kl <= MAX_MEAN_KL[("q8_0", "q8_0")], kl


# -- memory: budget, sharing -----------------------------------------------------------------------


def test_budget_exact_and_one_block_short(tiny_llama: Path) -> None:
    src = Engine(tiny_llama, block_tokens=8)
    s = src.add_sequence(PROMPT, Sampling(max_new_tokens=3))
    drain(src, s)
    blob = src.export_kv(s)
    n_past = src.info(s)["n_past"]  # 37 + 3 - 1 = 39 positions: 5 blocks of 8
    probe = Engine(tiny_llama, block_tokens=8)
    block_bytes = probe.memory()["block_bytes"]
    need = -(-n_past // 8)
    other = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # a resident sequence of 2 blocks after its prefill
    for short in (1, 0):
        dst = Engine(tiny_llama, block_tokens=8, kv_budget_bytes=(2 + need - short) * block_bytes)
        keep = dst.add_sequence(other, Sampling(), generate=False)
        drain(dst, keep)
        before = dst.memory()
        assert before["blocks_in_use"] == 2
        if short:
            with pytest.raises(KvBudgetError, match="import_kv"):
                dst.import_kv(blob)
            after = dst.memory()
            assert after["blocks_in_use"] == before["blocks_in_use"]
            assert after["bytes_reserved"] == before["bytes_reserved"]
            assert dst.sequence_ids() == [keep]
            dst.free(keep)  # the freed blocks make room: the same blob now fits
            assert dst.memory()["blocks_in_use"] == 0
            new = dst.import_kv(blob)
            assert dst.memory()["blocks_in_use"] == need
        else:
            new = dst.import_kv(blob)
            assert dst.memory()["blocks_in_use"] == 2 + need
        assert dst.tokens(new) == src.tokens(s)


def test_import_shares_and_publishes_prefix_blocks(tiny_llama: Path) -> None:
    """Same format: full blocks already indexed are shared, the rest are published; a converted
    import is never published (its rows differ from what this engine computes)."""
    src = Engine(tiny_llama, kv_k="f16", kv_v="f16", block_tokens=8)
    s = src.add_sequence(PROMPT, Sampling(max_new_tokens=2))
    drain(src, s)
    blob = src.export_kv(s)
    dst = Engine(tiny_llama, kv_k="f16", kv_v="f16", block_tokens=8)
    a = dst.import_kv(blob)  # publishes its 4 full blocks (38 positions)
    b = dst.import_kv(blob)  # holds those 4 instead of new ones
    mem = dst.memory()
    assert mem["blocks_shared"] == 4 and mem["blocks_in_use"] == 5 + 1
    assert mem["prefix_tokens_reused"] == 4 * 8
    c = dst.add_sequence(PROMPT[:20], Sampling(max_new_tokens=2))  # 2 full blocks match: shared
    assert dst.memory()["prefix_tokens_reused"] == 4 * 8 + 2 * 8
    drain(dst, c)
    for seq in (a, b):
        dst.append(seq, TURN2, Sampling(max_new_tokens=3))
    drain(dst, a)
    assert dst.tokens(a) == dst.tokens(b)  # sharing changes memory, never outputs
    for seq in (a, b, c):
        dst.free(seq)
    assert dst.memory()["blocks_in_use"] == 0
    conv = Engine(tiny_llama, kv_k="q8_0", kv_v="q8_0", block_tokens=8)
    conv.import_kv(blob)
    conv.add_sequence(PROMPT, Sampling(max_new_tokens=1))
    assert conv.memory()["prefix_tokens_reused"] == 0


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_key_tiles_ship_as_rows(tiny_llama: Path, kv: str) -> None:
    """A CPU pool whose kernels have tile bodies stores q8_0 / q4_0 keys (AVX2, AVX-512) and values
    (AVX-512 VNNI) as 16-row key and value tiles when block_tokens is a multiple of 16
    (native/kv_format.h); a snapshot holds rows. A blob goes through a
    row pool (block_tokens 5) and a tiled one (32, the second import sharing the first's full block) and comes
    back byte for byte, and the tiled pool continues the session as the source does."""
    src = Engine(tiny_llama, kv_k=kv, kv_v=kv, block_tokens=16)
    s = src.add_sequence(PROMPT, Sampling(max_new_tokens=6))
    drain(src, s)
    blob = src.export_kv(s)
    rows = Engine(tiny_llama, kv_k=kv, kv_v=kv, block_tokens=5)
    assert rows.export_kv(rows.import_kv(blob)) == blob
    tiles = Engine(tiny_llama, kv_k=kv, kv_v=kv, block_tokens=32)
    assert not rows.memory()["key_tiles"] and src.memory()["key_tiles"] == (src.isa in ("avx2", "avx512", "avx512_amx"))
    assert tiles.memory()["key_tiles"] == src.memory()["key_tiles"]
    assert not rows.memory()["value_tiles"] and src.memory()["value_tiles"] == (src.isa in ("avx512", "avx512_amx"))
    assert tiles.memory()["value_tiles"] == src.memory()["value_tiles"]
    a = tiles.import_kv(blob)
    b = tiles.import_kv(blob)  # holds a's full block (42 positions: one of 32) instead of writing it
    assert tiles.memory()["blocks_shared"] == 1
    assert tiles.export_kv(a) == blob and tiles.export_kv(b) == blob
    src.append(s, TURN2, Sampling(max_new_tokens=5))
    tiles.append(a, TURN2, Sampling(max_new_tokens=5))
    assert drain(tiles, a) == drain(src, s)


# -- bad input ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_blob(tiny_llama: Path) -> bytes:
    eng = Engine(tiny_llama)
    s = eng.add_sequence(PROMPT, Sampling(max_new_tokens=2))
    drain(eng, s)
    return eng.export_kv(s)


def test_truncated_blobs_are_refused(tiny_llama: Path, small_blob: bytes) -> None:
    dst = Engine(tiny_llama)
    for n in (0, 10, 87, 88, 100, len(small_blob) // 2, len(small_blob) - 1):
        with pytest.raises(ValueError, match="truncated"):
            dst.import_kv(small_blob[:n])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        dst.import_kv(small_blob + b"\0")  # trailing bytes
    assert dst.memory()["blocks_in_use"] == 0 and dst.sequence_ids() == []


def test_flipped_bytes_are_refused(tiny_llama: Path, small_blob: bytes) -> None:
    dst = Engine(tiny_llama)
    snap = parse(small_blob)
    token_at = 88 + snap["n_layer"]
    for pos in (token_at + 5, len(small_blob) // 2, len(small_blob) - 20, len(small_blob) - 3):
        bad = bytearray(small_blob)
        bad[pos] ^= 0x10
        with pytest.raises(ValueError, match="checksum"):
            dst.import_kv(bad)
    bad = bytearray(small_blob)
    bad[:8] = b"NOTASNAP"
    with pytest.raises(ValueError, match="not a KV snapshot"):
        dst.import_kv(bytes(bad))
    assert dst.sequence_ids() == []


def test_wrong_version_is_refused(tiny_llama: Path, small_blob: bytes) -> None:
    bad = bytearray(small_blob)
    struct.pack_into("<I", bad, 8, 2)
    with pytest.raises(ValueError, match="version 2, this engine reads version 1"):
        Engine(tiny_llama).import_kv(bytes(bad))


def test_another_models_blob_is_refused(default_model, tiny_llama: Path, small_blob: bytes) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"another model \(n_layer 3 in the snapshot, 30 in this model\)"):
        Engine(default_model).import_kv(small_blob)
    qwen = tinymodels.tiny_model("qwen2", "F32")
    with pytest.raises(ValueError, match="another model .arch 'llama' in the snapshot, 'qwen2'"):
        Engine(qwen).import_kv(small_blob)


def test_synthetic_rows_cannot_be_exported(tiny_llama: Path) -> None:
    eng = Engine(tiny_llama)
    s = eng.add_sequence([1, 2, 3], Sampling(), generate=False)
    drain(eng, s)
    eng.fill_kv(s, 20, seed=1)
    with pytest.raises(ValueError, match="synthetic"):
        eng.export_kv(s)
    with pytest.raises(ValueError, match="synthetic"):
        eng.kv_export_bytes(s)
    with pytest.raises(KeyError):
        eng.export_kv(12345)


def test_random_damage_is_always_a_clear_error(tiny_llama: Path, small_blob: bytes) -> None:
    """Seeded random damage (flips anywhere, header fields set to extremes, cuts): always ValueError,
    never a crash, and the engine holds nothing afterwards."""
    dst = Engine(tiny_llama)
    rng = np.random.default_rng(1818)
    extremes = [0, 1, 2, 0x7FFFFFFF, 0xFFFFFFFF, 88, len(small_blob)]
    for trial in range(300):
        bad = bytearray(small_blob)
        kind = trial % 3
        if kind == 0:
            for pos in rng.integers(0, len(bad), size=int(rng.integers(1, 4))):
                bad[int(pos)] ^= int(rng.integers(1, 256))
        elif kind == 1:  # one 32-bit header field (after the magic) set to an extreme value
            field = int(rng.integers(2, 22))
            struct.pack_into("<I", bad, 4 * field, extremes[int(rng.integers(0, len(extremes)))])
        else:
            bad = bad[: int(rng.integers(0, len(bad)))]
        if bytes(bad) == small_blob:
            continue
        with pytest.raises(ValueError, match="import_kv: "):
            dst.import_kv(bytes(bad))
    assert dst.sequence_ids() == [] and dst.memory()["blocks_in_use"] == 0


def test_damaged_blobs_under_address_and_undefined_behavior_sanitizers(tmp_path: Path) -> None:
    """native/tests/kv_transfer_test.cpp in the ASan + UBSan build: good imports (same format, converted,
    another block_tokens) and damaged ones (cuts, flips, header fields and tokens at extremes with a
    recomputed checksum) are refused with invalid_argument, never a crash or an out-of-bounds read."""
    import re
    import subprocess

    import refmodel
    from test_native_kernels import NATIVE, ROOT, _run_sanitized

    build = ROOT / "build" / "native-asan"  # the sanitizer build tests/test_native_kernels.py uses
    configure = ["cmake", "-S", str(NATIVE), "-B", str(build), "-DKVS_BUILD_TESTS=ON", "-DKVS_SANITIZE=ON"]
    subprocess.run([*configure, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], check=True, capture_output=True, text=True)
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "kvs_kv_transfer_test", "-j", "2"],
        check=True,
        capture_output=True,
        text=True,
    )
    model = tmp_path / "tiny_Q8_0.gguf"
    refmodel.write_tiny_llama(model, weight_type="Q8_0", n_layer=2, seed=3)
    proc = _run_sanitized([str(build / "kvs_kv_transfer_test"), str(model)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"^(\d+) imported, (\d+) rejected, 0 failed$", proc.stdout, re.M)
    assert found, proc.stdout[-3000:]
    imported, rejected = int(found.group(1)), int(found.group(2))
    assert imported == 4 * 3 * 2  # 4 format pairs x 3 destinations x (import, re-import)
    assert rejected > 4 * 100
