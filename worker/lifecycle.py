"""Session lifecycle policy: which idle session gives up its KV, where it goes, and how it comes back.

Plain values and functions (no threads, no engine, no files): worker/service.py asks and applies.

A session on a worker is in one of four states (`STATES`):

    active   a turn is queued or running; its KV is in the engine's pool
    idle     its last turn ended; the KV stays in the pool for the next turn
    parked   its KV was copied to host RAM or to disk (worker/park.py), the pool blocks freed
    dropped  only its token history is kept; the next turn re-prefills it

Costs are measured per worker (worker/calibrate_park.py) as a fixed part plus a part per token
(`OpCost`). When active work needs blocks the worker evicts idle sessions of least value first
(`plan_evictions`). The value of keeping a session resident is what recreating it would cost
(the cheapest of parking to RAM and restoring, parking to disk and restoring, or re-prefilling)
per byte-second it holds the pool over its expected remaining pause (`PauseModel`). An evicted
session goes where recreating it is cheapest among the tiers it fits in: RAM, disk, or dropped.
The next turn restores it or re-prefills it, whichever the measured costs say is faster
(`choose_resume`): a disk hit can be slower than recomputing a short history.

The "drop" policy is the behaviour before parking existed, kept as the benchmark's baseline: evict
the longest-idle session first, always by dropping it.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STATES = ("active", "idle", "parked", "dropped")
WHERES = ("pool", "ram", "disk", "none")  # where a session's KV lives (pool: active or idle)
POLICIES = ("measured", "drop")
TIERS = ("ram", "disk")

# The expected pause before any pause of the agent or its group was seen: issue 18's agentic workload
# (median 0.5 s, 20% at 8 s) averages about 2 s between turns.
DEFAULT_PAUSE_S = 2.0
# Pauses remembered per agent and per group: enough for a 20% tail to show, small enough to follow a
# change of tools within a few dozen turns.
PAUSE_SAMPLES = 32
# An agent's own pauses replace its group's once it has this many (before: its own and its group's pooled).
MIN_OWN_PAUSES = 3
# The remaining pause is never taken below this (s): a session about to return is still not free to keep.
MIN_REMAINING_S = 0.01
# Decisions kept for state() and the summary.
DECISIONS_KEPT = 32

_INDEXED = re.compile(r"^(.*?)(?:-(\d+)|\[(\d+)\])$")


def group_of(session: str) -> str:
    """The agent group a session name belongs to: 'researcher-3' and 'researcher[3]' -> 'researcher'."""
    m = _INDEXED.match(session)
    return m.group(1) if m and m.group(1) else session


# -- pauses ------------------------------------------------------------------------------------


@dataclass
class PauseModel:
    """The empirical distribution of pauses between turns, per agent and per group.

    The expected remaining pause of a session idle for `elapsed` seconds is the mean of
    (p - elapsed) over the remembered pauses p longer than `elapsed` (the agent's own once it has
    MIN_OWN_PAUSES, before that its own and its group's together). A session idle longer than every
    pause seen is in the distribution's unseen tail: it is expected to stay away as long again.
    """

    samples: int = PAUSE_SAMPLES
    # {session: its recent pauses (s)}; {group: (session, pause s) of its agents' recent pauses}
    by_agent: dict[str, deque[float]] = field(default_factory=dict)
    by_group: dict[str, deque[tuple[str, float]]] = field(default_factory=dict)

    def observe(self, session: str, pause_s: float) -> None:
        if not pause_s >= 0:
            raise ValueError(f"pause of session {session!r} must be >= 0 seconds, got {pause_s}")
        self.by_agent.setdefault(session, deque(maxlen=self.samples)).append(float(pause_s))
        self.by_group.setdefault(group_of(session), deque(maxlen=self.samples)).append((session, float(pause_s)))

    def pauses(self, session: str) -> list[float]:
        """The pauses the session's expectation is drawn from: its own, pooled with its group's while few."""
        own = list(self.by_agent.get(session, ()))
        if len(own) >= MIN_OWN_PAUSES:
            return own
        return own + [p for who, p in self.by_group.get(group_of(session), ()) if who != session]

    def expected_remaining(self, session: str, elapsed_s: float = 0.0) -> float:
        """Seconds until the session's next turn is expected, given it has been idle elapsed_s.

        With no pause seen yet, DEFAULT_PAUSE_S stands in as the one sample."""
        seen = self.pauses(session) or [DEFAULT_PAUSE_S]
        longer = [p - elapsed_s for p in seen if p > elapsed_s]
        if not longer:
            return max(elapsed_s, MIN_REMAINING_S)
        return max(sum(longer) / len(longer), MIN_REMAINING_S)


# -- costs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpCost:
    """fixed_ns + per_token_ns * tokens: the measured time of one operation on one session."""

    fixed_ns: float
    per_token_ns: float

    def ns(self, tokens: int) -> float:
        return max(self.fixed_ns, 0.0) + max(self.per_token_ns, 0.0) * tokens


_OPS = ("park_ram", "restore_ram", "park_disk", "restore_disk", "reprefill")


@dataclass(frozen=True)
class ParkCosts:
    """The five measured operations of one KV format on one worker (worker/calibrate_park.py)."""

    park_ram: OpCost
    restore_ram: OpCost
    park_disk: OpCost
    restore_disk: OpCost
    reprefill: OpCost
    source: str = "explicit"  # "measured" (calibrate_park), "explicit" (a spec or a test)

    def park_ns(self, where: str, tokens: int) -> float:
        return self._op("park", where).ns(tokens)

    def restore_ns(self, where: str, tokens: int) -> float:
        return self._op("restore", where).ns(tokens)

    def reprefill_ns(self, tokens: int) -> float:
        return self.reprefill.ns(tokens)

    def _op(self, kind: str, where: str) -> OpCost:
        if where not in TIERS:
            raise ValueError(f"park tier must be one of {TIERS}, got {where!r}")
        op: OpCost = getattr(self, f"{kind}_{where}")
        return op

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {op: dataclasses.asdict(getattr(self, op)) for op in _OPS}
        out["source"] = self.source
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ParkCosts:
        """From to_dict's form, or from calibrate_park's (each op with fixed_ns and per_token_ns among others)."""
        missing = [op for op in _OPS if op not in d]
        if missing:
            raise ValueError(f"park costs lack {missing}; give each of {_OPS} as {{fixed_ns, per_token_ns}}")
        ops = {op: OpCost(float(d[op]["fixed_ns"]), float(d[op]["per_token_ns"])) for op in _OPS}
        return ParkCosts(**ops, source=str(d.get("source", "explicit")))


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


# -- decisions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleSession:
    """An idle session the worker could evict: what freeing it gives and what recreating it costs."""

    session: str
    tokens: int  # its history (the positions a restore or re-prefill recreates)
    pool_bytes: int  # pool bytes freed by evicting it
    park_bytes: int  # bytes its snapshot takes in RAM or on disk
    idle_s: float  # seconds since its last turn ended


@dataclass(frozen=True)
class Decision:
    """One lifecycle decision, in words and numbers."""

    session: str
    action: str  # "park", "drop", "restore", "reprefill", "keep"
    where: str  # "ram", "disk", "none" (drop, re-prefill), "pool" (keep)
    reason: str

    def __str__(self) -> str:
        return f"{self.session}: {self.action} ({self.where}): {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def recreate_options(s: IdleSession, costs: ParkCosts, room: Mapping[str, int]) -> list[tuple[float, str]]:
    """(ns to evict now and recreate later, tier) for each tier the snapshot fits in, and for dropping."""
    opts = [(costs.park_ns(t, s.tokens) + costs.restore_ns(t, s.tokens), t) for t in TIERS if room[t] >= s.park_bytes]
    opts.append((costs.reprefill_ns(s.tokens), "none"))
    return sorted(opts, key=lambda o: (o[0], (*TIERS, "none").index(o[1])))  # ties: RAM, then disk, then drop


def keep_value(s: IdleSession, costs: ParkCosts, pauses: PauseModel, room: Mapping[str, int]) -> float:
    """ns of recreation saved per pool byte-second of keeping it resident through its expected pause."""
    best_ns = recreate_options(s, costs, room)[0][0]
    remaining = pauses.expected_remaining(s.session, s.idle_s)
    return best_ns / (max(s.pool_bytes, 1) * remaining)


def plan_evictions(
    idle: Sequence[IdleSession],
    need_bytes: int,
    *,
    policy: str,
    costs: ParkCosts | None,
    pauses: PauseModel,
    room: Mapping[str, int],
) -> list[Decision]:
    """Idle sessions to evict, in order, until need_bytes of pool are freed (all of them if that is short).

    "measured": least keep_value first, each to its cheapest tier that still has room (room is
    {"ram": bytes free, "disk": bytes free}, spent as the list is built). "drop": longest idle
    first, every one dropped. Without costs the measured policy cannot compare and drops too.
    """
    if policy not in POLICIES:
        raise ValueError(f"lifecycle policy must be one of {POLICIES}, got {policy!r}")
    out: list[Decision] = []
    freed = 0
    left = {t: int(room.get(t, 0)) for t in TIERS}
    if policy == "drop" or costs is None:
        why = "the drop policy" if policy == "drop" else "no park costs measured yet"
        for s in sorted(idle, key=lambda s: (-s.idle_s, s.session)):
            if freed >= need_bytes:
                break
            reason = (f"{why}: longest idle ({s.idle_s:.2f} s); frees {s.pool_bytes:,} pool bytes, the next turn "
                      f"re-prefills {s.tokens} tokens")  # fmt: skip
            out.append(Decision(s.session, "drop", "none", reason))
            freed += s.pool_bytes
        return out
    ranked = sorted(idle, key=lambda s: (keep_value(s, costs, pauses, left), s.session))
    for s in ranked:
        if freed >= need_bytes:
            break
        options = recreate_options(s, costs, left)
        best_ns, where = options[0]
        remaining = pauses.expected_remaining(s.session, s.idle_s)
        others = ", ".join(f"{w} {_ms(ns)}" for ns, w in options[1:])
        reason = (f"least value to keep: next turn expected in {remaining:.2f} s, {s.pool_bytes:,} pool bytes; "
                  f"recreating {s.tokens} tokens costs {_ms(best_ns)} via {where}"
                  f"{' (vs ' + others + ')' if others else ''}")  # fmt: skip
        if where == "none":
            out.append(Decision(s.session, "drop", "none", reason))
        else:
            out.append(Decision(s.session, "park", where, reason))
            left[where] -= s.park_bytes
        freed += s.pool_bytes
    return out


def choose_resume(session: str, where: str, tokens: int, costs: ParkCosts | None) -> Decision:
    """Restore a parked session or re-prefill its `tokens`, whichever the measured costs say is faster."""
    if where not in TIERS:
        raise ValueError(f"a parked session is in one of {TIERS}, got {where!r}")
    if costs is None:
        return Decision(session, "restore", where, "no park costs measured: restoring keeps the computed KV")
    restore = costs.restore_ns(where, tokens)
    again = costs.reprefill_ns(tokens)
    if restore <= again:
        return Decision(session, "restore", where, f"restore {tokens} tokens from {where} {_ms(restore)} "
                        f"<= re-prefill {_ms(again)}")  # fmt: skip
    return Decision(session, "reprefill", "none", f"re-prefill {tokens} tokens {_ms(again)} < restore from "
                    f"{where} {_ms(restore)}")  # fmt: skip


def counts(states: Iterable[str]) -> dict[str, int]:
    """{state: sessions in it} for every state, zeros included."""
    out = dict.fromkeys(STATES, 0)
    for s in states:
        out[s] += 1
    return out
