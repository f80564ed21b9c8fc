"""The durable record: agents' snapshots and history chunks, jobs, and restoring them."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from swarm.errors import (
    StoreFull,
)
from swarm.jobs import Job
from swarm.runtime.agents import (
    RECORD_RETRY_S,
    Agent,
    Turn,
    TurnRequest,
    _group_dict,
    recorded,
    recorded_names,
)


class RecordMixin:
    """What the store records each tick, and taking it back after a restart."""

    def flush(self) -> None:
        """Records what changed (one transaction), then lets streams see it.

        When the store cannot record (disk full) nothing is marked written and streams see nothing new: the
        next flush after RECORD_RETRY_S tries the whole change again, so recording resumes on its own."""
        if self.record_error and time.monotonic() < self._record_retry_at:
            return
        changed = [j for j in self._open_jobs.values() if j.dirty or len(j.token_ids) > j._flushed]
        if self.store is not None:
            snaps = {n: self._snapshot(self.agents[n]) for n in self._snap_dirty if n in self.agents}
            chunks, hist = {}, {}
            for a in self.agents.values():
                if a.name in snaps:
                    hist[a.name] = len(a.history)
                elif len(a.history) > self._hist_flushed.get(a.name, 0):
                    chunks[a.name] = a.history[self._hist_flushed.get(a.name, 0) :]
                    hist[a.name] = len(a.history)
            stmts = self.store.agent_statements(self.cfg.name, snaps, chunks)
            marks = {j.id: (j._flushed, j.dirty) for j in changed}  # restored if the write fails
            job_chunks, job_updates = {}, {}
            for j in changed:
                chunk, update = j.pending_writes()
                if chunk:
                    job_chunks[j.id] = chunk
                if update:
                    job_updates[j.id] = update
            try:
                self.store.commit(stmts + self.store.job_statements(job_updates, job_chunks))
            except StoreFull as e:
                for j in changed:
                    j._flushed, j.dirty = marks[j.id]
                self._record_failed(e)
                return
            self._hist_flushed.update(hist)
            if self.record_error:
                self._event("recording_resumed")
                self.record_error = ""
                self._state_changed()
        self._snap_dirty.clear()
        for j in changed:
            j.publish()
            if j.done:  # recorded and seen as ended: it changes no more
                del self._open_jobs[j.id]

    def _record_failed(self, e: StoreFull) -> None:
        self._record_retry_at = time.monotonic() + RECORD_RETRY_S
        if not self.record_error:
            self._event("recording_paused", error=str(e)[:300])
            self.record_error = str(e)
            self._state_changed()

    def _snapshot(self, a: Agent) -> dict[str, Any]:
        """An agent's RECORDED fields (swarm/runtime/agents.py), its group and its turn's, for the store."""
        t = a.turn
        turn = None
        if t is not None:
            job = t.request.job
            turn = {**recorded(t), "request": {**recorded(t.request), "job": job.id if job else None}}
        return {"group": dataclasses.asdict(a.group), **recorded(a), "turn": turn}

    def restore(self, agents: dict[str, tuple[dict[str, Any], list[int]]], jobs: list[dict[str, Any]]) -> None:
        """Takes back agents and jobs a previous server recorded (before start())."""
        from swarm.config import load_config

        for rec in jobs:
            job = self.jobs[rec["id"]] = Job.restore(rec)
            if not job.done:
                self._open_jobs[job.id] = job
        for name, (snap, extra) in agents.items():
            a = self.agents.get(name)
            if a is None:  # a one-off agent
                g = load_config({"name": "x", "agents": [_group_dict(snap["group"])]}).agents[0]
                a = self.agents[name] = Agent(name=name, group=g, index=snap["index"], context=snap["context"])
                self._oneoffs = max(self._oneoffs, int(name[3:].split("-")[0]) + 1 if name.startswith("job") else 0)
            for k in recorded_names(Agent):
                setattr(a, k, snap[k])
            a.history = a.history + extra
            t = snap["turn"]
            if t is not None and not a.finished:
                r = t["request"]
                job = self.jobs.get(r["job"]) if r["job"] else None
                req = TurnRequest(**{k: r[k] for k in recorded_names(TurnRequest)}, job=job)
                a.turn = Turn(**{k: t[k] for k in recorded_names(Turn)}, request=req)
                a.turn.reply = t["reply"] + extra
                if job is not None:
                    job.begin(self.tok.stream_decoder(skip_special=True), "", "", t["prompt_tokens"])
            self._hist_flushed[a.name] = len(a.history)
        queued = sorted((j for j in self.jobs.values() if j.state == "queued"), key=lambda j: j.created)
        running = {a.turn.request.job.id for a in self.agents.values() if a.turn and a.turn.request.job}
        for j in queued:
            if j.id in running:
                continue
            a = self.agents.get(j.agent)
            if a is None or a.finished:
                j.finish("failed", "agent_finished", f"agent {j.agent} is gone after the restart")
            else:
                a.jobs.append(j)
