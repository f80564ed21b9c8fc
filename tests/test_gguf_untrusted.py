"""A model file is untrusted input: corrupt files raise clear Python errors and
never crash the process. Each case runs in a subprocess so a crash (a signal)
fails the test instead of killing the test runner."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import refmodel

from worker.engine import read_gguf

LOADER = """
import json, sys
from worker.engine import Engine
results = []
for path in sys.argv[1:]:
    try:
        Engine(path, threads=1)
        results.append("ok")
    except Exception as e:
        results.append(type(e).__name__ + ": " + str(e))
print(json.dumps(results))
"""


def load_in_subprocess(*paths: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", LOADER, *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"loader crashed (rc={proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("good") / "good.gguf"
    refmodel.write_tiny_llama(path, weight_type="Q4_1", n_layer=1, seed=1)
    return path.read_bytes()


def tensor_info_offset(data: bytes, name: str) -> int:
    """Byte offset just after the tensor's name in the tensor table."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def variants(good: bytes) -> dict[str, tuple[bytes, str]]:
    """{case: (file bytes, text the error must contain)}"""
    emb = tensor_info_offset(good, "token_embd.weight")  # then: u32 n_dims, u64 dims[2], u32 type, u64 offset
    type_at = emb + 4 + 16
    offset_at = type_at + 4
    arch_key = good.index(b"general.architecture") + len(b"general.architecture") + 4  # after value type
    cases = {
        "empty": (b"", "truncated"),
        "bad magic": (b"GGML" + good[4:], "bad magic"),
        "version 1": (good[:4] + struct.pack("<I", 1) + good[8:], "unsupported GGUF version 1"),
        "absurd tensor count": (good[:8] + struct.pack("<Q", 1 << 40) + good[16:], "absurd tensor count"),
        "absurd metadata count": (
            good[:16] + struct.pack("<Q", 1 << 50) + good[24:],
            "absurd metadata count",
        ),
        "truncated header": (good[:20], "truncated"),
        "truncated metadata": (good[:200], "truncated"),
        "truncated tensor data": (good[: len(good) - 1000], "runs past the end"),
        "unknown tensor type": (
            good[:type_at] + struct.pack("<I", 16) + good[type_at + 4 :],  # IQ2_XXS: a real type we lack
            "unsupported tensor type IQ2_XXS in token_embd.weight",
        ),
        "tensor offset past end": (
            good[:offset_at] + struct.pack("<Q", 1 << 40) + good[offset_at + 8 :],
            "runs past the end",
        ),
        "misaligned tensor": (good[:offset_at] + struct.pack("<Q", 3) + good[offset_at + 8 :], "not aligned"),
        "huge string length": (
            good[:arch_key] + struct.pack("<Q", 1 << 62) + good[arch_key + 8 :],
            "absurd length",
        ),
        "absurd dims": (good[:emb] + struct.pack("<I", 9) + good[emb + 4 :], "dimensions"),
    }
    return cases


def test_corrupt_files_raise_clear_errors(good: bytes, tmp_path: Path) -> None:
    cases = variants(good)
    paths = []
    for i, (data, _) in enumerate(cases.values()):
        p = tmp_path / f"case{i}.gguf"
        p.write_bytes(data)
        paths.append(p)
    results = load_in_subprocess(*paths)
    for (name, (_, expected)), got in zip(cases.items(), results, strict=True):
        assert got != "ok", f"{name}: loaded without error"
        assert expected in got, f"{name}: error {got!r} does not mention {expected!r}"
        assert got.startswith(("RuntimeError", "ValueError")), f"{name}: {got}"


def test_unsupported_architecture(tmp_path: Path) -> None:
    p = tmp_path / "gpt2.gguf"
    refmodel.write_tiny_llama(p, arch="gpt2", n_layer=1)
    [got] = load_in_subprocess(p)
    assert "architecture 'gpt2'" in got and "not supported" in got


def test_missing_tensor(good: bytes, tmp_path: Path) -> None:
    # Rename one tensor so the model lacks it (same length keeps the file valid).
    data = good.replace(b"blk.0.ffn_up.weight", b"blk.0.ffn_xx.weight")
    p = tmp_path / "missing.gguf"
    p.write_bytes(data)
    [got] = load_in_subprocess(p)
    assert "lacks tensor 'blk.0.ffn_up.weight'" in got


def test_missing_file_and_directory(tmp_path: Path) -> None:
    got = load_in_subprocess(tmp_path / "nope.gguf", tmp_path)
    assert all(g.startswith("ModelNotFoundError") for g in got)


def test_random_corruption_never_crashes(good: bytes, tmp_path: Path) -> None:
    """Random byte flips in the header and tables: every file loads or raises, none crashes."""
    rng = np.random.default_rng(0)
    header_end = tensor_info_offset(good, "output_norm.weight") + 64
    paths = []
    for i in range(60):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 8))):
            pos = int(rng.integers(0, header_end))
            data[pos] = int(rng.integers(0, 256))
        if i % 3 == 0:
            data = data[: int(rng.integers(0, len(data)))]
        p = tmp_path / f"fuzz{i}.gguf"
        p.write_bytes(bytes(data))
        paths.append(p)
    results = load_in_subprocess(*paths)
    assert len(results) == len(paths)


def test_read_gguf_of_default_model(default_model: Path) -> None:
    info = read_gguf(default_model)
    meta = info["metadata"]
    assert info["version"] == 3
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 30
    assert len(meta["tokenizer.ggml.tokens"]) == 49152
    assert len(info["tensors"]) == 272
    types = {t["name"]: t["type"] for t in info["tensors"]}
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q4_1"
