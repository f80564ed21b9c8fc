"""Sampling: greedy, temperature, top-k, top-p, repetition penalty, seeds —
checked against distributions computed in float64 from the engine's own logits."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine import Engine, Sampling

PROMPT = [5, 17, 200, 3, 99]
N_DRAWS = 1500


def last_logits(path) -> np.ndarray:  # type: ignore[no-untyped-def]
    eng = Engine(path, kv_k="f32", kv_v="f32")
    return eng.score(eng.add_sequence([], generate=False), PROMPT)[-1].astype(np.float64)


def first_tokens(path, make: callable) -> np.ndarray:  # type: ignore[valid-type]
    """The first sampled token of N_DRAWS sequences, sampling i built by make(i)."""
    eng = Engine(path, kv_k="f32", kv_v="f32", max_batch_tokens=4096)
    ids = [eng.add_sequence(PROMPT, make(i)) for i in range(N_DRAWS)]
    out: dict[int, int] = {}
    while eng.busy():
        out.update(eng.step())
    return np.array([out[i] for i in ids])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_greedy_is_argmax(tiny_models) -> None:  # type: ignore[no-untyped-def]
    logits = last_logits(tiny_models["F32"])
    draws = first_tokens(tiny_models["F32"], lambda i: Sampling(max_new_tokens=1, seed=i))
    assert (draws == int(np.argmax(logits))).all()


def test_temperature_matches_softmax(tiny_models) -> None:  # type: ignore[no-untyped-def]
    temp = 0.7
    p = softmax(last_logits(tiny_models["F32"]) / temp)
    draws = first_tokens(tiny_models["F32"], lambda i: Sampling(temperature=temp, seed=i, max_new_tokens=1))
    freq = np.bincount(draws, minlength=len(p)) / N_DRAWS
    # Each frequency within 4.5 binomial standard deviations of its probability.
    sigma = np.sqrt(p * (1 - p) / N_DRAWS)
    assert (np.abs(freq - p) <= 4.5 * sigma + 1.0 / N_DRAWS).all()
    assert len(np.unique(draws)) > 5  # really sampling, not greedy


def test_top_k_and_top_p_restrict_support(tiny_models) -> None:  # type: ignore[no-untyped-def]
    logits = last_logits(tiny_models["F32"])
    top5 = set(np.argsort(-logits)[:5].tolist())
    draws = first_tokens(tiny_models["F32"], lambda i: Sampling(temperature=1.5, top_k=5, seed=i, max_new_tokens=1))
    assert set(draws.tolist()) <= top5
    assert len(set(draws.tolist())) == 5  # at T=1.5 all five are drawn in 1500 tries

    p = softmax(logits)
    order = np.argsort(-p)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)].tolist())
    draws = first_tokens(tiny_models["F32"], lambda i: Sampling(temperature=1.0, top_p=0.6, seed=i, max_new_tokens=1))
    assert set(draws.tolist()) <= nucleus


def test_full_vocabulary_draws_match_float64_on_the_real_model(default_model) -> None:  # type: ignore[no-untyped-def]
    """Temperature without top_k over the default model's 49,152 tokens, the draw that does not sort the
    vocabulary: each likely token's frequency matches softmax(l / T) computed here in float64 from the
    engine's logits, and so does the mass of all the others. With top_p every draw falls in the nucleus
    (the float64 rank order's shortest prefix reaching top_p) in the nucleus's renormalised shares."""
    logits = last_logits(default_model)
    assert len(logits) > 30000

    def check(freq: np.ndarray, p: np.ndarray) -> None:
        likely = p > 0.01
        sigma = np.sqrt(p * (1 - p) / N_DRAWS)
        assert (np.abs(freq - p) <= 4.5 * sigma + 1.0 / N_DRAWS)[likely].all()
        tail, tail_f = p[~likely].sum(), freq[~likely].sum()
        assert abs(tail_f - tail) <= 4.5 * np.sqrt(tail * (1 - tail) / N_DRAWS) + 1.0 / N_DRAWS

    temp = 1.3
    p = softmax(logits / temp)
    draws = first_tokens(default_model, lambda i: Sampling(temperature=temp, seed=i, max_new_tokens=1))
    check(np.bincount(draws, minlength=len(p)) / N_DRAWS, p)
    assert len(np.unique(draws)) > 20

    top_p = 0.8
    order = np.argsort(-p, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)
    nucleus = np.zeros(len(p), dtype=bool)
    nucleus[order[:n_keep]] = True
    draws = first_tokens(default_model, lambda i: Sampling(temperature=temp, top_p=top_p, seed=i, max_new_tokens=1))
    assert nucleus[draws].all()
    q = np.where(nucleus, p, 0.0)
    check(np.bincount(draws, minlength=len(p)) / N_DRAWS, q / q.sum())


def test_same_seed_same_tokens_other_seed_differs(tiny_models) -> None:  # type: ignore[no-untyped-def]
    def run(seed: int) -> list[int]:
        eng = Engine(tiny_models["Q4_0"])
        eng.add_sequence(PROMPT, Sampling(temperature=1.0, seed=seed, max_new_tokens=24))
        out = []
        while eng.busy():
            out += list(eng.step().values())
        return out

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_repetition_penalty_hand_rule(tiny_models) -> None:  # type: ignore[no-untyped-def]
    """Greedy with penalty 3 picks argmax of the logits after llama.cpp's rule:
    positive logits of recent tokens divided by 3, negative ones multiplied."""
    path = tiny_models["F32"]
    logits = last_logits(path)
    adjusted = logits.copy()
    for t in set(PROMPT):
        adjusted[t] = adjusted[t] / 3 if adjusted[t] > 0 else adjusted[t] * 3
    eng = Engine(path, kv_k="f32", kv_v="f32")
    seq = eng.add_sequence(PROMPT, Sampling(repetition_penalty=3.0, max_new_tokens=1))
    assert eng.step()[seq] == int(np.argmax(adjusted))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_new_tokens": -5}, "max_new_tokens"),
    ],
)
def test_bad_sampling_is_rejected(tiny_models, kwargs, match: str) -> None:  # type: ignore[no-untyped-def]
    eng = Engine(tiny_models["F32"])
    with pytest.raises(ValueError, match=match):
        eng.add_sequence(PROMPT, Sampling(**kwargs))
    assert eng.memory()["sequences"] == 0
