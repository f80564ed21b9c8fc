"""Stop strings: an incremental matcher over streamed text (dependency-free; the one home of the algorithm).

Text arrives a few characters at a time (one token's piece). The output ends
before the first stop string that appears, and text that could still be the
start of one is held back until it is known not to be. A `StopScanner` keeps
an Aho-Corasick automaton's state across pieces, so each piece costs time
linear in its length plus the text held back, whatever the number and length
of the stop strings (the old rescan was O(stops x text^2) per token).

    scanner = StopScanner(("\\n\\n", "User:"))
    hit = scanner.feed(piece)   # index in the whole text where a stop string starts, or None
    safe = scanner.fed - scanner.held  # characters that are final output

A `StopFilter` is what a stream keeps around its scanner (`Engine.stream` and a
job's stream both use it): the text so far, cut at the first stop string, and
how much of it has been given out.

    out = StopFilter(("User:",))
    piece = out.push(decoded)   # newly final text ("" while it may start a stop string)
    rest = out.release()        # at the end: what was held back, now known to be text
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import lru_cache


class StopAutomaton:
    """Aho-Corasick over a set of stop strings (immutable, shared by every scanner of the same set).

    Node 0 is the root (the empty string); node n stands for the string spelled from the root to it.
    NOTE: a node's string is always a prefix of at least one stop string.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))  # empty strings never match (as before)
        self.goto: list[dict[str, int]] = [{}]  # {node: {char: child node}}
        self.depth: list[int] = [0]  # length of the node's string
        for s in self.stops:
            node = 0
            for ch in s:
                nxt = self.goto[node].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[node][ch] = nxt
                    self.goto.append({})
                    self.depth.append(self.depth[node] + 1)
                node = nxt
        terminal = [False] * len(self.goto)
        for s in self.stops:
            node = 0
            for ch in s:
                node = self.goto[node][ch]
            terminal[node] = True
        # fail[n]: the node of the longest proper suffix of n's string that is also a node.
        # match[n]: the length of the longest stop string that is a suffix of n's string (0: none).
        self.fail = [0] * len(self.goto)
        self.match = [0] * len(self.goto)
        queue = deque(self.goto[0].values())
        while queue:
            node = queue.popleft()
            f = self.fail[node]
            self.match[node] = self.depth[node] if terminal[node] else self.match[f]
            for ch, child in self.goto[node].items():
                g = f
                while g and ch not in self.goto[g]:
                    g = self.fail[g]
                target = self.goto[g].get(ch, 0)
                self.fail[child] = target if target != child else 0
                queue.append(child)

    def step(self, node: int, ch: str) -> int:
        """The node after reading ch: amortized O(1) (every failure link taken shortens the state)."""
        goto, fail = self.goto, self.fail
        while node and ch not in goto[node]:
            node = fail[node]
        return goto[node].get(ch, 0)


@lru_cache(maxsize=32)  # the live jobs' distinct sets; each at most the request limits (32 x 512 chars)
def automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """One automaton per distinct stop set (a group's jobs usually share theirs)."""
    return StopAutomaton(stops)


class StopScanner:
    """One stream's position in the automaton; feed it the text in order, exactly once."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._ac = automaton(tuple(stops))
        self._node = 0
        self.fed = 0  # characters fed so far
        self.hit: int | None = None  # start of the first stop string found (feeding stops there)

    @property
    def held(self) -> int:
        """Length of the longest suffix of the text fed that is a proper prefix of a stop string."""
        return 0 if self.hit is not None else self._ac.depth[self._node]

    def feed(self, text: str) -> int | None:
        """Reads more text; the index (in all text fed) where the earliest complete stop string starts, or None.

        Of the stop strings that end inside `text`, the one that starts first wins, as a rescan of the
        whole text would find (no earlier piece held a complete one).
        """
        if self.hit is not None or not self._ac.stops:
            self.fed += len(text)
            return self.hit
        ac, node, best = self._ac, self._node, None
        for i, ch in enumerate(text):
            node = ac.step(node, ch)
            n = ac.match[node]
            if n:
                start = self.fed + i + 1 - n
                if best is None or start < best:
                    best = start
        self._node = node
        self.fed += len(text)
        self.hit = best
        return best


class StopFilter:
    """One stream's output text: cut at the first stop string, given out only once it is final.

    NOTE: `emitted <= len(text)`, and text before `emitted` never changes (a stop string
    can only start in the held-back tail).
    """

    def __init__(self, stops: Sequence[str], text: str = "", emitted: int = 0) -> None:
        self.stops = tuple(stops)
        self.text = text  # the decoded text so far (up to the stop string once one is found)
        self.emitted = emitted  # characters of `text` already given out
        self.stopped = False  # a stop string was found; later text is not part of the output
        self._scanner: StopScanner | None = None  # fed `text` in order; made at the first push

    def push(self, piece: str) -> str:
        """Adds one piece of decoded text; returns the text that became final (all of it up to a stop string)."""
        if self._scanner is None:
            self._scanner = StopScanner(self.stops)
            self._scanner.feed(self.text)  # the text so far (a stream resumed from a record)
        self.text += piece
        hit = self._scanner.feed(piece)
        if hit is not None:
            self.text = self.text[:hit]
            self.stopped = True
            safe = hit
        else:
            safe = len(self.text) - self._scanner.held
        out = self.text[self.emitted : safe]
        self.emitted = max(self.emitted, safe)
        return out

    def end(self, tail: str = "") -> None:
        """The stream ended: `tail` (the decoder's last text) is output too, unless a stop string was found."""
        if not self.stopped:
            self.text += tail

    def release(self) -> str:
        """What is still held back, now given out (after `end`: nothing more can start a stop string)."""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out

    @property
    def final(self) -> str:
        """The text given out so far."""
        return self.text[: self.emitted]


def find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index of the earliest stop string in text, or None (one pass)."""
    return StopScanner(stop).feed(text)


def held_back(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string (text holds none)."""
    s = StopScanner(stop)
    s.feed(text)
    return s.held
