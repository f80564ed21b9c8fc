"""EngineWorker: one engine on one device serving many agent sessions at once.

Plain Python with no Ray in it; swarm/scheduler.py wraps it as a Ray actor.
A loop thread runs continuous batching: between decode steps it admits the
turns callers submitted (the engine prefills them in chunks of
`max_batch_tokens` alongside the decode rows), and each step advances every
active session by one token with one pass over the weights. Tokens wait in a
per-session buffer until the caller drains them, so one call per poll carries
every session's new tokens.

Sessions are active, idle, parked or dropped (worker/lifecycle.py): an idle session keeps its KV
in the pool after a turn; when active work needs blocks the worker parks idle sessions of least
value to host RAM or disk (worker/park.py) or drops them to their token history, and the next
turn restores or re-prefills them, whichever the measured costs say is faster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker import lifecycle
from worker.calibrate import _file_digest, cache_dir
from worker.devices import backend_kwargs, check_backend
from worker.engine import Engine
from worker.errors import SessionError
from worker.formats import KV_FORMATS, pair_name
from worker.host import available_memory
from worker.lifecycle import Decision, IdleSession, ParkCosts, PauseModel
from worker.park import ParkedKV, ParkFileError, ParkStore
from worker.sampling import Sampling

# Share of the host's available memory (at start) the RAM park tier may take when the spec leaves it 0:
# the pool, the weights and the other workers of the host need the rest.
PARK_RAM_SHARE = 0.125
DEFAULT_PARK_DISK_BYTES = 2 * 2**30
# Bytes of a park file beyond its snapshot and token ids: the prefix and the JSON header, rounded up.
PARK_HEADER_BYTES = 512


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
    # Session lifecycle (worker/lifecycle.py): "measured" parks idle sessions by measured cost; "drop"
    # frees idle KV when space is needed and re-prefills it next turn (the benchmark's baseline).
    lifecycle: str = "measured"
    park_dir: str = ""  # park files; "": $KVSWARM_CACHE/park/<swarm>/<worker>
    park_disk_bytes: int = DEFAULT_PARK_DISK_BYTES  # disk tier budget; the oldest parked files go first
    park_ram_bytes: int = 0  # RAM tier budget; 0: PARK_RAM_SHARE of the host's available memory at start
    park_costs: dict[str, Any] | None = None  # ParkCosts.to_dict() to use instead of measuring (tests, benches)
    backend: str = "cpu"  # the engine's backend: "cpu" or "vulkan" (worker.devices.BACKENDS)
    device_index: int = 0  # backend vulkan: the Vulkan device (index in `swarm devices`); `device` stays the catalog id

    def __post_init__(self) -> None:
        for name in ("kv_k", "kv_v"):
            if getattr(self, name) not in KV_FORMATS:
                raise ValueError(f"{name}: unknown KV format {getattr(self, name)!r}; use one of {KV_FORMATS}")
        if self.kv_budget_bytes <= 0:
            raise ValueError("kv_budget_bytes must be positive (the plan's KV bytes for this worker)")
        if self.lifecycle not in lifecycle.POLICIES:
            raise ValueError(f"lifecycle: unknown policy {self.lifecycle!r}; use one of {lifecycle.POLICIES}")
        if self.park_disk_bytes < 0 or self.park_ram_bytes < 0:
            raise ValueError("park_disk_bytes and park_ram_bytes must be >= 0 (0 RAM bytes: a share of the host's)")
        if self.park_costs is not None:
            ParkCosts.from_dict(self.park_costs)  # raises naming what is missing

    def park_path(self) -> Path:
        """The directory of this worker's park files."""
        if self.park_dir:
            return Path(self.park_dir)
        return cache_dir().parent / "park" / (self.swarm or "_") / self.name


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
    history: list[int] | None = None  # dropped (seq -1, not parked): the tokens the next turn re-prefills
    idle_since: float | None = None  # monotonic time its last turn ended (its pause is learned at the next)


class EngineWorker:
    """Hosts one engine and runs its sessions; every public method is thread-safe."""

    STATS_WINDOW_S = 5.0

    def __init__(self, spec: WorkerSpec | dict[str, Any]) -> None:
        self.spec = spec if isinstance(spec, WorkerSpec) else WorkerSpec(**spec)
        s = self.spec
        gpu = check_backend(s.backend, s.device_index)  # DeviceError before the model loads
        self.device_label = gpu.label if gpu is not None else s.device  # what the Repr names: the GPU, or the device
        self.engine = Engine(
            None if s.model == "default" else s.model,
            kv_k=s.kv_k,
            kv_v=s.kv_v,
            kv_budget_bytes=s.kv_budget_bytes,
            threads=s.threads,
            block_tokens=s.block_tokens,
            max_batch_tokens=s.max_batch_tokens,
            **backend_kwargs(s.backend, s.device_index),
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
        self._init_lifecycle()
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
        opts = dataclasses.replace(opts, backend=s.backend, device=s.device_index)
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
            if not fresh and not self._known_history(session, st):
                raise SessionError(f"session {session!r} is not on worker {self.spec.name}; resend with its history")
            if st is not None and st.idle_since is not None:  # the pause between its turns (worker/lifecycle.py)
                self._pauses.observe(session, max(time.monotonic() - st.idle_since, 0.0))
                st.idle_since = None
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
            self._park.drop(session)

    def set_budget(self, kv_budget_bytes: int, agents: str | None = None) -> None:
        """A re-plan moved this worker's KV budget (same formats). Idle sessions are evicted (parked or dropped)
        to fit a smaller one; KvBudgetError if the active sessions' blocks alone exceed it."""
        with self._cond:
            mem = self.engine.memory()
            if mem["budget_bytes"] and mem["bytes_reserved"] > kv_budget_bytes:
                self._relieve(mem["budget_bytes"] - kv_budget_bytes, mem)  # frees reserved - new budget bytes
            self.engine.set_kv_budget(kv_budget_bytes)
            self.spec = dataclasses.replace(self.spec, kv_budget_bytes=kv_budget_bytes,
                                            agents=self.spec.agents if agents is None else agents)  # fmt: skip

    def sessions(self) -> list[str]:
        with self._cond:
            return sorted(self._sessions)

    def state(self) -> dict[str, Any]:
        """Profile and live state: sessions (each one's lifecycle state), the lifecycle counters, KV bytes,
        tokens/s, queue depth."""
        mem = self.engine.memory()
        with self._cond:
            now = time.monotonic()
            self._trim(now)
            made = sum(n for _, n in self._window)
            span = min(self.STATS_WINDOW_S, max(now - self._window[0][0], 1e-3)) if self._window else 1.0
            active = sum(1 for st in self._sessions.values() if st.active or st.queued)
            sessions = {n: self._session_state(n, self._sessions[n], mem) for n in sorted(self._sessions)}
            return {
                "worker": self.spec.name,
                "pid": os.getpid(),  # the process to signal in drills
                "kind": self.spec.kind,
                "device": self.spec.device,
                "kv_k": self.spec.kv_k,
                "kv_v": self.spec.kv_v,
                "kv_format": self.kv_format,
                "sessions": sessions,  # {session: {state, where, kv_bytes, tokens}} (worker/lifecycle.py)
                "lifecycle": self._lifecycle_state(sessions),
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
            states = lifecycle.counts(self._session_state(k, st, mem)["state"] for k, st in self._sessions.items())
        s = self.spec
        agents = f"agents {s.agents}" if s.agents else f"{n} agents"
        agents += " (" + ", ".join(f"{k} {v}" for k, v in states.items()) + ")"
        return (f"EngineWorker({s.name} on {self.device_label}, KV {self.kv_format}, {agents}, "
                f"KV {mem['bytes_used'] / 2**20:.1f}/{s.kv_budget_bytes / 2**20:.1f} MiB)")  # fmt: skip

    # -- the loop ----------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        while self._window and now - self._window[0][0] > self.STATS_WINDOW_S:
            self._window.popleft()

    def _admit(self) -> None:
        """Starts the submitted turns. One the engine refuses (bad sampling, a prompt past the context, no KV
        left) fails alone: its session reports done with reason "error" and the others go on.

        A turn whose history does not fit the free KV, even after idle sessions are evicted, waits (with the
        turns behind it) while other turns run: they end, and their sessions become idle and evictable."""
        while self._pending:
            name, turn, tokens, sp, fresh, constraint = self._pending[0]
            st = self._sessions.get(name)
            if not self._room_for_turn(name, st, tokens, fresh):
                return
            self._pending.popleft()
            try:
                matcher = self._matcher(*constraint) if constraint is not None else None
                st = self._place_turn(name, st, tokens, sp, fresh)  # resident, restored or re-prefilled
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
                    mem = self.engine.memory()
                    if mem["budget_bytes"]:  # active work needs blocks: idle sessions make room first
                        self._relieve(self._step_need_bytes(mem), mem)
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
                                st.idle_since = now
                                st.reason = info["finish_reason"] or "finished"
                self._report(final=False)
        except Exception as e:  # the loop must never die silently: callers see the error
            with self._cond:
                self._error = f"{type(e).__name__}: {e}"
                self._cond.notify_all()

    def _report(self, final: bool) -> None:
        """Hook after each step, and once when the work stops (final): the Ray wrapper exports metrics here."""

    # -- session lifecycle (worker/lifecycle.py, worker/park.py) -----------------------
    def _init_lifecycle(self) -> None:
        s = self.spec
        self._digest = _file_digest(self.engine.model_path)  # the identity worker/calibrate.py keys on
        ram = s.park_ram_bytes or int(PARK_RAM_SHARE * available_memory())
        self._park = ParkStore(s.park_path(), self._digest, ram_bytes=ram, disk_bytes=s.park_disk_bytes,
                               log=self._log, on_evict=self._park_evicted)  # fmt: skip
        self._pauses = PauseModel()
        self._park_costs: ParkCosts | None = ParkCosts.from_dict(s.park_costs) if s.park_costs else None
        self._park_costs_tried = False
        self._decisions: deque[dict[str, Any]] = deque(maxlen=lifecycle.DECISIONS_KEPT)
        # counters since start: restores, parks, drops, ships, tokens re-prefilled and saved
        self._lc: dict[str, int] = dict.fromkeys(
            ("restores_ram", "restores_disk", "restore_failures", "parks_ram", "parks_disk", "drops", "ships_in",
             "ships_out", "reprefilled_tokens", "reprefill_tokens_saved"), 0)  # fmt: skip
        for name in self._park.index():  # a restarted worker's sessions parked on disk
            self._sessions[name] = _Session(seq=-1)

    def _log(self, message: str) -> None:
        print(f"kvswarm: worker {self.spec.name}: {message}", file=sys.stderr)

    def _park_evicted(self, session: str, tokens: tuple[int, ...]) -> None:
        """The disk budget removed a parked snapshot: the session is dropped to its token history."""
        st = self._sessions.get(session)
        if st is not None and st.seq < 0:
            st.history = list(tokens)
            self._lc["drops"] += 1

    def _costs(self) -> ParkCosts | None:
        """The park costs: the spec's, or measured on first need (cached with the calibration data)."""
        if self._park_costs is None and not self._park_costs_tried and self.spec.lifecycle == "measured":
            self._park_costs_tried = True
            try:
                from worker.calibrate_park import ParkCalibrationOptions, calibrate_park

                opts = ParkCalibrationOptions(pairs=((self.spec.kv_k, self.spec.kv_v),), threads=self.spec.threads)
                cal = calibrate_park(self.engine.model_path, opts, work_dir=self._park.directory)
                self._park_costs = ParkCosts.from_dict({**cal["formats"][self.kv_format], "source": "measured"})
            except Exception as e:  # noqa: BLE001 - without costs the policy drops (the old behaviour)
                self._log(f"park calibration failed ({type(e).__name__}: {e}); idle sessions are dropped instead")
        return self._park_costs

    def _decide(self, d: Decision) -> None:
        self._decisions.append({**d.to_dict(), "at": time.time()})

    def _pool_bytes(self, n_past: int, mem: dict[str, int]) -> int:
        """Pool bytes a sequence of n_past computed positions holds (its blocks; sliding ones up to the window)."""
        bt = mem["block_tokens"]
        blocks = math.ceil(n_past / bt)
        out = blocks * mem["block_bytes"]
        if mem["sliding_window"]:
            out += min(blocks, math.ceil(mem["sliding_window"] / bt) + 1) * mem["swa_block_bytes"]
        return out

    def _known_history(self, session: str, st: _Session | None) -> bool:
        """A session the worker can continue without its history: resident, parked or dropped with its tokens."""
        if st is None:
            return False
        return st.seq >= 0 or st.history is not None or self._park.tokens(session, trusted=True) is not None

    def _place_turn(self, name: str, st: _Session | None, tokens: list[int], sp: Sampling, fresh: bool) -> _Session:
        """Puts a turn's tokens on an engine sequence: appended to the resident KV, after a restore, or on a
        re-prefilled history (under self._cond). fresh: `tokens` are the whole history."""
        if st is not None and st.seq >= 0:
            if not fresh:
                self.engine.append(st.seq, tokens, sp)
                self._tokens_prefilled += len(tokens)
                return st
            have = self.engine.tokens(st.seq)
            if _extends(tokens, have):  # a resent history this session already holds: only the new tokens
                self.engine.append(st.seq, tokens[len(have) :], sp)
                self._tokens_prefilled += len(tokens) - len(have)
                self._lc["reprefill_tokens_saved"] += len(have)
                return st
            self._drop_seq(st)
        base: Sequence[int] | None = None
        if st is not None:
            base = self._park.tokens(name, trusted=not fresh)
            if base is None:
                base = st.history
        if fresh:
            full = tokens
        elif base is None:
            raise SessionError(f"session {name!r} is not on worker {self.spec.name}; resend with its history")
        else:
            full = [*base, *tokens]
        seq = self._restore(name, full, sp)
        if seq is None:
            self._park.drop(name)
            seq = self.engine.add_sequence(full, sp)
            self._tokens_prefilled += len(full)
            if base is not None and _extends(full, base):
                self._lc["reprefilled_tokens"] += len(base)
        if st is None:
            st = self._sessions[name] = _Session(seq=seq)
        st.seq, st.history = seq, None
        self._by_seq[seq] = name
        return st

    def _restore(self, name: str, full: list[int], sp: Sampling) -> int | None:
        """A sequence holding the parked KV of `name` with the rest of `full` queued, or None to re-prefill."""
        where = self._park.where(name)
        parked_tokens = self._park.tokens(name)
        if where is None or parked_tokens is None:
            return None
        if not _extends(full, parked_tokens):
            self._log(f"session {name!r}: its parked tokens are not a prefix of this turn's; re-prefilling")
            return None
        d = lifecycle.choose_resume(name, where, len(parked_tokens), self._costs())
        self._decide(d)
        if d.action != "restore":
            return None
        parked = self._park.take(name)
        if parked is None or not _extends(full, parked.tokens):  # refused by the store (logged), or other tokens
            self._lc["restore_failures"] += 1
            return None
        mem = self.engine.memory()
        self._relieve(self._pool_bytes(len(parked.tokens), mem), mem)
        try:
            seq = self.engine.import_kv(parked.payload, sp, generate=False)
        except Exception as e:  # noqa: BLE001 - any refusal (budget, format, corrupt blob) falls back to re-prefill
            self._log(f"session {name!r}: restore from {where} refused ({type(e).__name__}: {e}); re-prefilling")
            self._lc["restore_failures"] += 1
            return None
        try:
            self.engine.append(seq, full[len(parked.tokens) :], sp)
        except Exception:
            self.engine.free(seq)
            raise
        self._lc[f"restores_{where}"] += 1
        self._lc["reprefill_tokens_saved"] += len(parked.tokens)
        self._tokens_prefilled += len(full) - len(parked.tokens)
        return seq

    def _room_for_turn(self, name: str, st: _Session | None, tokens: list[int], fresh: bool) -> bool:
        """Whether the pool holds the turn's whole history (evicting idle sessions to make room), or nothing
        else runs that could make room later (then the turn goes ahead, and fails alone if it cannot fit)."""
        mem = self.engine.memory()
        if not mem["budget_bytes"]:
            return True
        running = any(s.active for s in self._sessions.values())
        held = 0
        if st is not None and st.seq >= 0:
            info = self.engine.info(st.seq)
            held = int(info["n_past"])
            after = len(tokens) if fresh else int(info["n_tokens"]) + len(tokens)
        elif fresh or st is None:
            after = len(tokens)
        else:
            base = self._park.tokens(name) or st.history or ()
            after = len(base) + len(tokens)
        need = max(self._pool_bytes(after + 1, mem) - self._pool_bytes(held, mem), 0)  # + the first new token
        if need > mem["budget_bytes"] or after > int(self.engine.config["n_ctx_train"]):
            return True  # it can never fit: it goes ahead and fails alone, evicting nothing
        # what the running turns admitted before still have to take for their own histories
        promised = 0
        for other in self._sessions.values():
            if other.active and other.seq >= 0:
                info = self.engine.info(other.seq)
                promised += max(
                    self._pool_bytes(int(info["n_tokens"]) + 1, mem) - self._pool_bytes(int(info["n_past"]), mem), 0
                )
        # with nothing running, nothing frees room by itself: the resident sessions queued behind this turn are
        # evicted too (their turns restore them)
        self._relieve(need + promised, mem, keep=name, queued_too=not running)
        if not running:
            return True
        mem = self.engine.memory()
        return mem["budget_bytes"] - mem["bytes_reserved"] - promised >= need

    def _step_need_bytes(self, mem: dict[str, int]) -> int:
        """Pool bytes the next step's new blocks take (the engine's plan: decode rows, then prefill chunks)."""
        bt = mem["block_tokens"]
        per_block = mem["block_bytes"] + mem["swa_block_bytes"]
        decode: list[tuple[int, int, int]] = []  # (seq, n_past, pending tokens)
        prefill: list[tuple[int, int, int]] = []
        for st in self._sessions.values():
            if st.seq < 0 or not st.active:
                continue
            info = self.engine.info(st.seq)
            pending = info["n_tokens"] - info["n_past"]
            if pending <= 0 or info["finish_reason"]:
                continue
            (decode if info["generating"] and pending == 1 else prefill).append((st.seq, info["n_past"], pending))
        left = self.spec.max_batch_tokens
        blocks = 0
        for _, n_past, _ in decode:
            blocks += math.ceil((n_past + 1) / bt) - math.ceil(n_past / bt)
            left -= 1
        for _, n_past, pending in sorted(prefill):
            take = min(pending, left)
            if take <= 0:
                break
            blocks += math.ceil((n_past + take) / bt) - math.ceil(n_past / bt)
            left -= take
        return blocks * per_block

    def _relieve(self, need_bytes: int, mem: dict[str, int], keep: str = "", queued_too: bool = False) -> None:
        """Evicts idle sessions (the policy's order and tiers) until need_bytes of the pool are free; never `keep`,
        and sessions whose turn is queued only with queued_too."""
        budget = mem["budget_bytes"]
        free = budget - mem["bytes_reserved"]
        if budget == 0 or need_bytes <= free:
            return
        now = time.monotonic()
        idle = []
        for name, st in self._sessions.items():
            if st.seq < 0 or st.active or (st.queued and not queued_too) or name == keep:
                continue
            info = self.engine.info(st.seq)
            idle.append(IdleSession(name, info["n_tokens"], self._pool_bytes(info["n_past"], mem),
                                    self.engine.kv_export_bytes(st.seq) + 4 * info["n_tokens"] + PARK_HEADER_BYTES,
                                    now - (st.idle_since if st.idle_since is not None else now)))  # fmt: skip
        if not idle:
            return
        costs = self._costs() if self.spec.lifecycle == "measured" else None
        for d in lifecycle.plan_evictions(idle, need_bytes - free, policy=self.spec.lifecycle, costs=costs,
                                          pauses=self._pauses, room=self._park.room()):  # fmt: skip
            self._evict(d)

    def _evict(self, d: Decision) -> str:
        """Applies an eviction: parks the session's KV in d.where (or drops it); returns where it went."""
        st = self._sessions[d.session]
        tokens = self.engine.tokens(st.seq)
        where: str | None = None
        if d.action == "park":
            try:
                payload = self.engine.export_kv(st.seq)
                parked = ParkedKV(d.session, tuple(tokens), self.spec.kv_k, self.spec.kv_v, self._digest, payload,
                                  time.time())  # fmt: skip
                where = self._park.put(parked, d.where)
            except Exception as e:  # noqa: BLE001 - a failed park drops the session instead
                self._log(f"session {d.session!r}: parking to {d.where} failed ({type(e).__name__}: {e}); dropping")
        if where is None and d.action == "park":
            d = dataclasses.replace(d, action="drop", where="none", reason=f"{d.where} refused it; {d.reason}")
        self._decide(d)
        self._drop_seq(st)
        if where is None:
            st.history = tokens
            self._lc["drops"] += 1
            return "none"
        self._lc[f"parks_{where}"] += 1
        return where

    def park(self, session: str, where: str = "ram") -> str:
        """Parks an idle session's KV now ("ram", "disk", or "none" to drop it); returns where it went."""
        if where not in (*lifecycle.TIERS, "none"):
            raise ValueError(f"park: where must be 'ram', 'disk' or 'none', got {where!r}")
        with self._cond:
            st = self._sessions.get(session)
            if st is None or st.seq < 0:
                raise SessionError(f"session {session!r} holds no KV in the pool of worker {self.spec.name}")
            if st.active or st.queued:
                raise SessionError(f"session {session!r} has turn {st.turn} running; park it when it is idle")
            action = "drop" if where == "none" else "park"
            return self._evict(Decision(session, action, where, "asked to (EngineWorker.park)"))

    def park_costs(self) -> dict[str, Any] | None:
        """The park costs the policy uses (ParkCosts.to_dict()), measuring them now if not yet (a warm-up)."""
        with self._cond:
            costs = self._costs()
            return costs.to_dict() if costs is not None else None

    def export_session(self, session: str) -> bytes | None:
        """A snapshot of an idle or parked session (ParkedKV bytes) to ship; None if dropped, running or unknown."""
        with self._cond:
            st = self._sessions.get(session)
            if st is None or st.active or st.queued:
                return None
            parked: ParkedKV | None
            if st.seq >= 0:
                parked = ParkedKV(session, tuple(self.engine.tokens(st.seq)), self.spec.kv_k, self.spec.kv_v,
                                  self._digest, self.engine.export_kv(st.seq), time.time())  # fmt: skip
            else:
                parked = self._park.get(session)
            if parked is None:
                return None
            self._lc["ships_out"] += 1
            return parked.to_bytes()

    def import_session(self, session: str, blob: bytes) -> dict[str, Any]:
        """Takes a shipped snapshot (export_session's bytes) as a parked session; its next fresh submit restores
        it, converting the KV format when this engine's differs. {"accepted": False, "reason"} if refused."""
        refused = {"session": session, "accepted": False, "where": "none", "tokens": 0, "kv_bytes": 0}
        with self._cond:
            try:
                parked = dataclasses.replace(ParkedKV.from_bytes(bytes(blob), self._digest), session=session)
            except ParkFileError as e:
                self._log(f"session {session!r}: shipped snapshot refused ({e}); it will be re-prefilled")
                return {**refused, "reason": str(e)}
            st = self._sessions.get(session)
            if st is not None and (st.active or st.queued):
                return {**refused, "reason": f"session {session!r} has a turn running here"}
            if st is not None:
                self._drop_seq(st)
            where = self._park.put(parked, "ram") or self._park.put(parked, "disk")
            if where is None:
                return {**refused, "reason": f"{parked.nbytes:,} bytes fit neither the RAM nor the disk park tier"}
            st = self._sessions.setdefault(session, _Session(seq=-1))
            st.history = None
            self._lc["ships_in"] += 1
            fmt = pair_name((parked.kv_k, parked.kv_v))
            return {"session": session, "accepted": True, "where": where, "tokens": len(parked.tokens),
                    "kv_bytes": parked.nbytes, "kv_format": fmt, "reason": ""}  # fmt: skip

    def _session_state(self, name: str, st: _Session, mem: dict[str, int]) -> dict[str, Any]:
        """{"state", "where", "kv_bytes", "tokens"} of one session (under self._cond)."""
        busy = st.active or st.queued
        if st.seq >= 0:
            info = self.engine.info(st.seq)
            return {"state": "active" if busy else "idle", "where": "pool",
                    "kv_bytes": self._pool_bytes(info["n_past"], mem), "tokens": int(info["n_tokens"])}  # fmt: skip
        where = self._park.where(name)
        if where is not None:
            return {"state": "active" if busy else "parked", "where": where, "kv_bytes": self._park.nbytes(name),
                    "tokens": len(self._park.tokens(name) or ())}  # fmt: skip
        return {"state": "active" if busy else "dropped", "where": "none", "kv_bytes": 0,
                "tokens": len(st.history or ())}  # fmt: skip

    def _lifecycle_state(self, sessions: dict[str, dict[str, Any]]) -> dict[str, Any]:
        c = self._lc
        costs = self._park_costs
        return {
            "policy": self.spec.lifecycle,
            "counts": lifecycle.counts(v["state"] for v in sessions.values()),
            "idle_bytes": sum(v["kv_bytes"] for v in sessions.values() if v["state"] == "idle"),
            "parked_ram_bytes": self._park.ram_used,
            "parked_disk_bytes": self._park.disk_used,
            "restores": {"ram": c["restores_ram"], "disk": c["restores_disk"]},
            "restore_failures": c["restore_failures"],
            "parks": {"ram": c["parks_ram"], "disk": c["parks_disk"]},
            "drops": c["drops"],
            "ships": {"in": c["ships_in"], "out": c["ships_out"]},
            "reprefilled_tokens": c["reprefilled_tokens"],
            "reprefill_tokens_saved": c["reprefill_tokens_saved"],
            "park_files_refused": self._park.refused,
            "park_dir": str(self._park.directory),
            "park_ram_budget": self._park.ram_budget,
            "park_disk_budget": self._park.disk_budget,
            "costs": costs.to_dict() if costs is not None else None,
            "decisions": list(self._decisions),
        }


def _extends(tokens: Sequence[int], prefix: Sequence[int]) -> bool:
    """tokens is prefix followed by at least one more token."""
    return len(tokens) > len(prefix) and list(tokens[: len(prefix)]) == list(prefix)
