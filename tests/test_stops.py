"""The stop-string filter (worker/stops.py) against a rescan of the whole text: same output, same cut."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.stops import StopFilter

ALPHABET = "ab\n:"  # few letters, so stop strings overlap and partly match often


def _reference(text: str, stops: tuple[str, ...]) -> str:
    """The text before the earliest stop string (by start), by a rescan."""
    starts = [i for s in stops if s for i in [text.find(s)] if i >= 0]
    return text[: min(starts)] if starts else text


def _longest_open_suffix(text: str, stops: tuple[str, ...]) -> str:
    n = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[len(text) - n :]


@given(
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=3), max_size=3).map(tuple),
)
def test_filter_gives_out_exactly_the_text_before_the_first_stop(pieces: list[str], stops: tuple[str, ...]) -> None:
    out = StopFilter(stops)
    given_out = ""
    for p in pieces:
        got = out.push(p)
        given_out += got
        assert out.final == given_out
        if out.stopped:
            break
        # What is held back is exactly the longest suffix of the text that may still start a stop string.
        held = out.text[out.emitted :]
        assert held == _longest_open_suffix(out.text, stops)
    out.end("")
    given_out += out.release()
    assert given_out == out.text == _reference("".join(pieces), stops)


def test_filter_resumes_from_a_record() -> None:
    first = StopFilter(("STOP",))
    got = first.push("abcST")
    resumed = StopFilter(("STOP",), first.text, first.emitted)
    got += resumed.push("OP and more")
    assert (got, resumed.stopped, resumed.text) == ("abc", True, "abc")
