"""Text-level API and CLI on the real default model: streaming, stop strings,
stop tokens, turns, bad requests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tinymodels import TINY_SPECS, tiny_model

from swarm.gguf_header import read_header
from worker.engine import Engine, Sampling


@pytest.fixture(scope="module")
def engine(default_model):  # type: ignore[no-untyped-def]
    return Engine(default_model, kv_k="f16", kv_v="f16")


# GGML type ids with a weight-tile layout (native/quant.h): Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K.
TILE_TYPES = (2, 3, 6, 8, 12, 13, 14)


def test_stream_pieces_join_to_text(engine: Engine) -> None:
    it = engine.stream("Once upon a time, in a small village,", max_tokens=20)
    pieces = []
    while True:
        try:
            pieces.append(next(it))
        except StopIteration as done:
            result = done.value
            break
    assert "".join(p for _, p in pieces) == result.text
    assert len(result.token_ids) == 20 and result.finish_reason == "max_tokens"
    assert result.text == engine.tokenizer.decode(result.token_ids, skip_special=True)
    assert engine.memory()["sequences"] == 0  # stream frees its sequence


def test_stop_string_truncates_and_is_never_emitted(engine: Engine) -> None:
    free = engine.generate("def fibonacci(n):", max_tokens=32)
    # Pick a stop string from the middle of the free-running text, so it must be hit.
    stop = free.text[10:14]
    assert len(stop) == 4 and stop.strip()
    it = engine.stream("def fibonacci(n):", max_tokens=32, stop=[stop])
    emitted = ""
    while True:
        try:
            emitted += next(it)[1]
        except StopIteration as done:
            result = done.value
            break
    assert result.finish_reason == "stop_string"
    assert result.text == free.text[: free.text.index(stop)]
    assert emitted == result.text


def test_chat_template_and_end_of_turn(engine: Engine) -> None:
    # (For "...capital of France?" this model's first token is a near-tie that
    # llama.cpp itself resolves to "L'Étoile..."; Germany has a clear answer.)
    result = engine.generate("What is the capital of Germany?", chat=True, max_tokens=64)
    assert result.finish_reason == "stop_token"
    assert result.token_ids[-1] in engine.tokenizer.eot_ids
    assert "Berlin" in result.text
    assert result.prompt_ids[:1] == [engine.tokenizer.token_id("<|im_start|>")]


def test_bad_tokens_and_unknown_sequences(engine: Engine) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_sequence([1, 2, 49152])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_sequence([-1])
    with pytest.raises(KeyError, match="no sequence with id"):
        engine.free(987654)
    with pytest.raises(KeyError):
        engine.append(987654, [1])
    with pytest.raises(ValueError, match="8192-token context"):
        engine.add_sequence([1] * 8193)
    with pytest.raises(ValueError, match="unknown KV format"):
        Engine(engine.model_path, kv_k="q3_7")
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate("")
    assert engine.memory()["sequences"] == 0


def test_context_limit_ends_generation(tiny_models) -> None:  # type: ignore[no-untyped-def]
    # Tiny models have a 256-token context.
    eng = Engine(tiny_models["F32"])
    seq = eng.add_sequence(list(range(250)), Sampling(max_new_tokens=100))
    made = 0
    while eng.busy():
        made += len(eng.step())
    assert eng.info(seq)["finish_reason"] == "context"
    assert len(eng.tokens(seq)) == 256 and made == 6


def _huge_pages_expected(path: Path) -> bool:
    """Whether Engine(huge_pages=True) should copy `path` into huge pages on this host, derived from the
    host's own files the way native/gguf.cpp decides: THP offered, the file at least one 2 MiB page,
    and at most half of MemAvailable."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    offered = mode.is_file() and "[" in mode.read_text() and "[never]" not in mode.read_text()
    available = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    size = path.stat().st_size
    return offered and size >= 2 << 20 and size <= available // 2


def test_huge_page_weights_give_the_same_bits(default_model: Path, tiny_models) -> None:  # type: ignore[no-untyped-def]
    """The weights in a huge-page copy (the default; packed as 16-row tiles where the kernels have tile
    bodies) and in the file's map (rows) give the same logits bit for bit and the same text; memory()
    says where they live and how many bytes are tiles."""
    prompt = "The capital of France is"
    copied = Engine(default_model, kv_k="q8_0", kv_v="q8_0")
    mapped = Engine(default_model, kv_k="q8_0", kv_v="q8_0", huge_pages=False)
    assert copied.memory()["weights_huge_pages"] == _huge_pages_expected(default_model)
    assert not mapped.memory()["weights_huge_pages"]
    # In the copy, every 2-D matrix of a type the kernels have a tile body for, with rows a multiple of
    # 16, is packed as weight tiles (native/quant.h); the map keeps rows.
    types = _tile_types(copied)
    packable = sum(
        t.nbytes
        for t in read_header(default_model).tensors.values()
        if t.ggml_type in types and len(t.dims) == 2 and t.dims[1] % 16 == 0
    )
    assert copied.memory()["weight_tile_bytes"] == (packable if copied.memory()["weights_huge_pages"] else 0)
    assert mapped.memory()["weight_tile_bytes"] == 0
    ids = copied.tokenizer.encode(prompt)
    got = []
    for eng in (copied, mapped):
        s = eng.add_sequence(ids, Sampling(max_new_tokens=1))
        eng.step()
        got.append(eng.last_logits().tobytes())
        eng.free(s)
    assert len(got[0]) > 0 and got[0] == got[1]
    assert copied.generate(prompt, max_tokens=12).token_ids == mapped.generate(prompt, max_tokens=12).token_ids
    # A file under one huge page stays mapped.
    small = min(tiny_models.values(), key=lambda p: p.stat().st_size)
    assert small.stat().st_size < 2 << 20
    assert not Engine(small).memory()["weights_huge_pages"]


def _tile_types(eng: Engine) -> set[int]:
    """The GGML types eng's kernels serve as weight tiles: a subset of TILE_TYPES, all seven on the x86
    levels (AVX2 and AVX-512 VNNI each have a tile body per type; avx512_amx is AVX-512 VNNI's with AMX
    for the many-row calls)."""
    types = set(eng.memory()["weight_tile_types"])
    assert types <= set(TILE_TYPES)
    if eng.isa in ("avx2", "avx512", "avx512_amx"):
        assert types == set(TILE_TYPES)
    return types


def _expected_tile_bytes(path: Path, types: set[int]) -> int:
    """The bytes Model::pack_tiles should pack, from the file's header: every matrix of one of `types`
    whose rows (per expert, for a 3-D expert stack) are a multiple of 16."""
    total = 0
    for t in read_header(path).tensors.values():
        if t.ggml_type in types and len(t.dims) in (2, 3) and t.dims[1] % 16 == 0:
            total += t.nbytes
    return total


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_K_M", "Q5_K_M"])
@pytest.mark.parametrize("family", sorted(TINY_SPECS))
def test_weight_tiles_give_the_same_bits_on_every_architecture(family: str, weight_type: str) -> None:
    """Each architecture's Q8_0 tiny model, its Q4_K_M one (llama.cpp's mix: Q5_0, Q4_K, Q6_K, Q8_0) and
    its Q5_K_M one (Q5_0, Q5_K, Q6_K), over 2 MiB: its huge-page copy is packed as weight tiles, MoE
    expert stacks included. It gives the same logits bit for bit as its rows in the file's map, over a
    prefill and batched decode steps of two sequences."""
    path = tiny_model(family, weight_type)
    if weight_type != "Q8_0":
        held = {t.ggml_type for t in read_header(path).tensors.values()}
        k_type = 12 if weight_type == "Q4_K_M" else 13
        assert {k_type, 14} <= held, f"the file holds {weight_type[:4]} and Q6_K matrices"
    tiled = Engine(path, kv_k="q8_0", kv_v="q8_0")
    rows = Engine(path, kv_k="q8_0", kv_v="q8_0", huge_pages=False)
    mem = tiled.memory()
    assert mem["weight_tile_bytes"] == (
        _expected_tile_bytes(path, _tile_types(tiled)) if mem["weights_huge_pages"] else 0
    )
    assert rows.memory()["weight_tile_bytes"] == 0
    got = []
    for eng in (tiled, rows):
        a = eng.add_sequence([1, 5, 9, 14, 3, 27, 8], Sampling(max_new_tokens=4))
        b = eng.add_sequence([2, 11, 6], Sampling(max_new_tokens=4))
        steps = []
        for _ in range(4):
            eng.step()
            steps.append(eng.last_logits().tobytes())
        got.append(steps)
        eng.free(a)
        eng.free(b)
    assert got[0] == got[1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarm.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_generate_json(engine: Engine) -> None:
    proc = run_cli(
        "generate",
        "--json",
        "--max-tokens",
        "12",
        "--kv-k",
        "q8_0",
        "--kv-v",
        "q4_0",
        "The capital of France is",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["prompt_ids"] == engine.tokenizer.encode("The capital of France is")
    assert len(out["generated_ids"]) <= 12 and out["kv_k"] == "q8_0"
    assert out["text"] == engine.tokenizer.decode(out["generated_ids"], skip_special=True)


def test_cli_streams_text_and_reports_speed() -> None:
    proc = run_cli("generate", "--max-tokens", "8", "The capital of France is")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tokens/s" in proc.stderr


def test_cli_bad_model_path_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("generate", "--model", str(tmp_path / "missing.gguf"), "hi")
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    proc = run_cli("generate", "--model", str(bad), "hi")
    assert proc.returncode == 2 and "invalid GGUF file" in proc.stderr
