"""Prefix sharing: sequences with the same first tokens hold the same KV blocks.

Sharing must change memory, never outputs: every test runs the same work with
sharing on and off and compares tokens and logits exactly.
"""

from __future__ import annotations

import numpy as np

from worker.engine import Engine, Sampling

BT = 16  # block_tokens in these tests


def _run(model, sharing: bool, prompts: list[list[int]], n_new: int = 6):  # type: ignore[no-untyped-def]
    eng = Engine(model, kv_k="q8_0", kv_v="f16", block_tokens=BT, prefix_sharing=sharing)
    first = eng.add_sequence(prompts[0], Sampling(max_new_tokens=n_new))
    while eng.busy():  # the first sequence computes (and publishes) the prefix
        eng.step()
    out: dict[int, list[int]] = {first: eng.tokens(first)[len(prompts[0]) :]}
    ids = [eng.add_sequence(p, Sampling(max_new_tokens=n_new)) for p in prompts[1:]]
    while eng.busy():
        eng.step()
    mem = eng.memory()
    for sid, p in zip(ids, prompts[1:], strict=True):
        out[sid] = eng.tokens(sid)[len(p) :]
    return eng, [out[first]] + [out[i] for i in ids], mem


def test_shared_prefix_same_tokens_fewer_blocks(tiny_models) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, 64, size=45).tolist()  # 2 full blocks + 13 tokens
    prompts = [prefix + rng.integers(0, 64, size=n).tolist() for n in (5, 9, 3)]
    eng_off, toks_off, mem_off = _run(tiny_models["F32"], False, prompts)
    eng_on, toks_on, mem_on = _run(tiny_models["F32"], True, prompts)
    assert toks_on == toks_off
    # Each of the two later sequences holds blocks 0 and 1 of the first instead of its own.
    assert mem_off["blocks_in_use"] - mem_on["blocks_in_use"] == 2 * 2
    assert mem_on["blocks_shared"] == 2
    assert mem_on["prefix_tokens_reused"] == 2 * 2 * BT
    assert mem_on["bytes_reserved"] == mem_on["blocks_in_use"] * mem_on["block_bytes"]
    # Freeing the first sequence keeps the shared blocks alive for the others.
    first = eng_on.sequence_ids()[0]
    before = eng_on.memory()["blocks_in_use"]
    own_blocks = -(-len(eng_on.tokens(first)) // BT) - 2
    eng_on.free(first)
    assert eng_on.memory()["blocks_in_use"] == before - own_blocks
    for sid in eng_on.sequence_ids():
        eng_on.free(sid)
    assert eng_on.memory()["blocks_in_use"] == 0
    # The index forgets freed blocks: a new sequence with the prefix computes it again.
    eng_on.add_sequence(prompts[0], Sampling(max_new_tokens=1))
    assert eng_on.memory()["prefix_tokens_reused"] == 2 * 2 * BT


def test_shared_prefix_logits_match_unshared(tiny_models) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    prefix = rng.integers(0, 64, size=40).tolist()
    tail = rng.integers(0, 64, size=7).tolist()
    logits = []
    for sharing in (False, True):
        eng = Engine(tiny_models["Q8_0"], kv_k="q4_0", kv_v="q8_head", block_tokens=BT, prefix_sharing=sharing)
        a = eng.add_sequence(prefix, Sampling(max_new_tokens=1))
        while eng.busy():
            eng.step()
        b = eng.add_sequence(prefix[:35] + tail, generate=False)
        assert eng.info(b)["n_past"] == (2 * BT if sharing else 0)
        logits.append(eng.score(b, []))
        eng.free(a)
    # Rows start where each engine's computation did; compare the common tail.
    n = logits[1].shape[0]
    np.testing.assert_array_equal(logits[1], logits[0][-n:])


def test_no_sharing_of_the_last_prompt_token_or_synthetic_kv(tiny_models) -> None:  # type: ignore[no-untyped-def]
    eng = Engine(tiny_models["F32"], block_tokens=BT)
    prompt = list(range(1, 33))  # exactly 2 blocks
    a = eng.add_sequence(prompt, Sampling(max_new_tokens=2))
    while eng.busy():
        eng.step()
    # A generating copy must compute its last prompt token for logits: only block 0 is shared.
    b = eng.add_sequence(prompt, Sampling(max_new_tokens=2))
    assert eng.info(b)["n_past"] == BT
    # fill_kv positions hold random KV that does not belong to their tokens: never shared.
    c = eng.add_sequence([], generate=False)
    eng.fill_kv(c, 2 * BT)
    d = eng.add_sequence([0] * (2 * BT) + [5], generate=False)
    assert eng.info(d)["n_past"] == 0
    for sid in (a, b, c, d):
        eng.free(sid)
