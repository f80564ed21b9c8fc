"""Grammar-constrained decoding on the worker: one llguidance matcher per constrained session.

The engine samples inside its batched step (native/engine.cpp); a constrained
sequence carries a token mask there (`Engine.set_token_mask`). Between steps the
worker feeds each constrained session's sampled token to its matcher and sets
the next mask, so unconstrained sequences in the same batch take no extra work.

A grammar arrives as llguidance's grammar text (swarm/http/grammar.py builds it
from a JSON Schema or a tool list, and validates it at the API boundary).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import llguidance
import numpy as np

from worker.tokenizer import Tokenizer

MAX_CACHED_GRAMMARS = 64  # compiled matchers kept per worker (a swarm's agents reuse a few schemas)


class _TokenizerView:
    """What llguidance.TokenizerWrapper reads from a tokenizer: token bytes, EOS, and an encoder of bytes."""

    def __init__(self, tok: Tokenizer, eos: int) -> None:
        self._tok = tok
        self.eos_token_id = eos
        self.bos_token_id = tok.bos_id
        self.tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
        # Control tokens are never grammar text; user-defined ones (Gemma's "\n" and whitespace runs) are.
        self.special_token_ids = [i for i in range(tok.vocab_size) if tok.is_hidden(i)]

    def __call__(self, text: bytes) -> list[int]:
        return self._tok.encode(text.decode("utf-8", errors="replace"), add_bos=False)


def end_token(tok: Tokenizer) -> int:
    """The token a finished grammar allows: the model's end-of-turn token (one of its stop tokens)."""
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        t = tok.token_id(name)
        if t is not None and t in tok.eot_ids:
            return t
    if tok.eos_id is not None:
        return tok.eos_id
    return min(tok.eot_ids)


class Grammars:
    """Compiles grammars for one vocabulary (cached) and steps constrained sessions."""

    def __init__(self, tok: Tokenizer, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.eos = end_token(tok)
        self.lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenizerView(tok, self.eos)),
                                            n_vocab=n_vocab)  # fmt: skip
        self._compiled: OrderedDict[str, Any] = OrderedDict()  # {grammar text: a fresh matcher to copy}

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher at the grammar's start; ValueError if the grammar does not compile."""
        m = self._compiled.get(grammar)
        if m is None:
            m = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
            if m.is_error():
                raise ValueError(f"the grammar does not compile: {m.get_error()}")
            self._compiled[grammar] = m
            if len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return m.deep_copy()

    def mask(self, m: Any) -> np.ndarray:
        """(ceil(n_vocab / 32),) uint32 words: the tokens the matcher allows next (bit t % 32 of word t // 32)."""
        words = np.frombuffer(m.compute_bitmask(), dtype=np.uint32)
        need = (self.n_vocab + 31) // 32
        if words.size < need:
            words = np.concatenate([words, np.zeros(need - words.size, np.uint32)])
        return words[:need]

    def advance(self, m: Any, token: int) -> None:
        """Feeds a sampled token; RuntimeError if the matcher refused it (it was masked, so a bug)."""
        if not m.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}: {m.get_error()}")
