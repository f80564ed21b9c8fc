"""What the Vulkan engine tests share (test_vulkan_engine.py, test_vulkan_moe.py, test_vulkan_intdot.py,
test_vulkan.py): engines on a backend, their logits, the error measures, greedy and batched runs, a fresh
pytest process.

Each test file keeps its own constants (block size, chunk, scored positions, margins) and binds them here
with functools.partial, so a helper carries no file's numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine import Engine, Sampling

# A fresh pytest process may take this long (seconds) before the caller's test fails rather than hangs.
SUBPROCESS_TIMEOUT_S = 600


def device_of(backend: str, device: int) -> int:
    """The device index an Engine on `backend` takes: the Vulkan device for "vulkan", 0 for the CPU backends."""
    return device if backend == "vulkan" else 0


def make_engine(
    path: Path, backend: str, device: int, *, block_tokens: int, max_batch_tokens: int, **kw: Any
) -> Engine:
    """An Engine on `backend` with float activations unless kw says otherwise."""
    opts: dict[str, Any] = {"block_tokens": block_tokens, "max_batch_tokens": max_batch_tokens}
    opts.update({"float_activations": True, **kw})
    return Engine(path, backend=backend, device=device_of(backend, device), **opts)


def tail_logits(eng: Engine, prompt: list[int], scored: int) -> np.ndarray:
    """Logits (scored, vocab) after each of the prompt's last `scored` tokens; the rest is prefilled by step."""
    sid = eng.add_sequence(prompt[:-scored], generate=False)
    while eng.busy():
        eng.step()
    return eng.score(sid, prompt[-scored:])


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| as a share of the largest |ref| (shapes equal, got finite)."""
    assert got.shape == ref.shape and np.isfinite(got).all()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def clear_argmax_agrees(got: np.ndarray, ref: np.ndarray, margin: float) -> None:
    """Rows where ref's best logit leads the second by more than `margin` of the largest |ref| (at least one
    such row) pick the same token in got."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > margin * np.abs(ref).max()
    assert clear.any()
    assert (got.argmax(1) == ref.argmax(1))[clear].all()


def greedy_run(eng: Engine, prompt: list[int], n_new: int) -> tuple[list[int], list[np.ndarray]]:
    """Prefill (in chunks) then n_new greedy decode steps: the ids and each step's logits row (vocab,)."""
    sid = eng.add_sequence(prompt, Sampling(max_new_tokens=n_new))
    ids, rows = [], []
    while eng.busy():
        out = eng.step()
        if sid in out:
            ids.append(out[sid])
            rows.append(eng.last_logits()[0].copy())
    return ids, rows


def assert_batch_invariant(eng: Engine, prompts: list[list[int]], n_new: int) -> None:
    """Each prompt's logits at every one of its n_new steps are bit-equal run alone and run with all the
    others (decodes and prefill chunks of the others in the same steps)."""

    def run(group: list[list[int]]) -> list[list[np.ndarray]]:
        ids = [eng.add_sequence(p, Sampling(max_new_tokens=n_new)) for p in group]
        rows: dict[int, list[np.ndarray]] = {i: [] for i in ids}  # {sequence id: its logits rows}
        while eng.busy():
            out = eng.step()
            logits = eng.last_logits()
            for r, sid in enumerate(out):  # rows follow the returned pairs' order
                rows[sid].append(logits[r].copy())
        for i in ids:
            eng.free(i)
        return [rows[i] for i in ids]

    alone = [run([p])[0] for p in prompts]
    together = run(prompts)
    for a, t in zip(alone, together, strict=True):
        assert len(a) == len(t) == n_new
        for x, y in zip(a, t, strict=True):
            assert np.array_equal(x, y)


def run_pytest(tests: list[str], env: dict[str, str], passed: int) -> None:
    """Runs the test ids `tests` in a fresh pytest process under `env` (for settings the backend reads once
    per process) and asserts that it succeeds with `passed` tests passed."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"{passed} passed" in r.stdout
