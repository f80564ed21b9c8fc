"""The reference the swarm's replies are checked against: the engine run alone, greedy, on the prompt a
first turn renders (the chat template over the messages), with the model's end-of-turn tokens as stops."""

from __future__ import annotations

from worker.engine import Engine, Sampling


def greedy_alone(messages: list[dict[str, str]], max_tokens: int, kv: tuple[str, str] = ("q8_0", "q8_0")) -> list[int]:
    eng = Engine(kv_k=kv[0], kv_v=kv[1], threads=1)
    tok = eng.tokenizer
    prompt = tok.encode(tok.render_chat(messages, add_generation_prompt=True))
    seq = eng.add_sequence(prompt, Sampling(max_new_tokens=max_tokens, stop_tokens=tuple(sorted(tok.eot_ids))))
    out: list[int] = []
    while eng.info(seq)["generating"]:
        out += [t for s, t in eng.step().items() if s == seq]
    return out
