"""Tokenizer built from GGUF metadata, matching llama.cpp's tokenization.

The GGUF file stores the whole tokenizer as metadata; the caller hands us that
metadata as a plain ``dict`` mapping GGUF keys to plain Python values (no GGUF
reader types), e.g.::

    {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": ["<|endoftext|>", ..., "Ġthe", ...],
        "tokenizer.ggml.token_type": [3, ..., 1, ...],
        "tokenizer.ggml.merges": ["Ġ t", "Ġ a", ...],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{% for message in messages %}...",
    }

Only byte-level BPE vocabularies ("gpt2" model) are supported. The BPE itself
runs in the Hugging Face ``tokenizers`` library; this module supplies the
pieces llama.cpp decides from the metadata: the pre-tokenizer (from
``tokenizer.ggml.pre``), which tokens are special (matched verbatim in the text,
as llama.cpp does with ``parse_special=True``), BOS handling, byte-level
detokenization and the chat template (rendered by ``worker.chat``).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jinja2
import tokenizers
from tokenizers import AddedToken, Regex, models, pre_tokenizers

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
# whose text is stored raw (UTF-8) rather than in GPT-2 byte-level form. This is
# llama.cpp's special-token cache: CONTROL | USER_DEFINED | UNKNOWN.
_SPECIAL_TYPES = frozenset({TokenType.UNKNOWN, TokenType.CONTROL, TokenType.USER_DEFINED})

# The GPT-2 contraction/letters/numbers/punctuation/whitespace split. llama.cpp
# writes it without the trailing "|\s+"; its hand-written matcher behaves as if
# it were there (a lone tab before a letter is still split off), which is also
# what the ``tokenizers`` ByteLevel pre-tokenizer does.
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# tokenizer.ggml.pre values that llama.cpp maps to "split every digit, then the
# GPT-2 regex" (LLAMA_VOCAB_PRE_TYPE_SMOLLM and the types sharing its regex).
# smollm is checked against llama.cpp in tests; starcoder, refact and command-r
# were checked once against llama.cpp's models/ggml-vocab-*.gguf test files.
_DIGITS_THEN_GPT2 = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"}
)
# tokenizer.ggml.pre values that llama.cpp maps to the plain GPT-2 regex (gpt-2
# checked once as above). Left out: jina-v1-en/jina-v2-code/roberta-bpe, which
# llama.cpp also gives BERT-style [SEP] handling that this class does not do.
_GPT2_ONLY = frozenset(
    {
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
    }
)

# Token texts that end a turn in common chat formats; whichever of these exist
# in the vocabulary join the EOS token in ``Tokenizer.eot_ids``.
_EOT_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


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


class Tokenizer:
    """Byte-level BPE tokenizer equivalent to llama.cpp's for the same GGUF.

    State:
      * ``_tokens[i]``      token text as stored in the GGUF (byte-level form for
                            normal tokens, raw text for special ones).
      * ``_types[i]``       its ``TokenType``.
      * ``_bytes[i]``       the raw bytes the token stands for (what decoding emits).
      * ``_special``        ids matched verbatim in input text (CONTROL,
                            USER_DEFINED, UNKNOWN types).
      * ``_hf``             the ``tokenizers.Tokenizer`` doing pre-tokenization + BPE.
      * ``_chat_template``  jinja source from ``tokenizer.chat_template`` (or None);
                            compiled lazily into ``_compiled_template``.
    """

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[tuple[str, str]],
        pre: str,
        bos_id: int | None,
        eos_id: int | None,
        add_bos: bool,
        chat_template: str | None,
        extra_eot_ids: Iterable[int] = (),
    ) -> None:
        n = len(tokens)
        if len(token_types) != n:
            raise MetadataError(
                f"tokenizer.ggml.token_type has {len(token_types)} entries but tokenizer.ggml.tokens has {n}"
            )
        for name, tid in (("bos", bos_id), ("eos", eos_id)):
            if tid is not None and not 0 <= tid < n:
                raise MetadataError(f"tokenizer.ggml.{name}_token_id={tid} is outside the vocabulary (size {n})")

        self._tokens: list[str] = list(tokens)
        self._types: list[int] = list(token_types)
        self.bos_id: int | None = bos_id
        self.eos_id: int | None = eos_id
        self.add_bos: bool = add_bos
        self._chat_template: str | None = chat_template
        self._compiled_template: jinja2.Template | None = None

        self._special: frozenset[int] = frozenset(i for i, t in enumerate(self._types) if t in _SPECIAL_TYPES)
        self._bytes: list[bytes] = [
            tok.encode("utf-8") if i in self._special else tok.translate(_BYTE_DECODE).encode("latin-1")
            for i, tok in enumerate(self._tokens)
        ]
        self._text_to_id: dict[str, int] = {}
        for i, tok in enumerate(self._tokens):
            self._text_to_id.setdefault(tok, i)  # first id wins on duplicate texts

        self._hf = self._build_hf(pre, merges)

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
        if model != "gpt2":
            kind = {
                "llama": "SentencePiece ('llama')",
                "bert": "WordPiece ('bert')",
                "t5": "Unigram ('t5')",
                "rwkv": "RWKV ('rwkv')",
            }.get(model, repr(model))
            raise MetadataError(f"unsupported tokenizer.ggml.model {kind}: only 'gpt2' byte-level BPE is supported")
        tokens = _get_list(meta, "tokenizer.ggml.tokens", str)
        if not tokens:
            raise MetadataError("tokenizer.ggml.tokens is empty")
        raw_merges = _get_list(meta, "tokenizer.ggml.merges", str)
        merges: list[tuple[str, str]] = []
        for m in raw_merges:
            left, sep, right = m.partition(" ")
            if not sep or not left or not right:
                raise MetadataError(f"malformed entry in tokenizer.ggml.merges: {m!r}")
            merges.append((left, right))
        if "tokenizer.ggml.token_type" in meta:
            token_types = _get_list(meta, "tokenizer.ggml.token_type", int)
        else:  # llama.cpp treats a missing type array as all-normal
            token_types = [TokenType.NORMAL] * len(tokens)
        pre = _get(meta, "tokenizer.ggml.pre", str, default="default")
        template = _get(meta, "tokenizer.chat_template", str, default=None)
        extra_eot = [
            v
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if (v := _get(meta, key, int, default=None)) is not None
        ]
        return cls(
            tokens=tokens,
            token_types=token_types,
            merges=merges,
            pre=pre,
            bos_id=_get(meta, "tokenizer.ggml.bos_token_id", int, default=None),
            eos_id=_get(meta, "tokenizer.ggml.eos_token_id", int, default=None),
            # llama.cpp defaults add_bos to true for BPE vocabularies unless the key says otherwise
            add_bos=_get(meta, "tokenizer.ggml.add_bos_token", bool, default=True),
            chat_template=template,
            extra_eot_ids=extra_eot,
        )

    def _build_hf(self, pre: str, merges: Sequence[tuple[str, str]]) -> tokenizers.Tokenizer:
        """Assemble the ``tokenizers`` pipeline: special-token split, pre-tokenizer, BPE."""
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        gpt2_split = pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated")
        if pre in _DIGITS_THEN_GPT2:
            pre_tok = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2_split, byte_level])
        elif pre in _GPT2_ONLY:
            pre_tok = pre_tokenizers.Sequence([gpt2_split, byte_level])
        else:
            raise MetadataError(f"unsupported tokenizer.ggml.pre {pre!r} for a gpt2 BPE vocabulary")

        # Specials stay in the BPE vocabulary so ``add_special_tokens`` reuses their ids.
        vocab = dict(self._text_to_id)
        try:
            bpe = models.BPE(vocab=vocab, merges=list(merges), fuse_unk=False, byte_fallback=False)
        except Exception as exc:  # tokenizers raises its own exception types
            raise MetadataError(f"cannot build BPE from tokenizer.ggml.tokens/merges: {exc}") from exc
        hf = tokenizers.Tokenizer(bpe)
        hf.pre_tokenizer = pre_tok
        # Specials are matched longest-first, verbatim, before pre-tokenization;
        # being in the vocabulary already, they keep their GGUF ids (checked below).
        hf.add_special_tokens(
            [
                AddedToken(self._tokens[i], special=True, normalized=False)
                for i in sorted(self._special)
                if self._tokens[i] and self._text_to_id[self._tokens[i]] == i
            ]
        )
        for i in self._special:
            got = hf.token_to_id(self._tokens[i])
            if self._tokens[i] and self._text_to_id[self._tokens[i]] == i and got != i:
                raise MetadataError(f"special token {self._tokens[i]!r} got id {got}, expected {i}")
        return hf

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
        ids: list[int] = self._hf.encode(text, add_special_tokens=False).ids if text else []
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos requested but the model has no tokenizer.ggml.bos_token_id")
            ids.insert(0, self.bos_id)
        return ids

    # ----------------------------------------------------------------- decode

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (may be a partial UTF-8 sequence)."""
        return self._bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """The token's text exactly as stored in the vocabulary."""
        return self._tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """Id of the vocabulary entry whose stored text is ``text``, if any."""
        return self._text_to_id.get(text)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Concatenate token bytes and decode as UTF-8 (invalid bytes -> U+FFFD)."""
        if skip_special:
            data = b"".join(self._bytes[i] for i in ids if i not in self._special)
        else:
            data = b"".join(self._bytes[i] for i in ids)
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
        (e.g. ``tools=...``). The result contains special-token texts; encode
        it with ``encode(..., add_bos=False)`` when the template emits BOS itself.
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
    never form valid UTF-8 are emitted as U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one token; return the newly completed text (possibly "")."""
        if self._skip_special and self._tok.is_special(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return any held bytes (an incomplete sequence -> U+FFFD)."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out


# --------------------------------------------------------------------- helpers

_MISSING: Any = object()


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


def _get_list(meta: Mapping[str, Any], key: str, kind: type) -> list[Any]:
    """Fetch a required array metadata value, checking the element type."""
    if key not in meta:
        raise MetadataError(f"GGUF metadata is missing required key {key!r}")
    value = meta[key]
    if not isinstance(value, (list, tuple)):
        raise MetadataError(f"GGUF metadata {key!r} should be a list, got {type(value).__name__}")
    for i, v in enumerate(value):
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise MetadataError(f"GGUF metadata {key!r}[{i}] should be {kind.__name__}, got {type(v).__name__}")
    return list(value)
