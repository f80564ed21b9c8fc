"""Jobs: turns submitted from outside a swarm (the gRPC API), with a replayable token stream.

A job's tokens and their text pieces are appended once, in order, and never
change, so a client that reconnects with the offset it last saw gets exactly
the rest: no gap, no repeat. Text that may be the start of a stop string is
held back until it is known not to be one.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from worker.stops import StopFilter

TERMINAL = ("done", "cancelled", "failed")


@dataclass
class Job:
    swarm: str
    agent: str
    messages: list[dict[str, str]]
    max_tokens: int
    sampling: dict[str, Any] | None = None  # None: the agent's group sampling
    stop: tuple[str, ...] = ()
    idempotency_key: str = ""
    deadline: float | None = None  # time.time() after which it is cancelled
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    state: str = "queued"
    token_ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    text: str = ""  # the final text (up to a stop string)
    finish_reason: str = ""
    error: str = ""
    worker: str = ""
    kv_format: str = ""
    prompt_tokens: int = 0
    created: float = field(default_factory=time.time)
    started: float | None = None
    first_token: float | None = None
    ended: float | None = None
    stopped: bool = False  # a stop string was found; later tokens are not part of the output
    cached_tokens: int = 0  # prompt tokens served from the agent's resident KV (not prefilled again)
    api: dict[str, Any] | None = None  # the HTTP API's request facts (swarm/http): how to answer it again

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._out = StopFilter(self.stop)  # decoded text so far (cut at a stop string), and how much is given out
        self._decoder: Any = None
        self._final = 0  # tokens whose pieces can no longer change (nothing held back after them)
        self._visible = 0  # tokens recorded durably (a stream hands out no more)
        self._visible_done = False  # the end is recorded durably
        self._flushed = 0  # tokens already written to the store
        self.dirty = True  # state or result changed since the last write

    # -- written by the swarm loop ----------------------------------------------------------
    def begin(self, decoder: Any, worker: str, kv_format: str, prompt_tokens: int) -> None:
        with self._cond:
            if self.started is None:
                self.started = time.time()
            self.state = "running"
            self._decoder, self.worker, self.kv_format, self.prompt_tokens = decoder, worker, kv_format, prompt_tokens
            if self.token_ids:  # resumed after a restart: the decoder catches up on the text so far
                for tok in self.token_ids:
                    decoder.push(tok)
            self.dirty = True
            self._cond.notify_all()

    def push(self, tokens: list[int], eot: frozenset[int]) -> bool:
        """Appends tokens with their pieces; True when a stop string ends the output here."""
        with self._cond:
            for tok in tokens:
                if self.stopped or len(self.token_ids) >= self.max_tokens:
                    break
                if self.first_token is None:
                    self.first_token = time.time()
                self.token_ids.append(int(tok))
                self.pieces.append(self._out.push("" if tok in eot else self._decoder.push(int(tok))))
                if self._out.stopped:
                    self.stopped = True
                    break
                if self._out.emitted == len(self._out.text):
                    self._final = len(self.token_ids)
            self._cond.notify_all()
            return self.stopped

    def finish(self, state: str, reason: str, error: str = "") -> None:
        with self._cond:
            if self.state in TERMINAL:
                return
            if not self.stopped and self._decoder is not None:
                self._out.end(self._decoder.flush())
            if self.pieces:
                self.pieces[-1] += self._out.release()  # the held-back tail, now known to be text
            self.text = self._out.text
            self.state, self.finish_reason, self.error = state, reason, error
            self.ended = time.time()
            self.dirty = True
            self._cond.notify_all()

    def relocate(self, worker: str, kv_format: str) -> None:
        with self._cond:
            if (worker, kv_format) != (self.worker, self.kv_format):
                self.worker, self.kv_format, self.dirty = worker, kv_format, True

    def publish(self) -> None:
        """Makes what was recorded visible to streams (called after the store committed it)."""
        with self._cond:
            self._visible = len(self.token_ids)
            self._visible_done = self.done
            self._cond.notify_all()

    # -- the store ------------------------------------------------------------------------------
    def pending_writes(self) -> tuple[tuple[list[int], list[str]] | None, tuple[str, dict[str, Any]] | None]:
        """(new tokens and pieces, new state and result) since the last write; marks them written."""
        with self._cond:
            chunk = None
            if len(self.token_ids) > self._flushed:
                chunk = (self.token_ids[self._flushed :], self.pieces[self._flushed :])
                self._flushed = len(self.token_ids)
            update = None
            if self.dirty or chunk:
                update = (self.state, self.result())
                self.dirty = False
            return chunk, update

    def result(self) -> dict[str, Any]:
        return {"text": self.text, "finish_reason": self.finish_reason, "error": self.error, "worker": self.worker,
                "kv_format": self.kv_format, "prompt_tokens": self.prompt_tokens, "started": self.started,
                "first_token": self.first_token, "ended": self.ended, "stopped": self.stopped, "raw": self._out.text,
                "emitted": self._out.emitted, "final": self._final, "cached_tokens": self.cached_tokens,
                "pieces_patch": self.pieces[-1:] if self.done else []}  # fmt: skip

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "swarm": self.swarm, "agent": self.agent, "state": self.state,
                "request": {"messages": self.messages, "max_tokens": self.max_tokens, "sampling": self.sampling,
                            "stop": list(self.stop), "deadline": self.deadline, "api": self.api},
                "result": self.result(), "idempotency_key": self.idempotency_key, "created": self.created}  # fmt: skip

    @staticmethod
    def restore(rec: dict[str, Any]) -> Job:
        r, q = rec["result"], rec["request"]
        job = Job(swarm=rec["swarm"], agent=rec["agent"], messages=q["messages"], max_tokens=q["max_tokens"],
                  sampling=q["sampling"], stop=tuple(q["stop"]), idempotency_key=rec["idempotency_key"],
                  deadline=q["deadline"], id=rec["id"], state=rec["state"], created=rec["created"])  # fmt: skip
        job.api = q.get("api")
        job.cached_tokens = int(r.get("cached_tokens", 0))
        job.token_ids, job.pieces = list(rec["token_ids"]), list(rec["pieces"])
        if job.done and r.get("pieces_patch") and job.pieces:
            job.pieces[-1] = r["pieces_patch"][0]
        for k in ("text", "finish_reason", "error", "worker", "kv_format", "prompt_tokens", "started", "first_token",
                  "ended", "stopped"):  # fmt: skip
            setattr(job, k, r[k])
        job._out = StopFilter(job.stop, r["raw"], r["emitted"])
        job._out.stopped = job.stopped
        job._final = r["final"]
        job._flushed = len(job.token_ids)
        job.dirty = False
        if job.state == "running":
            job.state = "queued"  # it runs again (resumed from its tokens) once its agent is placed
        job.publish()
        return job

    # -- read by API handlers -----------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def wait(self, offset: int, timeout: float) -> tuple[list[int], list[str], bool]:
        """Tokens and pieces from `offset`, waiting up to `timeout` for some; (.., .., finished)."""
        with self._cond:
            if self._visible <= offset and not self._visible_done:
                self._cond.wait(timeout)
            # Only recorded tokens go out; and a piece followed by held-back text may still grow, so a running
            # job hands out final pieces only.
            end = self._visible if self._visible_done else max(min(self._final, self._visible), offset)
            return self.token_ids[offset:end], self.pieces[offset:end], self._visible_done and end >= self._visible

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {
                "id": self.id, "swarm": self.swarm, "agent": self.agent, "state": self.state,
                "tokens": len(self.token_ids), "text": self.text if self.done else self._out.final,
                "finish_reason": self.finish_reason, "error": self.error, "worker": self.worker,
                "kv_format": self.kv_format, "created_unix": self.created,
                "time_to_first_token_s": (self.first_token - self.started) if self.first_token and self.started
                else 0.0,
                "duration_s": ((self.ended or time.time()) - self.started) if self.started else 0.0,
                "prompt_tokens": self.prompt_tokens, "idempotency_key": self.idempotency_key,
            }  # fmt: skip
