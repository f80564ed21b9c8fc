"""Tokenizer built from GGUF metadata, matching llama.cpp's tokenization.

The GGUF file stores the whole tokenizer as metadata; the caller hands us that
metadata as a plain ``dict`` mapping GGUF keys to plain Python values (no GGUF
reader types), e.g.::

    {
        "tokenizer.ggml.model": "gpt2",            # or "llama" (SentencePiece)
        "tokenizer.ggml.pre": "smollm",            # gpt2 only: the pre-tokenizer
        "tokenizer.ggml.tokens": ["<|endoftext|>", ..., "Ġthe", ...],
        "tokenizer.ggml.token_type": [3, ..., 1, ...],
        "tokenizer.ggml.merges": ["Ġ t", "Ġ a", ...],      # gpt2 only
        "tokenizer.ggml.scores": [-1000.0, ..., -5.0],     # llama only
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,          # llama only
        "tokenizer.chat_template": "{% for message in messages %}...",
    }

Two vocabulary kinds are supported, each giving the ids llama.cpp gives for the
same file (checked live against llama-cpp-python in tests/test_tokenizers.py):

* ``gpt2``: byte-level BPE (SmolLM, Qwen2/Qwen3, Llama 3, GPT-2). The BPE runs
  in the Hugging Face ``tokenizers`` library; this module supplies what
  llama.cpp decides from the metadata: the pre-tokenizer regexes named by
  ``tokenizer.ggml.pre`` (``_PRE_TOKENIZERS``; an unknown name is an error
  listing the supported ones), Llama 3's "whole word first" (``ignore_merges``)
  rule and its BOS default.
* ``llama``: SentencePiece-style BPE (Gemma 3, Llama 2). ``_SentencePieceBPE``
  is our own Python implementation of llama.cpp's algorithm: spaces become
  "▁", an optional "▁" prefix (``tokenizer.ggml.add_space_prefix``), then
  adjacent pieces are merged best-score-first (leftmost on ties) as long as the
  merged text is a vocabulary entry, and characters outside the vocabulary
  become ``<0xNN>`` byte tokens. Python rather than ``tokenizers``: the HF BPE
  model ranks merges by pair, not by merged token, so it cannot reproduce the
  ties llama.cpp breaks leftmost-first when two different pairs make the same
  token (e.g. "▁▁"+"▁" against "▁"+"▁▁"), and it would need a merge list of
  every (left, right) split of all 262k Gemma tokens. The Python version builds
  the Gemma 3 vocabulary in about 0.6 s and encodes 70-115 thousand characters
  a second, 1.3-1.7x llama.cpp's time through llama-cpp-python (measured by
  ``python tests/test_tokenizers.py``).

Common to both, as llama.cpp does with ``parse_special=True``: special tokens
(types CONTROL, USER_DEFINED, UNKNOWN) are cut out of the text verbatim before
anything else, longest token text first (``_SpecialSplitter``); each remaining
run of text is tokenized on its own. BOS is prepended when asked (default
``tokenizer.ggml.add_bos_token``, else llama.cpp's default for the vocabulary
kind). Decoding concatenates each token's raw bytes (byte-level text decoded,
"▁" turned back into spaces, ``<0xNN>`` into its byte) and ``StreamDecoder``
does the same incrementally; ``skip_special`` drops CONTROL/UNKNOWN/UNUSED
tokens as llama.cpp's ``special=False`` does, but keeps USER_DEFINED ones
(Gemma's "\\n" and "  " tokens are text). With ``add_space_prefix`` the
decoder drops the space the encoder put at the start and after each special
token, so decode(encode(text)) == text (llama-cpp-python's ``detokenize``
keeps it). Chat templates are rendered by
``worker.chat`` from ``tokenizer.chat_template``; a Gemma-style vocabulary
whose file carries no template (the Gemma 3 270M GGUF here has none) falls
back to ``worker.chat.GEMMA_TEMPLATE``; ``encode_chat`` renders and encodes
without doubling a BOS the template already wrote.

Not done (llama.cpp does them): appending EOS for ``tokenizer.ggml.add_eos_token``
vocabularies; the per-model LSTRIP/RSTRIP attributes llama.cpp gives some
special tokens by model name (Phi-3, jina); BERT/T5/RWKV vocabularies.
"""

from __future__ import annotations

import codecs
import dataclasses
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jinja2
import tokenizers
from tokenizers import Regex, models, pre_tokenizers

from worker import chat
from worker.errors import MetadataError

__all__ = ["MetadataError", "StreamDecoder", "TokenType", "Tokenizer"]


class TokenType:
    """Values of ``tokenizer.ggml.token_type`` (llama.cpp's ``llama_token_type``)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Token types whose text is matched verbatim in the input before BPE runs, and
# whose text is stored raw (UTF-8) rather than in byte-level / "▁" form. This is
# llama.cpp's special-token cache: CONTROL | USER_DEFINED | UNKNOWN.
_SPECIAL_TYPES = frozenset({TokenType.UNKNOWN, TokenType.CONTROL, TokenType.USER_DEFINED})
# Token types llama.cpp renders as nothing when detokenizing with special=False
# (our ``skip_special``). USER_DEFINED tokens are not among them: they are text.
_HIDDEN_TYPES = frozenset({TokenType.UNKNOWN, TokenType.CONTROL, TokenType.UNUSED})

# -- pre-tokenizers of byte-level BPE vocabularies ------------------------------------
# The regexes are llama.cpp's (facts of its behaviour, written out here as data).
# A list of several regexes is applied in turn, each splitting the pieces the
# previous one produced and keeping the text between matches as pieces too.

# The GPT-2 contraction/letters/numbers/punctuation/whitespace split. llama.cpp
# writes it without the trailing "|\s+"; its hand-written matcher behaves as if
# it were there (a lone tab before a letter is still split off), which is also
# what the ``tokenizers`` ByteLevel pre-tokenizer does.
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Llama 3's split: case-insensitive contractions, a letter run with at most one
# leading non-letter/non-digit (not a newline), digits in runs of up to three,
# punctuation runs that swallow trailing newlines, newline runs with leading spaces.
_LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's split (Qwen2, Qwen2.5, Qwen3): Llama 3's with every digit on its own.
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


@dataclasses.dataclass(frozen=True)
class _PreTokenizer:
    """What llama.cpp does for one family of ``tokenizer.ggml.pre`` values."""

    regexes: tuple[str, ...]  # applied in order, see above
    ignore_merges: bool = False  # a piece that is a whole vocabulary entry is taken as is
    add_bos: bool = False  # llama.cpp's add_bos when tokenizer.ggml.add_bos_token is absent


_PRE_GPT2 = _PreTokenizer((_GPT2_SPLIT,))
_PRE_DIGITS_THEN_GPT2 = _PreTokenizer((r"\p{N}", _GPT2_SPLIT))
_PRE_LLAMA3 = _PreTokenizer((_LLAMA3_SPLIT,), ignore_merges=True, add_bos=True)
_PRE_QWEN2 = _PreTokenizer((_QWEN2_SPLIT,))
# llama.cpp's fallback ("default", or no tokenizer.ggml.pre key): punctuation
# runs first, then GPT-2, then number runs cut into threes.
_PRE_DEFAULT = _PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"))

# {tokenizer.ggml.pre: its family}. smollm, gpt-2, default, qwen2,
# deepseek-r1-qwen, llama-bpe and llama3 are checked live against llama.cpp in
# tests/test_tokenizers.py; starcoder, refact and command-r were checked once
# against llama.cpp's models/ggml-vocab-*.gguf test files. Left out:
# jina-v1-en/jina-v2-code/roberta-bpe, which llama.cpp also gives BERT-style
# [SEP] handling that this class does not do.
_PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
        _PRE_DIGITS_THEN_GPT2,
    ),
    **dict.fromkeys(
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "jina-v2-es",
            "jina-v2-de",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ),
        _PRE_GPT2,
    ),
    **dict.fromkeys(("llama-bpe", "llama3"), _PRE_LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _PRE_QWEN2),
    "default": _PRE_DEFAULT,
}

# Token texts that end a turn in common chat formats; whichever of these exist
# in the vocabulary join the EOS token in ``Tokenizer.eot_ids``.
_EOT_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")

# SentencePiece's visible space: text spaces become it before merging.
_SPM_SPACE = "\u2581"


def _gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table.

    Printable Latin-1 bytes map to themselves; the remaining 68 bytes (control
    characters, space, NBSP, soft hyphen, ...) map to U+0100 onwards in byte
    order. So ' ' (0x20) is 'Ġ' (U+0120) and '\\n' (0x0A) is 'Ċ' (U+010A).
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class _ByteLevelDecodeTable(dict[int, str]):
    """``str.translate`` table: byte-level character code -> Latin-1 char of its byte.

    Translating a normal token's text with it and encoding the result as
    Latin-1 yields the token's raw bytes. A character outside the byte-level
    alphabet (malformed vocabularies) falls back to its own UTF-8 bytes.
    """

    def __missing__(self, code: int) -> str:
        return chr(code).encode("utf-8").decode("latin-1")


_BYTE_DECODE = _ByteLevelDecodeTable({ord(ch): chr(b) for b, ch in _gpt2_byte_to_unicode().items()})


def _byte_token_value(text: str) -> int | None:
    """The byte a SentencePiece byte token ``<0xNN>`` stands for; None if ``text`` is not one."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None


class _SpecialSplitter:
    """Cuts special-token texts out of a text the way llama.cpp's ``tokenizer_st_partition`` does.

    llama.cpp takes the special tokens longest text first and, for each, splits
    every remaining run of plain text at all its (non-overlapping, left to right)
    occurrences. That order matters when specials overlap: Gemma has user-defined
    tokens for runs of 1..31 newlines, spaces and tabs.

    State: ``_by_first[c] = (lengths, {text: id})`` for the specials whose text
    starts with ``c``; ``lengths`` are their distinct text lengths, longest first.
    Finding the specials present in a text costs one ``str.find`` per first
    character plus a set lookup per (occurrence, length), not one scan per special
    (Gemma has 6,400 of them).
    """

    def __init__(self, specials: Mapping[str, int]) -> None:
        groups: dict[str, dict[str, int]] = {}
        for text, tid in specials.items():
            if text:
                groups.setdefault(text[0], {})[text] = tid
        self._by_first: dict[str, tuple[tuple[int, ...], dict[str, int]]] = {
            c: (tuple(sorted({len(t) for t in texts}, reverse=True)), texts) for c, texts in groups.items()
        }

    def split(self, text: str) -> list[str | int]:
        """``text`` as a list of plain-text runs (str) and special-token ids (int), in order."""
        present: dict[str, int] = {}
        for first, (lengths, texts) in self._by_first.items():
            pos = text.find(first)
            while pos != -1:
                for n in lengths:
                    piece = text[pos : pos + n]
                    if len(piece) == n and piece in texts:
                        present[piece] = texts[piece]
                pos = text.find(first, pos + 1)
        parts: list[str | int] = [text] if text else []
        # Longest first; equal lengths by id, a fixed order (llama.cpp's std::sort leaves it open).
        for special in sorted(present, key=lambda t: (-len(t), present[t])):
            tid = present[special]
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or special not in part:
                    out.append(part)
                    continue
                for k, run in enumerate(part.split(special)):
                    if k:
                        out.append(tid)
                    if run:
                        out.append(run)
            parts = out
        return parts


class _SentencePieceBPE:
    """llama.cpp's SentencePiece-style BPE over a scored vocabulary (``tokenizer.ggml.model`` = "llama").

    ``encode(text)`` takes text whose spaces are already "▁". Symbols start as
    single characters. Repeatedly, of all adjacent symbol pairs whose joined text
    is a vocabulary entry, the one whose entry has the highest score is merged
    (leftmost on equal scores). The final symbols are their vocabulary ids;
    a symbol not in the vocabulary (only a single character can be one) becomes
    the ``<0xNN>`` tokens of its UTF-8 bytes.

    State: ``_ids[text]`` for every token (the last id wins on duplicate texts,
    as in llama.cpp's text-to-token map); ``_neg_scores[id]`` = -score (heapq pops
    the smallest); ``_byte_ids[b]`` is the id of ``<0xNN>`` (None when absent).
    """

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], ids: dict[str, int] | None = None) -> None:
        """``ids`` may pass in the text -> id map when the caller has it (no duplicate texts)."""
        self._ids: dict[str, int] = dict(zip(tokens, range(len(tokens)), strict=True)) if ids is None else ids
        self._neg_scores: list[float] = list(map(float.__neg__, map(float, scores)))
        self._byte_ids: list[int | None] = [self._ids.get(f"<0x{b:02X}>") for b in range(256)]

    def encode(self, text: str) -> list[int]:
        n = len(text)
        ids_of, neg_scores = self._ids, self._neg_scores
        # Symbol i covers text[i : i + size[i]]; size 0 means merged into its left
        # neighbour. prev[i] is the start of the live symbol before it (-1: none).
        size = [1] * n
        prev = list(range(-1, n - 1))
        # heap of candidate merges (-score, left start, right start, joined length);
        # an entry is stale once either side has changed size.
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            tid = ids_of.get(text[i : i + 2])
            if tid is not None:
                heap.append((neg_scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue
            size[left] = joined
            size[right] = 0
            after = left + joined
            if after < n:
                prev[after] = left
                tid = ids_of.get(text[left : after + size[after]])
                if tid is not None:
                    heapq.heappush(heap, (neg_scores[tid], left, after, joined + size[after]))
            before = prev[left]
            if before >= 0:
                tid = ids_of.get(text[before:after])
                if tid is not None:
                    heapq.heappush(heap, (neg_scores[tid], before, left, after - before))
        ids: list[int] = []
        i = 0
        while i < n:
            piece = text[i : i + size[i]]
            tid = ids_of.get(piece)
            if tid is not None:
                ids.append(tid)
            else:
                for b in piece.encode("utf-8"):
                    byte_id = self._byte_ids[b]
                    if byte_id is None:
                        raise ValueError(
                            f"character {piece!r} is not in the vocabulary and the vocabulary has no byte token "
                            f"<0x{b:02X}> to spell it. To fix: remove the character from the text"
                        )
                    ids.append(byte_id)
            i += size[i]
        return ids


class Tokenizer:
    """Tokenizer equivalent to llama.cpp's for the same GGUF (byte-level or SentencePiece BPE).

    State:
      * ``kind``            "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE).
      * ``_tokens[i]``      token text as stored in the GGUF (byte-level or "▁" form
                            for normal tokens, raw text for special ones).
      * ``_types[i]``       its ``TokenType``.
      * ``_bytes[i]``       the raw bytes the token stands for (what decoding emits).
      * ``_special``        ids matched verbatim in input text (CONTROL,
                            USER_DEFINED, UNKNOWN types).
      * ``_hidden``         ids that ``skip_special`` drops (CONTROL, UNKNOWN, UNUSED).
      * ``_splitter``       cuts special-token texts out of input text.
      * ``_hf``             gpt2: the ``tokenizers.Tokenizer`` doing pre-tokenization + BPE.
      * ``_spm``            llama: the SentencePiece BPE.
      * ``add_space_prefix`` llama: a "▁" goes before the text at the start and after
                            every special token (llama.cpp's add_space_prefix); decoding
                            drops it again.
      * ``_chat_template``  jinja source from ``tokenizer.chat_template`` (or the
                            Gemma fallback, or None); compiled lazily.
    """

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[tuple[str, str]] = (),
        pre: str = "default",
        bos_id: int | None,
        eos_id: int | None,
        add_bos: bool,
        chat_template: str | None,
        extra_eot_ids: Iterable[int] = (),
        kind: str = "gpt2",
        scores: Sequence[float] | None = None,
        add_space_prefix: bool = False,
    ) -> None:
        n = len(tokens)
        if len(token_types) != n:
            raise MetadataError(
                f"tokenizer.ggml.token_type has {len(token_types)} entries but tokenizer.ggml.tokens has {n}"
            )
        for name, tid in (("bos", bos_id), ("eos", eos_id)):
            if tid is not None and not 0 <= tid < n:
                raise MetadataError(f"tokenizer.ggml.{name}_token_id={tid} is outside the vocabulary (size {n})")
        if kind not in ("gpt2", "llama"):
            raise MetadataError(f"unsupported tokenizer kind {kind!r}: 'gpt2' or 'llama'")

        self.kind: str = kind
        self._tokens: list[str] = list(tokens)
        self._types: list[int] = list(token_types)
        self.bos_id: int | None = bos_id
        self.eos_id: int | None = eos_id
        self.add_bos: bool = add_bos
        self.add_space_prefix: bool = add_space_prefix and kind == "llama"
        self._compiled_template: jinja2.Template | None = None

        non_normal = [i for i, t in enumerate(self._types) if t != TokenType.NORMAL]
        self._special: frozenset[int] = frozenset(i for i in non_normal if self._types[i] in _SPECIAL_TYPES)
        self._hidden: frozenset[int] = frozenset(i for i in non_normal if self._types[i] in _HIDDEN_TYPES)
        # first id wins on duplicate texts (the reversed zip lets earlier ids overwrite later ones)
        self._text_to_id: dict[str, int] = dict(zip(reversed(self._tokens), range(n - 1, -1, -1), strict=True))
        # llama.cpp's special-token cache; on duplicate texts its map keeps the last id.
        self._splitter = _SpecialSplitter({self._tokens[i]: i for i in sorted(self._special)})

        self._hf: tokenizers.Tokenizer | None = None
        self._spm: _SentencePieceBPE | None = None
        if kind == "gpt2":
            self._bytes: list[bytes] = [
                tok.encode("utf-8") if i in self._special else tok.translate(_BYTE_DECODE).encode("latin-1")
                for i, tok in enumerate(self._tokens)
            ]
            self._hf = self._build_hf(pre, merges)
        else:
            if scores is None or len(scores) != n:
                got = "none" if scores is None else f"{len(scores)} entries"
                raise MetadataError(
                    f"a SentencePiece ('llama') vocabulary needs tokenizer.ggml.scores with one score per token "
                    f"({n}); got {got}. To fix: re-convert the model with a current llama.cpp convert script"
                )
            # normal tokens' bytes are made on demand in token_bytes (262k at load would cost ~0.5 s)
            self._bytes = []
            self._spm_bytes: dict[int, bytes] = {i: self._spm_token_bytes(i) for i in non_normal}
            unique = len(self._text_to_id) == n  # then first-wins and last-wins maps agree
            self._spm = _SentencePieceBPE(self._tokens, scores, self._text_to_id if unique else None)

        if chat_template is None and {"<start_of_turn>", "<end_of_turn>"} <= self._text_to_id.keys():
            chat_template = chat.GEMMA_TEMPLATE
        self._chat_template: str | None = chat_template

        eot = {i for i in extra_eot_ids if 0 <= i < n}
        if eos_id is not None:
            eot.add(eos_id)
        eot.update(self._text_to_id[name] for name in _EOT_NAMES if name in self._text_to_id)
        self.eot_ids: frozenset[int] = frozenset(eot)

    # ------------------------------------------------------------------ build

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata given as a plain dict (see module docstring)."""
        model = _get(meta, "tokenizer.ggml.model", str)
        if model not in ("gpt2", "llama"):
            kind = {
                "bert": "WordPiece ('bert')",
                "t5": "Unigram ('t5')",
                "rwkv": "RWKV ('rwkv')",
            }.get(model, repr(model))
            raise MetadataError(
                f"unsupported tokenizer.ggml.model {kind}: supported are 'gpt2' (byte-level BPE) and "
                "'llama' (SentencePiece BPE)"
            )
        tokens = _get_list(meta, "tokenizer.ggml.tokens", str)
        if not tokens:
            raise MetadataError("tokenizer.ggml.tokens is empty")
        merges: list[tuple[str, str]] = []
        scores: list[float] | None = None
        pre = "default"
        if model == "gpt2":
            for m in _get_list(meta, "tokenizer.ggml.merges", str):
                left, sep, right = m.partition(" ")
                if not sep or not left or not right:
                    raise MetadataError(f"malformed entry in tokenizer.ggml.merges: {m!r}")
                merges.append((left, right))
            # llama.cpp uses its "default" pre-tokenizer when the key is absent
            pre = _get(meta, "tokenizer.ggml.pre", str, default="default")
            pre_family = _pre_tokenizer(pre)
            add_bos_default = pre_family.add_bos
        else:
            if "tokenizer.ggml.scores" not in meta:
                raise MetadataError(
                    "GGUF metadata is missing 'tokenizer.ggml.scores', which a SentencePiece ('llama') vocabulary "
                    "needs. To fix: re-convert the model with a current llama.cpp convert script"
                )
            scores = list(map(float, _get_list(meta, "tokenizer.ggml.scores", (float, int))))
            add_bos_default = True  # llama.cpp: SentencePiece vocabularies add BOS unless told otherwise
        if "tokenizer.ggml.token_type" in meta:
            token_types = _get_list(meta, "tokenizer.ggml.token_type", int)
        else:  # llama.cpp treats a missing type array as all-normal
            token_types = [TokenType.NORMAL] * len(tokens)
        template = _get(meta, "tokenizer.chat_template", str, default=None)
        extra_eot = [
            v
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if (v := _get(meta, key, int, default=None)) is not None
        ]
        return cls(
            kind=model,
            tokens=tokens,
            token_types=token_types,
            merges=merges,
            scores=scores,
            pre=pre,
            bos_id=_get(meta, "tokenizer.ggml.bos_token_id", int, default=None),
            eos_id=_get(meta, "tokenizer.ggml.eos_token_id", int, default=None),
            add_bos=_get(meta, "tokenizer.ggml.add_bos_token", bool, default=add_bos_default),
            # llama.cpp: on by default for SentencePiece vocabularies, never for byte-level BPE
            add_space_prefix=_get(meta, "tokenizer.ggml.add_space_prefix", bool, default=model == "llama"),
            chat_template=template,
            extra_eot_ids=extra_eot,
        )

    def _build_hf(self, pre: str, merges: Sequence[tuple[str, str]]) -> tokenizers.Tokenizer:
        """Assemble the ``tokenizers`` pipeline for one run of plain text: pre-tokenizer, BPE."""
        family = _pre_tokenizer(pre)
        splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in family.regexes]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        vocab = dict(self._text_to_id)
        try:
            bpe = models.BPE(
                vocab=vocab,
                merges=list(merges),
                fuse_unk=False,
                byte_fallback=False,
                ignore_merges=family.ignore_merges,
            )
        except Exception as exc:  # tokenizers raises its own exception types
            raise MetadataError(f"cannot build BPE from tokenizer.ggml.tokens/merges: {exc}") from exc
        hf = tokenizers.Tokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
        return hf

    def _spm_token_bytes(self, i: int) -> bytes:
        """What a SentencePiece token decodes to: byte tokens their byte, "▁" a space."""
        text, kind = self._tokens[i], self._types[i]
        if kind == TokenType.BYTE:
            value = _byte_token_value(text)
            if value is None:
                raise MetadataError(f"token {i} has type BYTE but its text {text!r} is not of the form <0xNN>")
            return bytes([value])
        if i in self._special:
            return text.encode("utf-8")
        return text.replace(_SPM_SPACE, " ").encode("utf-8")

    # ----------------------------------------------------------------- encode

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Tokenize ``text``; special-token texts in it become their single ids.

        ``add_bos`` defaults to ``tokenizer.ggml.add_bos_token``.
        """
        if add_bos is None:
            add_bos = self.add_bos
        ids: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos requested but the model has no tokenizer.ggml.bos_token_id")
            ids.append(self.bos_id)
        after_special = True  # llama.cpp's is_prev_special: the start counts as one
        for part in self._splitter.split(text):
            if isinstance(part, int):
                ids.append(part)
                after_special = True
            elif self._hf is not None:
                ids += self._hf.encode(part, add_special_tokens=False).ids
            else:
                assert self._spm is not None
                if self.add_space_prefix and after_special:
                    part = " " + part
                ids += self._spm.encode(part.replace(" ", _SPM_SPACE))
                after_special = False
        return ids

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> list[int]:
        """``render_chat`` then ``encode``, with exactly one BOS where the model uses one.

        Templates such as Gemma's and Llama 3's write the BOS text themselves;
        BOS is added only when the model adds one and the rendered text does not
        already start with it (llama.cpp would otherwise give two).
        """
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **extra)
        bos_text = None if self.bos_id is None else self._tokens[self.bos_id]
        add_bos = self.add_bos and not (bos_text and text.startswith(bos_text))
        return self.encode(text, add_bos=add_bos)

    # ----------------------------------------------------------------- decode

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (may be a partial UTF-8 sequence)."""
        if self._spm is None:
            return self._bytes[token_id]
        special = self._spm_bytes.get(token_id)
        if special is not None:
            return special
        return self._tokens[token_id].replace(_SPM_SPACE, " ").encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """The token's text exactly as stored in the vocabulary."""
        return self._tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """Id of the vocabulary entry whose stored text is ``text``, if any."""
        return self._text_to_id.get(text)

    def is_special(self, token_id: int) -> bool:
        """Whether the token's text is matched verbatim in input text (CONTROL, USER_DEFINED, UNKNOWN)."""
        return token_id in self._special

    def is_hidden(self, token_id: int) -> bool:
        """Whether ``skip_special`` drops the token (CONTROL, UNKNOWN, UNUSED; not USER_DEFINED)."""
        return token_id in self._hidden

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Concatenate token bytes and decode as UTF-8 (invalid bytes -> U+FFFD)."""
        dec = StreamDecoder(self, skip_special=skip_special)
        data = b"".join(dec.push_bytes(i) for i in ids)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)

    # ------------------------------------------------------------------- chat

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render ``messages`` with the model's ``tokenizer.chat_template``.

        Follows Hugging Face's ``apply_chat_template`` environment: sandboxed,
        ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``strftime_now``,
        ``bos_token``/``eos_token``. ``extra`` becomes more template variables
        (e.g. ``tools=...``, ``enable_thinking=False``). The result contains
        special-token texts; ``encode_chat`` tokenizes it without doubling BOS.
        """
        if self._chat_template is None:
            raise ValueError("model has no tokenizer.chat_template; cannot render a chat")
        if self._compiled_template is None:
            try:
                self._compiled_template = chat.compile_template(self._chat_template)
            except jinja2.TemplateSyntaxError as exc:
                raise MetadataError(f"tokenizer.chat_template is not valid jinja: {exc}") from exc
        return chat.render(
            self._compiled_template,
            messages,
            bos_token="" if self.bos_id is None else self._tokens[self.bos_id],
            eos_token="" if self.eos_id is None else self._tokens[self.eos_id],
            add_generation_prompt=add_generation_prompt,
            extra=extra,
        )


class StreamDecoder:
    """Incremental detokenizer for streaming generation.

    Holds the bytes of a trailing incomplete UTF-8 sequence between calls, so a
    character split over several tokens is emitted once, whole. Bytes that can
    never form valid UTF-8 are emitted as U+FFFD. For a SentencePiece vocabulary
    with ``add_space_prefix`` it drops the space the encoder put before the text
    at the start and after each special token.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._after_special = True  # at the start, or right after a special token

    def push_bytes(self, token_id: int) -> bytes:
        """The bytes one token adds to the output (before UTF-8 decoding)."""
        tok = self._tok
        if tok.is_special(token_id):
            self._after_special = True
            return b"" if self._skip_special and tok.is_hidden(token_id) else tok.token_bytes(token_id)
        if self._skip_special and tok.is_hidden(token_id):
            return b""
        data = tok.token_bytes(token_id)
        if self._after_special and tok.add_space_prefix and data.startswith(b" "):
            data = data[1:]
        self._after_special = False
        return data

    def push(self, token_id: int) -> str:
        """Feed one token; return the newly completed text (possibly "")."""
        return self._dec.decode(self.push_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return any held bytes (an incomplete sequence -> U+FFFD)."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        self._after_special = True
        return out


# --------------------------------------------------------------------- helpers

_MISSING: Any = object()


def _pre_tokenizer(pre: str) -> _PreTokenizer:
    """The pre-tokenizer family llama.cpp uses for a ``tokenizer.ggml.pre`` value."""
    family = _PRE_TOKENIZERS.get(pre)
    if family is None:
        hint = " (llama.cpp spells GPT-2's 'gpt-2' and rejects 'gpt2')" if pre == "gpt2" else ""
        raise MetadataError(
            f"unsupported tokenizer.ggml.pre {pre!r} for a gpt2 BPE vocabulary{hint}. Supported: "
            f"{', '.join(sorted(_PRE_TOKENIZERS))}. To fix: set tokenizer.ggml.pre to the one llama.cpp's "
            "convert script writes for this model"
        )
    return family


def _get(meta: Mapping[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    """Fetch a scalar metadata value, checking its type."""
    if key not in meta:
        if default is _MISSING:
            raise MetadataError(f"GGUF metadata is missing required key {key!r}")
        return default
    value = meta[key]
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is bool and isinstance(value, int) and value in (0, 1):
        ok, value = True, bool(value)
    if not ok:
        raise MetadataError(f"GGUF metadata {key!r} should be {kind.__name__}, got {type(value).__name__}")
    return value


def _get_list(meta: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> list[Any]:
    """Fetch a required array metadata value, checking the element type."""
    if key not in meta:
        raise MetadataError(f"GGUF metadata is missing required key {key!r}")
    value = meta[key]
    if not isinstance(value, (list, tuple)):
        raise MetadataError(f"GGUF metadata {key!r} should be a list, got {type(value).__name__}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not set(map(type, value)) <= set(kinds):  # exact types: bool (an int subclass) is refused
        name = "/".join(k.__name__ for k in kinds)
        i, v = next((i, v) for i, v in enumerate(value) if type(v) not in kinds)
        raise MetadataError(f"GGUF metadata {key!r}[{i}] should be {name}, got {type(v).__name__}")
    return list(value)
