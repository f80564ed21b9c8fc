"""Many sequences at once: batched steps give exactly what each sequence gives alone."""

from __future__ import annotations

import pytest
from conftest import KV_FORMATS

from worker.engine import Engine, Sampling

PROMPTS = [[5, 17, 200, 3], [99, 41, 7, 250, 1, 0, 33, 66, 128, 129, 130], [256], list(range(40, 77))]


def run_alone(path, kv: str, prompt: list[int], sampling: Sampling) -> list[int]:  # type: ignore[no-untyped-def]
    eng = Engine(path, kv_k=kv, kv_v=kv, threads=2)
    seq = eng.add_sequence(prompt, sampling)
    out = []
    while eng.busy():
        out += [t for s, t in eng.step().items() if s == seq]
    return out


def run_together(path, kv: str, prompts, samplings, max_batch_tokens: int = 256):  # type: ignore[no-untyped-def]
    eng = Engine(path, kv_k=kv, kv_v=kv, threads=2, max_batch_tokens=max_batch_tokens)
    ids = [eng.add_sequence(p, s) for p, s in zip(prompts, samplings, strict=True)]
    out: dict[int, list[int]] = {i: [] for i in ids}
    while eng.busy():
        for s, t in eng.step().items():
            out[s].append(t)
    return [out[i] for i in ids]


@pytest.mark.parametrize("kv", KV_FORMATS)
def test_batch_invariance_tiny(tiny_models, kv: str) -> None:  # type: ignore[no-untyped-def]
    path = tiny_models["Q4_1"]
    samplings = [Sampling(max_new_tokens=12 + i) for i in range(len(PROMPTS))]
    alone = [run_alone(path, kv, p, s) for p, s in zip(PROMPTS, samplings, strict=True)]
    # Small max_batch_tokens forces prefill chunks to interleave with other sequences' decodes.
    together = run_together(path, kv, PROMPTS, samplings, max_batch_tokens=9)
    assert together == alone
    assert [len(t) for t in together] == [12, 13, 14, 15]


@pytest.mark.parametrize("kv", KV_FORMATS)
def test_batch_invariance_default_model(default_model, kv: str) -> None:  # type: ignore[no-untyped-def]
    prompts = [
        [504, 3575, 282, 4649, 314],
        [1604, 3987, 46477, 24, 94, 727],
        [17, 18, 19, 20, 21, 22, 23, 24],
    ]
    samplings = [
        Sampling(max_new_tokens=8),
        Sampling(max_new_tokens=8, temperature=0.8, seed=3, top_k=40),
        Sampling(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=5),
    ]
    alone = [run_alone(default_model, kv, p, s) for p, s in zip(prompts, samplings, strict=True)]
    together = run_together(default_model, kv, prompts, samplings)
    assert together == alone


def test_sequences_join_and_leave_mid_flight(tiny_models) -> None:  # type: ignore[no-untyped-def]
    path = tiny_models["Q8_0"]
    eng = Engine(path, kv_k="q8_head", kv_v="q4_0", threads=2)
    a = eng.add_sequence(PROMPTS[0], Sampling(max_new_tokens=20))
    got_a: list[int] = []
    for _ in range(3):
        got_a += [t for s, t in eng.step().items() if s == a]
    b = eng.add_sequence(PROMPTS[1], Sampling(max_new_tokens=6))
    c = eng.add_sequence(PROMPTS[3], Sampling(max_new_tokens=50))
    got_b: list[int] = []
    for i in range(12):
        step = eng.step()
        got_a += [t for s, t in step.items() if s == a]
        got_b += [t for s, t in step.items() if s == b]
        if i == 4:
            eng.free(c)  # leaves mid-generation
    while eng.busy():
        step = eng.step()
        got_a += [t for s, t in step.items() if s == a]
    # Compare with mixed K/V formats run alone:
    eng2 = Engine(path, kv_k="q8_head", kv_v="q4_0", threads=2)
    s2 = eng2.add_sequence(PROMPTS[0], Sampling(max_new_tokens=20))
    alone_a: list[int] = []
    while eng2.busy():
        alone_a += [t for s, t in eng2.step().items() if s == s2]
    assert got_a == alone_a
    assert len(got_b) == 6


def test_new_turn_keeps_kv(tiny_models) -> None:  # type: ignore[no-untyped-def]
    """A second turn appended to a sequence continues exactly as one sequence holding the whole history."""
    path = tiny_models["F16"]
    eng = Engine(path, kv_k="f16", kv_v="f16", threads=2)
    seq = eng.add_sequence(PROMPTS[1], Sampling(max_new_tokens=5))
    while eng.busy():
        eng.step()
    assert eng.info(seq)["finish_reason"] == "max_tokens"
    eng.append(seq, [7, 8, 9], Sampling(max_new_tokens=6))
    turn2 = []
    while eng.busy():
        turn2 += list(eng.step().values())
    history = eng.tokens(seq)
    fresh = Engine(path, kv_k="f16", kv_v="f16", threads=2)
    fresh.add_sequence(history[: len(history) - 6], Sampling(max_new_tokens=6))
    again = []
    while fresh.busy():
        again += list(fresh.step().values())
    assert turn2 == again == history[-6:]
