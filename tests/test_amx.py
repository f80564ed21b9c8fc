"""The avx512_amx level against avx512 on real model files. AMX only changes where the integer sums of the
many-row weight multiplies come from (tile instructions instead of vpdpbusd, both exact), and keeps each
output's float chain (native/kernels/x86_simd.inc, amx_tiles_body), so every logit must have the same bits:
a prefill (the Q4_1 / K-quant matrices from 32 rows, with a short last chunk) and a 16-sequence step (the
Q8_0 output matrix from 8 rows). Runs only where the CPU and Linux allow AMX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ISA_LEVELS

from worker.engine import Engine, Sampling

pytestmark = pytest.mark.skipif("avx512_amx" not in ISA_LEVELS, reason="no AMX-INT8 here (or Linux refused it)")


def _prompt(seed: int, n: int) -> list[int]:
    return [(31 * i + 17 * seed) % 4000 + 100 for i in range(n)]


def _logits(path: Path, isa: str) -> tuple[np.ndarray, np.ndarray]:
    eng = Engine(path, kv_k="q8_0", kv_v="q8_0", threads=2, isa=isa)
    assert eng.isa == isa
    s = eng.add_sequence(_prompt(0, 1), generate=False)
    scored = eng.score(s, _prompt(1, 75))  # 76 rows: four chunks of 16 and one of 12
    eng.free(s)
    for k in range(16):
        eng.add_sequence(_prompt(k + 2, 5 + k), Sampling(max_new_tokens=3))
    eng.step()  # the prompts
    eng.step()  # one decode row per sequence
    return scored, eng.last_logits()


@pytest.mark.parametrize("which", ["default", "gemma3"])
def test_amx_level_same_bits_as_avx512(which: str, default_model: Path, request: pytest.FixtureRequest) -> None:
    path = default_model if which == "default" else request.getfixturevalue("gemma3_270m")
    vnni_scored, vnni_step = _logits(path, "avx512")
    amx_scored, amx_step = _logits(path, "avx512_amx")
    assert vnni_scored.shape == (76, vnni_scored.shape[1]) and vnni_step.shape[0] == 16
    assert np.isfinite(vnni_scored).all()
    np.testing.assert_array_equal(amx_scored, vnni_scored)
    np.testing.assert_array_equal(amx_step, vnni_step)
