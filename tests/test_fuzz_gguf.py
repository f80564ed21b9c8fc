"""A brief coverage-guided fuzzing run of the GGUF readers (bench/fuzz_gguf.py runs longer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_gguf_readers_survive_a_short_fuzzing_run(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fuzz_gguf.py"), "-runs=4000", "-seed=7", "-timeout=30",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    tail = proc.stderr[-4000:]
    assert proc.returncode == 0, f"the fuzzer found a failing input:\n{tail}"
    assert "DONE" in proc.stderr and "cov:" in proc.stderr, tail
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("timeout-*"))
