"""An agent's turns: the next request, encoding it, submitting it to its worker, ending or failing it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from swarm import scheduler
from swarm.runtime.agents import (
    CANCEL_REASONS,
    DEFAULT_REVIEW,
    Agent,
    Turn,
    TurnRequest,
    _format,
    _last_reply,
)


class TurnsMixin:
    """Agents and their turns (SwarmRun's part that drives conversations)."""

    def _task_text(self, a: Agent) -> str | None:
        """The next configured task's user message, or None while its inputs are not ready."""
        g = a.group
        tasks = list(g.tasks)
        if g.inputs_from is not None:
            sources = [s for s in self.agents.values() if s.group.name == g.inputs_from]
            if not all(self._tasks_over(s) for s in sources):
                return None
            if a.tasks_done == 0:
                reports = "\n\n".join(f"Report from {s.name}:\n{_last_reply(s)}" for s in sources)
                return f"{tasks[0] if tasks else DEFAULT_REVIEW}\n\n{reports}"
        return tasks[a.tasks_done]

    def _n_turns(self, a: Agent) -> int:
        """Configured turns (tasks, or the one review turn of an inputs_from group)."""
        if a.oneoff:
            return 0
        return max(len(a.group.tasks), 1 if a.group.inputs_from else 0)

    def _tasks_over(self, a: Agent) -> bool:
        return a.finished or (a.tasks_done >= self._n_turns(a) and a.turn is None)

    def _next_request(self, a: Agent) -> TurnRequest | None:
        if a.tasks_done < self._n_turns(a):
            text = self._task_text(a)
            if text is None:
                return None
            return TurnRequest([{"role": "user", "content": text}], a.group.max_new_tokens, task=True)
        while a.jobs:
            job = a.jobs.popleft()
            if not job.done:  # cancelled while queued
                return TurnRequest(job.messages, job.max_tokens, job.sampling, job=job)
        return None

    def _sampling(self, a: Agent, req: TurnRequest, max_new: int) -> dict[str, Any]:
        s = a.group.sampling
        base = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "repetition_penalty": s.repetition_penalty, "seed": s.seed + a.index + 7919 * a.turns_done}  # fmt: skip
        out = {**base, **(req.sampling or {}), "max_new_tokens": max_new, "stop_tokens": self.stop_tokens}
        if "grammar" in out and a.turn is not None and a.turn.reply:  # resumed mid-reply: the grammar catches up
            out["grammar_prefix"] = list(a.turn.reply)
        return out

    def _encode_turn(self, a: Agent, new: list[dict[str, str]]) -> tuple[list[int], bool]:
        """Tokens extending the agent's history with new messages (fresh: the whole conversation)."""
        text = self.tok.render_chat(a.messages + new, add_generation_prompt=True)
        if a.history:
            have = self.tok.decode(a.history)
            if text.startswith(have) and len(text) > len(have):
                return self.tok.encode(text[len(have) :], add_bos=False), False
        return self.tok.encode_chat(a.messages + new, add_generation_prompt=True), True

    def _start_turn(self, a: Agent) -> bool:
        req = self._next_request(a)
        if req is None:
            return False
        try:
            self._begin_turn(a, req)
        except Exception as e:  # noqa: BLE001 - an error serving one job fails that job, not the swarm
            why = f"{type(e).__name__}: {str(e)[:300]}"
            if a.turn is not None and a.turn.request is req:
                self._fail_turn(a, why)
            else:
                self._event("turn_failed", agent=a.name, job=req.job.id if req.job else None, error=why)
                if req.job is not None:
                    req.job.finish("failed", "error", f"the turn could not start: {why}")
                if req.task:
                    a.tasks_done += 1
                    a.turns_done += 1
        return True

    def _begin_turn(self, a: Agent, req: TurnRequest) -> None:
        tokens, fresh = self._encode_turn(a, req.messages)
        need = (0 if fresh else len(a.history)) + len(tokens) + req.max_new
        if need > a.context:
            self._grow(a, need)  # if nothing holds it, the turn is cut at the reservation (_submit clips it)
        if not a.synced and not fresh:  # it moved: the new worker prefills the whole history
            tokens, fresh = a.history + tokens, True
        user = "\n\n".join(m["content"] for m in req.messages if m["role"] == "user")
        t = Turn(index=a.turns_done, user=user, request=req, started=time.time())
        a.messages.extend(req.messages)
        a.history = tokens if fresh else a.history + tokens
        t.prompt_tokens, t.prompt_ids, t.fresh = len(tokens), list(tokens), fresh
        a.turn = t
        self._snap_dirty.add(a.name)
        if req.job is not None and a.worker is not None:
            h = self.sched.workers.get(a.worker)
            fmt = _format(h.spec.kv_k, h.spec.kv_v) if h else ""
            req.job.cached_tokens = 0 if fresh else len(a.history) - len(tokens)  # the history before this turn
            req.job.begin(self.tok.stream_decoder(skip_special=True), a.worker, fmt, len(tokens))
        self._submit(a, tokens, fresh)

    def _submit(self, a: Agent, tokens: list[int], fresh: bool) -> None:
        t = a.turn
        assert t is not None
        if a.worker is None or a.worker not in self.sched.workers:
            return  # its worker is down: the next placement resumes the turn from the history
        left = t.request.max_new - len(t.reply)
        room = a.context - len(a.history)
        max_new = min(left, room)
        if max_new <= 0:
            self._end_turn(a, "context" if room <= 0 else "max_tokens")
            return
        h = self.sched.workers[a.worker]
        t.worker, t.kv_format = a.worker, _format(h.spec.kv_k, h.spec.kv_v)
        if t.request.job is not None:
            t.request.job.relocate(t.worker, t.kv_format)
        try:
            self.sched.submit(a.worker, a.name, t.index, tokens, self._sampling(a, t.request, max_new), fresh)
            a.synced = True
        except scheduler.WorkerLost:  # the next tick reports the loss and the agent moves
            pass
        except scheduler.CallRefused as e:  # the worker refused this turn (it stays up): the turn fails alone
            self._fail_turn(a, str(e))

    def _resume(self, a: Agent) -> None:
        """Re-prefills a moved agent's whole history on its new worker and continues its turn."""
        assert a.turn is not None
        a.turn.resumed += 1
        self._submit(a, list(a.history), True)

    def _end_turn(self, a: Agent, reason: str) -> None:
        t = a.turn
        assert t is not None
        job = t.request.job
        if job is not None and job.stopped:
            reason = "stop_string"
        reply = list(t.reply)
        if reply and reply[-1] in self.tok.eot_ids:
            reply = reply[:-1]
        text = self.tok.decode(reply, skip_special=True)
        if job is not None and job.stopped:
            job.finish("done", reason)
            text = job.text
        a.messages.append({"role": "assistant", "content": text})
        dur = time.time() - t.started
        a.log.append({"turn": t.index, "user": t.user, "assistant": text, "prompt_tokens": t.prompt_tokens,
                      "prompt_ids": t.prompt_ids, "fresh": t.fresh,
                      "tokens": len(t.reply), "token_ids": t.reply, "finish_reason": reason, "worker": t.worker,
                      "kv_format": t.kv_format, "started": t.started, "duration_s": dur,
                      "time_to_first_token_s": t.first_token_s, "resumed": t.resumed,
                      "history_tokens": len(a.history), "job": job.id if job else None})  # fmt: skip
        if job is not None:
            job.finish("cancelled" if reason in CANCEL_REASONS else "done", reason)
        a.turn = None
        self._snap_dirty.add(a.name)
        a.turns_done += 1
        if t.request.task:
            a.tasks_done += 1
        over = a.tasks_done >= self._n_turns(a) and not a.jobs
        if reason == "context" or (over and (a.oneoff or not self.serve)):
            self._finish_agent(a, "context" if reason == "context" else "done")

    def _fail_turn(self, a: Agent, why: str) -> None:
        """A turn the engine could not serve: its job fails with the engine's message, the turn is taken back
        out of the conversation (the worker already freed the session's KV), and the agent goes on."""
        t = a.turn
        assert t is not None
        job = t.request.job
        self._event("turn_failed", agent=a.name, turn=t.index, worker=t.worker, job=job.id if job else None,
                    error=why[:300])  # fmt: skip
        n_msgs = len(t.request.messages)
        if n_msgs and a.messages[-n_msgs:] == t.request.messages:
            del a.messages[-n_msgs:]
        keep = len(a.history) - len(t.prompt_ids) - len(t.reply)
        a.history = a.history[:keep] if not t.fresh and keep >= 0 else []  # [] : the next turn renders it all
        a.synced = False
        a.turn = None
        self._snap_dirty.add(a.name)
        if job is not None:
            job.finish("failed", "error", f"the engine refused this job: {why}")
        if t.request.task:  # a configured task is not retried
            a.tasks_done += 1
            a.turns_done += 1
        if a.oneoff and not a.jobs:
            self._finish_agent(a, "failed")

    def _finish_agent(self, a: Agent, note: str) -> None:
        self._snap_dirty.add(a.name)
        a.finished = True
        a.finish_note = note
        for job in a.jobs:
            job.finish("failed", "agent_finished", f"agent {a.name} finished ({note}) before this job ran")
        a.jobs.clear()
        if a.worker is not None and a.worker in self.sched.workers:
            with contextlib.suppress(scheduler.WorkerLost):  # the next tick reports the loss
                self.sched.end(a.worker, a.name)
        self._released = True

    def _apply(self, events: dict[str, dict[str, Any]]) -> None:
        for name, ev in events.items():
            a = self.agents.get(name)
            if a is None or a.turn is None or ev["turn"] != a.turn.index:
                continue
            a.turn.reply += ev["tokens"]
            a.history += ev["tokens"]
            a.tokens_generated += len(ev["tokens"])
            if a.turn.first_token_s is None and ev.get("first_token_s") is not None:
                a.turn.first_token_s = ev["first_token_s"]
            job = a.turn.request.job
            if job is not None and ev["tokens"] and job.push(ev["tokens"], self.tok.eot_ids) and not ev["done"]:
                self._cancel_turn(a, "stop_string")  # the text ended at a stop string
                continue
            if ev["done"] and ev["reason"] == "error":
                self._fail_turn(a, ev.get("error") or "the engine raised")
                continue
            if ev["done"]:
                reason = ev["reason"]
                if reason == "max_tokens" and len(a.turn.reply) < a.turn.request.max_new:
                    reason = "context"  # clipped at the reservation
                self._end_turn(a, reason)

    def _cancel_turn(self, a: Agent, reason: str) -> None:
        """Stops a running turn: its worker frees the session's KV, and the next turn re-prefills the history."""
        if a.worker is not None and a.worker in self.sched.workers:
            with contextlib.suppress(scheduler.WorkerLost):
                self.sched.end(a.worker, a.name)
        a.synced = False
        if a.turn is not None:
            self._end_turn(a, reason)
