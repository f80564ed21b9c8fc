"""Shared fixtures: tiny generated GGUF models and the real default model."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import refmodel  # noqa: E402

from worker import formats  # noqa: E402
from worker.engine import isa_levels  # noqa: E402
from worker.models import default_model_path  # noqa: E402

# Session-scoped fixtures (Ray clusters, servers) start before any test's own cache below: give them an
# empty cache too, never the user's ~/.cache/kvswarm (which `make demo` fills).
os.environ["KVSWARM_CACHE"] = tempfile.mkdtemp(prefix="kvswarm-cache-session-")


def _llama_cpp_plain_buffers_where_amx_crashes() -> None:
    """ggml's AMX weight buffers die of SIGSEGV in the first evaluation on some AMX-INT8 machines (llama.cpp
    issue 20824; llama-cpp-python 0.3.36 built natively on this project's Xeon host, any batch, the default
    model). On a CPU with AMX a child process first runs bench/llama_peer.py's probe (a prefill with
    llama.cpp's default model parameters); where it dies, every llama.cpp model the tests load comes up
    without llama.cpp's extra buffer types (its plain CPU kernels, as on a CPU without AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return
    if "amx_int8" not in flags:
        return
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as ll
    except ImportError:
        return
    probe = Path(__file__).resolve().parent.parent / "bench" / "llama_peer.py"
    r = subprocess.run(
        [sys.executable, str(probe), "--probe", str(default_model_path())], capture_output=True, timeout=600
    )
    if r.returncode == 0:
        return
    default_params = ll.llama_model_default_params

    def plain_params() -> object:
        p = default_params()
        p.use_extra_bufts = False
        return p

    ll.llama_model_default_params = plain_params  # what llama_cpp.Llama calls
    llama_cpp.llama_model_default_params = plain_params  # the package's re-export


_llama_cpp_plain_buffers_where_amx_crashes()

WEIGHT_TYPES = list(refmodel.WEIGHT_TYPES)
KV_FORMATS = list(formats.KV_FORMATS)  # as a list for parametrize ids
ISA_LEVELS = isa_levels()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test starts from an empty calibration cache of its own (never ~/.cache/kvswarm)."""
    path = tmp_path_factory.mktemp("kvswarm-cache")
    monkeypatch.setenv("KVSWARM_CACHE", str(path))
    return path


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{weight type: path} of a 2-layer random Llama (head_dim 32, GQA 4:2, vocab 257)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for wt in WEIGHT_TYPES:
        path = root / f"tiny_{wt}.gguf"
        refmodel.write_tiny_llama(path, weight_type=wt, n_layer=2, seed=7)
        out[wt] = path
    return out


@pytest.fixture(scope="session")
def tiny_untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_untied") / "tiny_untied.gguf"
    refmodel.write_tiny_llama(path, weight_type="Q8_0", n_layer=3, tied=False, seed=11)
    return path


@pytest.fixture(scope="session")
def default_model() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def default_engine_f32(default_model: Path):  # type: ignore[no-untyped-def]
    from worker.engine import Engine

    return Engine(default_model, kv_k="f32", kv_v="f32", threads=2)


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    """The real Gemma 3 270M Q4_K_M (tests/model_files.py; assembled into $KVSWARM_TEST_MODELS once)."""
    import model_files

    return model_files.gemma3_270m()


@pytest.fixture(scope="session")
def tiny_arch_models() -> dict[str, Path]:
    """{family: path} of the tiny F32 model of every architecture (tests/tinymodels.py; cached)."""
    import tinymodels

    return {family: tinymodels.tiny_model(family, "F32") for family in tinymodels.TINY_SPECS}
