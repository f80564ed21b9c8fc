"""The dependency-free floor (worker/formats.py, sampling.py, settings.py) against the native engine."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from worker import _native
from worker.engine import Engine
from worker.formats import KV_FORMATS, all_pairs, kv_row_bytes, pair_name, parse_pair
from worker.sampling import Sampling
from worker.settings import DEFAULT_ENGINE, EngineSettings

HEAD_DIMS = (32, 64, 96, 128, 256)


@pytest.mark.parametrize("fmt", KV_FORMATS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_row_bytes_match_native(fmt: str, head_dim: int) -> None:
    assert kv_row_bytes(fmt, head_dim) == _native.kv_row_bytes(fmt, head_dim)


@pytest.mark.parametrize("fmt", ["q8_0", "q8_head", "q4_0"])
def test_quantized_formats_refuse_odd_head_dims_like_native(fmt: str) -> None:
    with pytest.raises(ValueError):
        kv_row_bytes(fmt, 48)
    with pytest.raises(ValueError):
        _native.kv_row_bytes(fmt, 48)


@pytest.mark.parametrize("bogus", ["bogus", "q4_1", "F16", ""])
def test_unknown_format_refused_by_both(bogus: str) -> None:
    with pytest.raises(ValueError):
        kv_row_bytes(bogus, 64)
    with pytest.raises(ValueError):
        _native.kv_row_bytes(bogus, 64)


def test_format_list_is_the_natives() -> None:
    """The native parser names the formats it accepts when it refuses one: the same list, in order.

    (A native `kv_formats()` binding would make this a direct comparison.)
    """
    with pytest.raises(ValueError) as e:
        _native.kv_row_bytes("bogus", 64)
    m = re.search(r"expected one of ([\w, ]+)", str(e.value))
    assert m is not None, str(e.value)
    assert tuple(x.strip() for x in m.group(1).split(",")) == KV_FORMATS


def test_pair_names_round_trip() -> None:
    pairs = all_pairs()
    assert len(pairs) == len(KV_FORMATS) ** 2
    for p in pairs:
        assert parse_pair(pair_name(p)) == p
    assert pair_name(("q8_0", "q8_0")) == "q8_0"
    assert pair_name(("q8_0", "f16")) == "q8_0/f16"
    for bad in ("q8_0/f16/f32", "q8_0/", "bogus", "f16/bogus"):
        with pytest.raises(ValueError):
            parse_pair(bad)


def test_engine_defaults_are_the_natives(tiny_models) -> None:  # type: ignore[no-untyped-def]
    """worker/settings.py's defaults are what native/bindings.cpp declares (it repeats them) and uses."""
    doc = _native.Engine.__init__.__doc__ or ""
    for f in dataclasses.fields(EngineSettings):
        m = re.search(rf"\b{f.name}: [^=]+= (\d+)", doc)
        assert m is not None, (f.name, doc)
        assert int(m.group(1)) == getattr(DEFAULT_ENGINE, f.name), f.name
    assert Engine(tiny_models["F32"]).memory()["block_tokens"] == DEFAULT_ENGINE.block_tokens


def test_sampling_defaults_are_the_natives() -> None:
    native = _native.SamplingParams()
    for f in dataclasses.fields(Sampling):
        want = list(f.default) if isinstance(f.default, tuple) else f.default
        assert getattr(native, f.name) == pytest.approx(want), f.name


def test_floor_loads_without_the_engine() -> None:
    """formats, sampling and settings import neither the compiled module nor Ray."""
    code = (
        "import sys; import worker.formats, worker.sampling, worker.settings; "
        "bad = [m for m in ('worker._native', 'ray', 'numpy') if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
