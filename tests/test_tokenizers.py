"""worker.tokenizer against llama.cpp for every vocabulary kind and pre-tokenizer.

Live: vocab-only GGUF files are written here (SmolLM2's byte-level vocab and
merges under another ``tokenizer.ggml.pre``; Gemma 3's 262k SentencePiece
vocab, also with ``add_space_prefix`` on; a tiny hand-made SentencePiece vocab)
and llama-cpp-python's ids for the same file are the expected values. Goldens:
tests/goldens/tokenizers_<name>.json hold those calls' results recorded by
tests/goldens/make_tokenizer_goldens.py (which imports no kvswarm code), checked
without llama.cpp. Load time and throughput against llama.cpp in the same run:
``.venv/bin/python tests/test_tokenizers.py`` (printed, never asserted).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from worker import _native, chat
from worker.engine import load_tokenizer
from worker.tokenizer import MetadataError, StreamDecoder, Tokenizer

GOLDENS = Path(__file__).resolve().parent / "goldens"


def _load_generator() -> ModuleType:
    """tests/goldens/make_tokenizer_goldens.py: the texts, the variants and the vocab-file writer."""
    spec = importlib.util.spec_from_file_location("make_tokenizer_goldens", GOLDENS / "make_tokenizer_goldens.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


llama_cpp = pytest.importorskip("llama_cpp")
gen = _load_generator()

# Variants checked live only (no golden file): more names of the same families,
# and a byte-level file without tokenizer.ggml.pre (llama.cpp then uses "default").
LIVE_ONLY: dict[str, dict[str, Any]] = {
    "llama3": {"pre": "llama3"},
    "deepseek-r1-qwen": {"pre": "deepseek-r1-qwen"},
    "no-pre": {"drop": ["tokenizer.ggml.pre"]},
    "no-add-bos-llama3": {"pre": "llama-bpe", "drop": ["tokenizer.ggml.add_bos_token"]},
    "no-add-bos-qwen2": {"pre": "qwen2", "drop": ["tokenizer.ggml.add_bos_token"]},
    "no-space-prefix-gemma3": {"source": "gemma3", "drop": ["tokenizer.ggml.add_space_prefix"]},
}
GOLDEN_NAMES = list(gen.VARIANTS)
# Texts that cannot survive encode -> decode: a literal "▁" is a space to a SentencePiece vocabulary.
LOSSY_FOR_SPM = {t for t in gen.TEXTS if "\u2581" in t}


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    try:
        return dict(gen.source_paths())
    except (ImportError, SystemExit) as exc:
        pytest.skip(f"real model files not installed: {exc}")


@pytest.fixture(scope="module")
def source_meta(sources: dict[str, str]) -> Callable[[str], dict[str, Any]]:
    cache: dict[str, dict[str, Any]] = {}

    def get(source: str) -> dict[str, Any]:
        if source not in cache:
            cache[source] = dict(_native.read_gguf(sources[source])["metadata"])
        return cache[source]

    return get


@pytest.fixture(scope="module")
def vocab_file(
    sources: dict[str, str], source_meta: Callable[[str], dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], str]:
    """name -> path of that variant's GGUF (the real file when nothing is overridden)."""
    root = tmp_path_factory.mktemp("vocabs")
    cache: dict[str, str] = {}

    def get(name: str) -> str:
        if name in cache:
            return cache[name]
        if name in gen.VARIANTS:
            source, pre, space_prefix = gen.VARIANTS[name]
            edits: dict[str, Any] = {"pre": pre, "add_space_prefix": space_prefix}
        else:
            spec = dict(LIVE_ONLY[name])
            source = spec.pop("source", "smollm")
            edits = spec
        if all(v is None for v in edits.values()):
            cache[name] = sources[source]
        else:
            path = str(root / f"{name}.gguf")
            gen.write_vocab_file(path, source_meta(source), **edits)
            cache[name] = path
        return cache[name]

    return get


@pytest.fixture(scope="module")
def tokenizer_of(vocab_file: Callable[[str], str]) -> Callable[[str], Tokenizer]:
    cache: dict[str, Tokenizer] = {}

    def get(name: str) -> Tokenizer:
        if name not in cache:
            cache[name] = load_tokenizer(vocab_file(name))
        return cache[name]

    return get


def mismatches(tok: Tokenizer, cases: list[dict[str, Any]], check_shown: bool) -> list[str]:
    """Human-readable differences between ``tok`` and llama.cpp's recorded calls."""
    out = []
    for case in cases:
        text = case["text"]
        ours = tok.encode(text, add_bos=False)
        if ours != case["ids"]:
            out.append(f"{text!r}: ids {ours} != llama.cpp {case['ids']}")
        if tok.encode(text) != case["ids_add_special"]:
            out.append(f"{text!r}: default BOS {tok.encode(text)[:3]} != llama.cpp {case['ids_add_special'][:3]}")
        shown = tok.decode(case["ids"], skip_special=True)
        if check_shown and shown != case["text_no_special"]:
            out.append(f"{text!r}: decode(skip_special) {shown!r} != llama.cpp {case['text_no_special']!r}")
    return out


# -- ids equal llama.cpp's, live -------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN_NAMES + list(LIVE_ONLY))
def test_live_matches_llama_cpp(
    name: str, vocab_file: Callable[[str], str], tokenizer_of: Callable[[str], Tokenizer]
) -> None:
    cases = gen.llama_cpp_cases(vocab_file(name), gen.TEXTS)
    tok = tokenizer_of(name)
    # llama.cpp's detokenize(special=False) keeps the space that add_space_prefix put
    # before the text; our decode drops it again (round trip), so compare only without it.
    assert mismatches(tok, cases, check_shown=not tok.add_space_prefix) == []


def test_live_defaults(tokenizer_of: Callable[[str], Tokenizer], vocab_file: Callable[[str], str]) -> None:
    """Without the keys, BOS and the space prefix follow llama.cpp's per-kind defaults."""
    for name, add_bos, space_prefix in [
        ("no-add-bos-llama3", True, False),
        ("no-add-bos-qwen2", False, False),
        ("no-space-prefix-gemma3", True, True),
    ]:
        tok = tokenizer_of(name)
        llm = llama_cpp.Llama(vocab_file(name), vocab_only=True, verbose=False)
        assert (tok.add_bos, tok.add_space_prefix) == (add_bos, space_prefix)
        assert bool(llm._model.add_bos_token()) == add_bos


def test_gpt2_pre_name_is_refused_like_llama_cpp(source_meta: Callable[[str], dict[str, Any]], tmp_path: Path) -> None:
    """llama.cpp spells the GPT-2 pre-tokenizer "gpt-2" and refuses "gpt2"; so do we, with a hint."""
    path = str(tmp_path / "gpt2.gguf")
    gen.write_vocab_file(path, source_meta("smollm"), pre="gpt2")
    with pytest.raises(ValueError):
        llama_cpp.Llama(path, vocab_only=True, verbose=False)
    with pytest.raises(MetadataError, match="'gpt-2'"):
        load_tokenizer(path)


# -- goldens ---------------------------------------------------------------------------


def golden(name: str) -> dict[str, Any]:
    path = GOLDENS / f"tokenizers_{name}.json"
    assert path.exists(), f"{path} missing: run tests/goldens/make_tokenizer_goldens.py"
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_goldens_are_current(name: str) -> None:
    doc = golden(name)
    assert doc["llama_cpp_python_version"] == llama_cpp.__version__
    assert [c["text"] for c in doc["cases"]] == gen.TEXTS, "texts changed: rerun make_tokenizer_goldens.py"


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_goldens_match(name: str, tokenizer_of: Callable[[str], Tokenizer]) -> None:
    tok = tokenizer_of(name)
    assert mismatches(tok, golden(name)["cases"], check_shown=not tok.add_space_prefix) == []


# -- decoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_round_trip_and_streaming(name: str, tokenizer_of: Callable[[str], Tokenizer]) -> None:
    tok = tokenizer_of(name)
    for case in golden(name)["cases"]:
        text, ids = case["text"], case["ids"]
        if tok.kind == "llama" and text in LOSSY_FOR_SPM:
            continue
        assert tok.decode(ids) == text
        dec = StreamDecoder(tok)
        pieces = [dec.push(i) for i in ids]
        assert all("\ufffd" not in p for p in pieces), text
        assert "".join(pieces) + dec.flush() == text


def test_literal_visible_space_is_a_space_to_sentencepiece(tokenizer_of: Callable[[str], Tokenizer]) -> None:
    tok = tokenizer_of("gemma3")
    assert tok.decode(tok.encode("a\u2581b", add_bos=False)) == "a b"


# -- Gemma 3 (SentencePiece) -------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma(tokenizer_of: Callable[[str], Tokenizer]) -> Tokenizer:
    return tokenizer_of("gemma3")


def test_gemma_properties(gemma: Tokenizer) -> None:
    assert (gemma.kind, gemma.vocab_size) == ("llama", 262144)
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos, gemma.add_space_prefix) == (2, 1, True, False)
    # <eos> and <end_of_turn> end a turn
    assert gemma.eot_ids == {1, 106}
    assert gemma.token_text(105) == "<start_of_turn>" and gemma.is_special(105) and gemma.is_hidden(105)
    # "\n" is a USER_DEFINED token: matched verbatim, but text, not hidden
    assert gemma.token_text(107) == "\n" and gemma.is_special(107) and not gemma.is_hidden(107)


def test_gemma_bos_and_specials(gemma: Tokenizer) -> None:
    assert gemma.encode("") == [2]
    assert gemma.encode("", add_bos=False) == []
    hello = gemma.encode("Hello", add_bos=False)
    assert gemma.encode("Hello") == [2, *hello]
    assert gemma.encode("<start_of_turn>user\n", add_bos=False) == [105, *gemma.encode("user", add_bos=False), 107]


def test_gemma_whitespace_runs_longest_first(gemma: Tokenizer) -> None:
    # USER_DEFINED tokens 107.. are 1..31 newlines and 138.. 2..31 spaces (checked here);
    # 40 newlines = the 31-newline token, then the 9-newline one.
    assert gemma.token_text(107 + 30) == "\n" * 31 and gemma.token_text(107 + 8) == "\n" * 9
    assert gemma.token_text(138) == "  " and gemma.token_text(138 + 29) == " " * 31
    assert gemma.encode("\n" * 40, add_bos=False) == [107 + 30, 107 + 8]
    # 33 spaces = 31 spaces, then 2
    assert gemma.encode(" " * 33, add_bos=False) == [138 + 29, 138]


def test_gemma_byte_fallback(gemma: Tokenizer) -> None:
    # U+0378 is unassigned: not in the vocabulary, so its UTF-8 bytes CD B8 become <0xCD> <0xB8>.
    ids = gemma.encode("\u0378", add_bos=False)
    assert [gemma.token_text(i) for i in ids] == ["<0xCD>", "<0xB8>"]
    assert gemma.token_bytes(ids[0]) == b"\xcd" and gemma.decode(ids) == "\u0378"


def test_gemma_skip_special_keeps_user_defined(gemma: Tokenizer) -> None:
    ids = gemma.encode("<start_of_turn>user\nHi<end_of_turn>\n", add_bos=True)
    assert gemma.decode(ids, skip_special=True) == "user\nHi\n"
    assert gemma.decode(ids) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    dec = gemma.stream_decoder(skip_special=True)
    assert "".join(dec.push(i) for i in ids) + dec.flush() == "user\nHi\n"


# -- a tiny SentencePiece vocabulary: merge order by hand, and llama.cpp agrees -----------

# (text, score, type). Scores are chosen so that each text below has a hand-derivable answer.
TINY_SPM: list[tuple[str, float, int]] = [
    ("<unk>", 0.0, 2),
    ("<s>", 0.0, 3),
    ("</s>", 0.0, 3),
    *((f"<0x{b:02X}>", 0.0, 6) for b in range(256)),
    ("a", -10.0, 1),
    ("b", -10.0, 1),
    ("x", -10.0, 1),
    ("y", -10.0, 1),
    ("z", -10.0, 1),
    ("\u2581", -10.0, 1),
    ("ab", -1.0, 1),  # equal scores: "aba" merges the leftmost pair first
    ("ba", -1.0, 1),
    ("aa", -3.0, 1),
    ("aab", -0.5, 1),  # only reachable as "a" + "ab": "ab" (-1) beats "aa" (-3) first
    ("xy", -2.0, 1),
    ("yz", -1.5, 1),  # the better pair wins even when it is not leftmost
    ("\u2581x", -4.0, 1),
    ("<tag>", 0.0, 4),
]
TINY_CASES: list[tuple[str, list[str]]] = [
    ("aba", ["ab", "a"]),
    ("aab", ["aab"]),
    ("xyz", ["x", "yz"]),
    ("a x", ["a", "\u2581x"]),
    ("é", ["<0xC3>", "<0xA9>"]),  # not in the vocabulary: its UTF-8 bytes
    ("b<tag>ba", ["b", "<tag>", "ba"]),
]


@pytest.fixture(scope="module")
def tiny_spm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.context_length": 64,
        "llama.embedding_length": 64,
        "llama.block_count": 1,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 2,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": 32,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [t for t, _, _ in TINY_SPM],
        "tokenizer.ggml.scores": [s for _, s, _ in TINY_SPM],
        "tokenizer.ggml.token_type": [k for _, _, k in TINY_SPM],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": False,
    }
    path = str(tmp_path_factory.mktemp("tiny_spm") / "tiny_spm.gguf")
    gen.write_vocab_file(path, meta)
    return path


@pytest.mark.parametrize(("text", "pieces"), TINY_CASES)
def test_tiny_spm_by_hand_and_llama_cpp(tiny_spm_path: str, text: str, pieces: list[str]) -> None:
    tok = load_tokenizer(tiny_spm_path)
    ids = tok.encode(text, add_bos=False)
    assert [tok.token_text(i) for i in ids] == pieces
    llm = llama_cpp.Llama(tiny_spm_path, vocab_only=True, verbose=False)
    assert ids == list(llm.tokenize(text.encode(), add_bos=False, special=True))
    assert tok.decode(ids) == text


# -- chat templates ------------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Hi!  "},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"},
]


def test_gemma_file_has_no_template_so_the_fallback_renders(
    gemma: Tokenizer, source_meta: Callable[[str], dict[str, Any]], vocab_file: Callable[[str], str]
) -> None:
    assert "tokenizer.chat_template" not in source_meta("gemma3")
    assert gemma.chat_template == chat.GEMMA_TEMPLATE
    # Gemma's format, written by hand: the system text opens the first user turn; contents trimmed.
    expected = (
        "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert gemma.render_chat(CHAT) == expected
    assert gemma.render_chat(CHAT, add_generation_prompt=False) == expected.removesuffix("<start_of_turn>model\n")
    ids = gemma.encode_chat(CHAT)
    assert ids[:2] == [2, 105] and ids.count(2) == 1  # one BOS: the template's
    llm = llama_cpp.Llama(vocab_file("gemma3"), vocab_only=True, verbose=False)
    assert ids == list(llm.tokenize(expected.encode(), add_bos=False, special=True))


def test_gemma_template_refuses_non_alternating_roles(gemma: Tokenizer) -> None:
    with pytest.raises(ValueError, match="message 1 has role assistant"):
        gemma.render_chat([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}])
    with pytest.raises(ValueError, match="alternate"):
        gemma.render_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


# Our template in Qwen3's chat format, using the jinja features Qwen3's own template
# relies on (namespace, reversed slices, str methods, `is defined`/`is false`, tojson).
QWEN3_STYLE_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- '# Tools\n<tools>' }}
    {%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(found=false, last_query=0) %}
{%- for message in messages[::-1] %}
    {%- if not ns.found and message.role == 'user' and message.content is string
        and not message.content.startswith('<tool_response>') %}
        {%- set ns.found = true %}
        {%- set ns.last_query = messages | length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query and reasoning %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""


def test_qwen3_style_template_from_the_file(source_meta: Callable[[str], dict[str, Any]], tmp_path: Path) -> None:
    path = str(tmp_path / "qwen3.gguf")
    gen.write_vocab_file(path, source_meta("smollm"), pre="qwen2", chat_template=QWEN3_STYLE_TEMPLATE)
    tok = load_tokenizer(path)
    assert tok.chat_template == QWEN3_STYLE_TEMPLATE
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "\nr2\n"},
    ]
    # By hand: reasoning is dropped before the last user query (index 3) and kept after it.
    expected = (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"
    )
    assert tok.render_chat(messages, add_generation_prompt=False) == expected
    no_think = tok.render_chat(messages[:4], enable_thinking=False)
    assert no_think.endswith("<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"name": "add", "parameters": {"a": "int", "b": "ü"}}]
    with_tools = tok.render_chat(messages[:2], tools=tools)
    assert with_tools.startswith('<|im_start|>system\nS\n\n# Tools\n<tools>\n{"name": "add", "parameters": {"a": "int"')
    assert '"b": "ü"' in with_tools  # tojson keeps non-ASCII
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    ids = tok.encode_chat(messages, add_generation_prompt=False)
    assert ids == list(llm.tokenize(expected.encode(), add_bos=False, special=True))
    assert ids[0] == tok.token_id("<|im_start|>")


# -- bad metadata ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m.pop("tokenizer.ggml.scores"), "tokenizer.ggml.scores"),
        (lambda m: m.update({"tokenizer.ggml.scores": m["tokenizer.ggml.scores"][:-1]}), "one score per token"),
        (lambda m: m.update({"tokenizer.ggml.scores": ["x"] * 3}), r"scores'\[0\] should be float/int"),
        (lambda m: m["tokenizer.ggml.tokens"].__setitem__(238, "<0xZZ>"), "not of the form <0xNN>"),
    ],
)
def test_bad_sentencepiece_metadata(source_meta: Callable[[str], dict[str, Any]], edit: Any, match: str) -> None:
    meta = dict(source_meta("gemma3"))
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"])
    edit(meta)
    with pytest.raises(MetadataError, match=match):
        Tokenizer.from_gguf_metadata(meta)


def test_missing_byte_token_is_a_clear_error(tiny_spm_path: str) -> None:
    meta = dict(_native.read_gguf(tiny_spm_path)["metadata"])
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[3 + 0xC3] = "<unused-c3>"  # drop <0xC3>
    types = list(meta["tokenizer.ggml.token_type"])
    types[3 + 0xC3] = 5
    meta.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    tok = Tokenizer.from_gguf_metadata(meta)
    with pytest.raises(ValueError, match="no byte token <0xC3>"):
        tok.encode("é")


# -- speed, printed against llama.cpp (not a test) ----------------------------------------------


def main() -> None:
    sources = gen.source_paths()
    text = (Path(__file__).resolve().parents[1] / "worker" / "data" / "calibration.txt").read_text(encoding="utf-8")
    code = (Path(__file__).resolve().parents[1] / "worker" / "tokenizer.py").read_text(encoding="utf-8")
    for name, path in sources.items():
        meta = _native.read_gguf(path)["metadata"]
        t0 = time.perf_counter()
        tok = Tokenizer.from_gguf_metadata(meta)
        t1 = time.perf_counter()
        llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        t2 = time.perf_counter()
        print(f"{name}: build {t1 - t0:.2f} s (llama.cpp vocab_only load, file read included: {t2 - t1:.2f} s)")
        for label, sample in (("prose", text), ("code", code)):
            tok.encode(sample, add_bos=False)  # warm: the first call pays for cold caches
            llm.tokenize(sample.encode(), add_bos=False, special=True)
            t0 = time.perf_counter()
            ours = tok.encode(sample, add_bos=False)
            t1 = time.perf_counter()
            ref = list(llm.tokenize(sample.encode(), add_bos=False, special=True))
            t2 = time.perf_counter()
            print(
                f"  {label}: {len(sample)} chars -> {len(ours)} tokens, same ids: {ours == ref}; "
                f"ours {len(sample) / (t1 - t0) / 1e3:.0f} kchar/s, llama.cpp {len(sample) / (t2 - t1) / 1e3:.0f} "
                f"kchar/s (ours / llama.cpp time: {(t1 - t0) / (t2 - t1):.2f})"
            )


if __name__ == "__main__":
    sys.exit(main())
