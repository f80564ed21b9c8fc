"""EngineWorker: one engine on one device serving many agent sessions at once.

Plain Python with no Ray in it; swarm/scheduler.py wraps it as a Ray actor.
A loop thread runs continuous batching: between decode steps it admits the
turns callers submitted (the engine prefills them in chunks of
`max_batch_tokens` alongside the decode rows), and each step advances every
active session by one token with one pass over the weights. Tokens wait in a
per-session buffer until the caller drains them, so one call per poll carries
every session's new tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from worker.engine import Engine
from worker.errors import SessionError
from worker.formats import KV_FORMATS
from worker.sampling import Sampling


@dataclass(frozen=True)
class WorkerSpec:
    """What the scheduler tells a worker to be (the planner's choices for it)."""

    name: str
    kind: str  # "local", "virtual" or "cluster"
    device: str  # catalog id, or "local"
    model: str  # GGUF path or "default"
    kv_k: str
    kv_v: str
    kv_budget_bytes: int  # the plan's exact KV blocks for this worker
    threads: int = 2
    block_tokens: int = 16
    max_batch_tokens: int = 256
    calibration: str = "catalog"  # "full" / "quick": measure on start (cached); "catalog": the plan's prediction
    swarm: str = ""
    agents: str = ""  # the planned agents, compacted ("researcher[0-2] critic[0]")

    def __post_init__(self) -> None:
        for name in ("kv_k", "kv_v"):
            if getattr(self, name) not in KV_FORMATS:
                raise ValueError(f"{name}: unknown KV format {getattr(self, name)!r}; use one of {KV_FORMATS}")
        if self.kv_budget_bytes <= 0:
            raise ValueError("kv_budget_bytes must be positive (the plan's KV bytes for this worker)")


@dataclass
class _Session:
    seq: int
    turn: int = -1
    new_tokens: list[int] = field(default_factory=list)  # made, not yet drained
    queued: bool = False  # a turn waits for admission
    active: bool = False  # a turn is being prefilled or generated
    done_unreported: bool = False
    reason: str = ""
    error: str = ""  # why the turn failed (reason "error"); the session's KV is freed
    first_token_s: float | None = None  # seconds from admission to this turn's first token
    admitted_at: float = 0.0
    matcher: Any = None  # this turn's grammar matcher (worker/grammar.py); None: unconstrained


class EngineWorker:
    """Hosts one engine and runs its sessions; every public method is thread-safe."""

    STATS_WINDOW_S = 5.0

    def __init__(self, spec: WorkerSpec | dict[str, Any]) -> None:
        self.spec = spec if isinstance(spec, WorkerSpec) else WorkerSpec(**spec)
        s = self.spec
        self.engine = Engine(
            None if s.model == "default" else s.model,
            kv_k=s.kv_k,
            kv_v=s.kv_v,
            kv_budget_bytes=s.kv_budget_bytes,
            threads=s.threads,
            block_tokens=s.block_tokens,
            max_batch_tokens=s.max_batch_tokens,
        )
        self.n_vocab = int(self.engine.config["n_vocab"])
        self.profile = self._calibrate()
        self._cond = threading.Condition()
        # (session, turn, tokens, sampling, fresh, (grammar, reply tokens it already covers) or None)
        self._pending: deque[tuple[str, int, list[int], Sampling, bool, tuple[str, list[int]] | None]] = deque()
        self._sessions: dict[str, _Session] = {}
        self._by_seq: dict[int, str] = {}
        self._tokens_total = 0
        self._tokens_prefilled = 0  # tokens handed to the engine to prefill (a turn's new tokens), since start
        self._constrained_tokens = 0  # tokens sampled under a grammar's mask
        self._mask_s = 0.0  # seconds spent advancing matchers and setting masks between steps
        self._grammars: Any = None  # worker.grammar.Grammars, built on the first constrained turn
        self._steps = 0
        self._window: deque[tuple[float, int]] = deque()
        self._started = time.time()
        self._error: str | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=f"engine-{s.name}", daemon=True)
        self._thread.start()

    def _calibrate(self) -> dict[str, Any]:
        s = self.spec
        if s.calibration == "catalog":
            return {"source": "predicted from catalog", "device": s.device}
        from worker.calibrate import CalibrationOptions, calibrate

        opts = (
            CalibrationOptions.quick(s.threads) if s.calibration == "quick" else CalibrationOptions(threads=s.threads)
        )
        cal = calibrate(self.engine.model_path, opts)
        return {**cal, "device": s.device}  # swarm.planner.Calibration.from_dict reads it

    # -- requests ----------------------------------------------------------------------
    def submit(self, session: str, turn: int, tokens: list[int], sampling: dict[str, Any], fresh: bool) -> None:
        """Queues one turn: `tokens` extend the session's history (fresh=True: they are all of it).

        A session that moved here from another worker arrives with fresh=True and
        its whole token history, which is prefilled before the new turn's reply.
        """
        if not tokens:
            raise SessionError(f"session {session!r} turn {turn}: no tokens to add; send at least one")
        bad = [t for t in tokens if not isinstance(t, int) or not 0 <= t < self.n_vocab]
        if bad:
            raise SessionError(
                f"session {session!r}: token ids {bad[:5]} are outside the vocabulary [0, {self.n_vocab})"
            )
        sampling = dict(sampling)
        grammar = sampling.pop("grammar", None)  # constrained decoding (worker/grammar.py); not a Sampling field
        prefix = [int(t) for t in sampling.pop("grammar_prefix", ())]  # reply tokens the grammar already covers
        if grammar is not None and not isinstance(grammar, str):
            raise SessionError(f"session {session!r}: sampling.grammar must be llguidance grammar text")
        sp = Sampling(**sampling)
        with self._cond:
            if self._error:
                raise RuntimeError(f"worker {self.spec.name} stopped: {self._error}")
            st = self._sessions.get(session)
            if st is not None and (st.active or st.queued):
                raise SessionError(f"session {session!r} already has turn {st.turn} running; wait for it to finish")
            if (st is None or st.seq < 0) and not fresh:
                raise SessionError(f"session {session!r} is not on worker {self.spec.name}; resend with its history")
            constraint = (grammar, prefix) if grammar is not None else None
            self._pending.append((session, turn, list(tokens), sp, fresh, constraint))
            if st is not None:
                st.queued = True
            self._cond.notify_all()

    def drain(self) -> dict[str, dict[str, Any]]:
        """New tokens per session since the last drain, and turns that ended (reported once)."""
        out: dict[str, dict[str, Any]] = {}
        with self._cond:
            for name, st in self._sessions.items():
                if st.new_tokens or st.done_unreported:
                    out[name] = {"turn": st.turn, "tokens": st.new_tokens, "done": st.done_unreported,
                                 "reason": st.reason if st.done_unreported else "",
                                 "error": st.error if st.done_unreported else "",
                                 "first_token_s": st.first_token_s}  # fmt: skip
                    st.new_tokens = []
                    st.done_unreported = False
            if self._error and not out:
                raise RuntimeError(f"worker {self.spec.name} stopped: {self._error}")
        return out

    def end(self, session: str) -> None:
        """Frees a session's KV (its agent finished or moved away)."""
        with self._cond:
            st = self._sessions.pop(session, None)
            self._pending = deque(p for p in self._pending if p[0] != session)
            if st is not None and st.seq >= 0:
                self._by_seq.pop(st.seq, None)
                self.engine.free(st.seq)

    def set_budget(self, kv_budget_bytes: int, agents: str | None = None) -> None:
        """A re-plan moved this worker's KV budget (same formats); KvBudgetError below the blocks in use."""
        with self._cond:
            self.engine.set_kv_budget(kv_budget_bytes)
            self.spec = dataclasses.replace(self.spec, kv_budget_bytes=kv_budget_bytes,
                                            agents=self.spec.agents if agents is None else agents)  # fmt: skip

    def sessions(self) -> list[str]:
        with self._cond:
            return sorted(self._sessions)

    def state(self) -> dict[str, Any]:
        """Profile and live state: sessions, KV bytes, tokens/s, queue depth."""
        mem = self.engine.memory()
        with self._cond:
            now = time.monotonic()
            self._trim(now)
            made = sum(n for _, n in self._window)
            span = min(self.STATS_WINDOW_S, max(now - self._window[0][0], 1e-3)) if self._window else 1.0
            active = sum(1 for st in self._sessions.values() if st.active or st.queued)
            return {
                "worker": self.spec.name,
                "pid": os.getpid(),  # the process to signal in drills
                "kind": self.spec.kind,
                "device": self.spec.device,
                "kv_k": self.spec.kv_k,
                "kv_v": self.spec.kv_v,
                "kv_format": self.kv_format,
                "sessions": sorted(self._sessions),
                "active_sessions": active,
                "queue_depth": len(self._pending)
                + sum(1 for st in self._sessions.values() if st.active and st.first_token_s is None),
                "kv_budget_bytes": self.spec.kv_budget_bytes,
                "kv_bytes_reserved": int(mem["bytes_reserved"]),
                "kv_bytes_used": int(mem["bytes_used"]),
                "tokens_generated": self._tokens_total,
                "tokens_prefilled": self._tokens_prefilled,
                "constrained_tokens": self._constrained_tokens,
                "mask_s": self._mask_s,
                "tokens_per_s": made / span if made else 0.0,
                "steps": self._steps,
                "uptime_s": time.time() - self._started,
                "profile": self.profile,
                "isa": self.engine.isa,
                "error": self._error,
            }

    @property
    def kv_format(self) -> str:
        s = self.spec
        return s.kv_k if s.kv_k == s.kv_v else f"{s.kv_k}/{s.kv_v}"

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def __repr__(self) -> str:
        mem = self.engine.memory()
        with self._cond:
            n = len(self._sessions)
        s = self.spec
        agents = f"agents {s.agents}" if s.agents else f"{n} agents"
        return (f"EngineWorker({s.name} on {s.device}, KV {self.kv_format}, {agents}, "
                f"KV {mem['bytes_used'] / 2**20:.1f}/{s.kv_budget_bytes / 2**20:.1f} MiB)")  # fmt: skip

    # -- the loop ----------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        while self._window and now - self._window[0][0] > self.STATS_WINDOW_S:
            self._window.popleft()

    def _admit(self) -> None:
        """Starts the submitted turns. One the engine refuses (bad sampling, a prompt past the context, no KV
        left) fails alone: its session reports done with reason "error" and the others go on."""
        while self._pending:
            name, turn, tokens, sp, fresh, constraint = self._pending.popleft()
            st = self._sessions.get(name)
            try:
                matcher = self._matcher(*constraint) if constraint is not None else None
                if fresh and st is not None:  # a new history: nothing of the old session is kept
                    self._drop_seq(st)
                    st = None
                if st is None:
                    seq = self.engine.add_sequence(tokens, sp)
                    st = self._sessions[name] = _Session(seq=seq)
                    self._by_seq[seq] = name
                else:
                    self.engine.append(st.seq, tokens, sp)
                self._tokens_prefilled += len(tokens)
                st.matcher = matcher
                if matcher is not None:
                    self.engine.set_token_mask(st.seq, self._grammars.mask(matcher))
                else:
                    self.engine.clear_token_mask(st.seq)
            except Exception as e:  # noqa: BLE001 - the engine's refusal of one turn is that turn's failure
                if st is not None:
                    with contextlib.suppress(Exception):
                        self._drop_seq(st)
                st = self._sessions[name] = _Session(seq=-1, turn=turn)  # reports the failure, holds no KV
                self._fail(st, e)
                continue
            st.turn, st.active, st.queued, st.reason, st.error = turn, True, False, "", ""
            st.first_token_s, st.admitted_at = None, time.monotonic()

    def _matcher(self, grammar: str, prefix: list[int]) -> Any:
        """A matcher at the grammar's start, advanced over the reply tokens a resumed turn already made."""
        if self._grammars is None:
            from worker.grammar import Grammars  # llguidance loads only on a worker that constrains a turn

            self._grammars = Grammars(self.engine.tokenizer, self.n_vocab)
        m = self._grammars.matcher(grammar)
        for tok in prefix:
            self._grammars.advance(m, tok)
        return m

    def _constrain(self, st: _Session, tok: int) -> None:
        """Feeds a constrained session's sampled token to its matcher and sets the next mask (under self._cond)."""
        t0 = time.perf_counter()
        self._constrained_tokens += 1
        try:
            self._grammars.advance(st.matcher, tok)
            if self.engine.info(st.seq)["generating"]:
                self.engine.set_token_mask(st.seq, self._grammars.mask(st.matcher))
            else:
                st.matcher = None
        except Exception as e:  # noqa: BLE001 - a grammar failure fails this turn alone
            self._fail(st, e)
        self._mask_s += time.perf_counter() - t0

    def _drop_seq(self, st: _Session) -> None:
        """Frees a session's engine sequence (its KV); the session stays to report its turn."""
        if st.seq >= 0:
            self._by_seq.pop(st.seq, None)
            self.engine.free(st.seq)
        st.seq = -1

    def _fail(self, st: _Session, e: BaseException) -> None:
        """Ends a session's turn as failed with the engine's message and frees its KV (under self._cond)."""
        with contextlib.suppress(Exception):  # a sequence the engine no longer knows holds no KV
            self._drop_seq(st)
        st.seq = -1
        st.active, st.queued, st.done_unreported = False, False, True
        st.reason, st.error = "error", f"{type(e).__name__}: {e}"[:500]

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    idle = not self._pending and not self.engine.busy()
                if idle:
                    self._report(final=True)  # the numbers as the work stopped
                with self._cond:
                    while not self._stop and not self._pending and not self.engine.busy():
                        self._cond.wait(0.5)
                    if self._stop:
                        return
                    self._admit()
                try:
                    produced = self.engine.step()
                except Exception as e:  # noqa: BLE001 - a step that raises fails the turns it ran, not the worker
                    with self._cond:
                        running = [st for st in self._sessions.values() if st.active]
                        for st in running:
                            self._fail(st, e)
                    if not running:
                        raise  # nothing to blame it on: the worker reports the error and is restarted
                    continue
                now = time.monotonic()
                with self._cond:
                    self._steps += 1
                    for seq, tok in produced.items():
                        name = self._by_seq.get(seq)
                        if name is None:
                            continue
                        st = self._sessions[name]
                        if st.first_token_s is None:
                            st.first_token_s = now - st.admitted_at
                        st.new_tokens.append(int(tok))
                        if st.matcher is not None and st.seq >= 0:
                            self._constrain(st, int(tok))
                    self._tokens_total += len(produced)
                    if produced:
                        self._window.append((now, len(produced)))
                        self._trim(now)
                    for st in self._sessions.values():
                        if st.active:
                            info = self.engine.info(st.seq)
                            if not info["generating"]:
                                st.active, st.done_unreported = False, True
                                st.reason = info["finish_reason"] or "finished"
                self._report(final=False)
        except Exception as e:  # the loop must never die silently: callers see the error
            with self._cond:
                self._error = f"{type(e).__name__}: {e}"
                self._cond.notify_all()

    def _report(self, final: bool) -> None:
        """Hook after each step, and once when the work stops (final): the Ray wrapper exports metrics here."""
