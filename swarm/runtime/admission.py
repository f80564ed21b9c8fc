"""Admission: API jobs (submit_job, cancel_job) and the one-off agents placed for them."""

from __future__ import annotations

import math
from typing import Any

from swarm import scheduler
from swarm.config import AgentGroup
from swarm.errors import (
    FailedPrecondition,
    NoFeasiblePlan,
    NotFound,
    ResourceExhausted,
    StoreFull,
)
from swarm.jobs import Job
from swarm.runtime.agents import (
    Agent,
    _sample,
)


class AdmissionMixin:
    """Jobs from the API: validated, queued on an agent, or given a one-off agent."""

    MAX_QUEUE = 256  # jobs waiting per agent

    def submit_job(
        self,
        *,
        agent: str | None = None,
        group: str | None = None,
        new_agent: bool = False,
        messages: list[dict[str, str]],
        max_tokens: int = 0,
        sampling: dict[str, Any] | None = None,
        stop: tuple[str, ...] = (),
        idempotency_key: str = "",
        deadline: float | None = None,
        api: dict[str, Any] | None = None,
    ) -> list[Job]:
        """Queues one turn per target agent (validated by the caller); returns the jobs."""
        with self.lock:
            if self.state != "running":
                raise FailedPrecondition(
                    f"swarm {self.cfg.name!r} is {self.state}{': ' + self.error if self.error else ''}"
                )
            if self.record_error:
                raise StoreFull(self.record_error)
            if new_agent:
                targets = [self._new_oneoff(messages, max_tokens or 128)]
            elif agent is not None:
                if agent not in self.agents:
                    raise NotFound(f"swarm {self.cfg.name!r} has no agent {agent!r} (agents: {_sample(self.agents)})")
                targets = [self.agents[agent]]
            else:
                targets = [a for a in self.agents.values() if a.group.name == group and not a.oneoff]
                if not targets:
                    groups = sorted({a.group.name for a in self.agents.values() if not a.oneoff})
                    raise NotFound(f"swarm {self.cfg.name!r} has no group {group!r} (groups: {', '.join(groups)})")
            jobs = []
            for a in targets:
                if a.finished:
                    raise FailedPrecondition(f"agent {a.name} has finished ({a.finish_note}); it takes no more jobs")
                if len(a.jobs) >= self.MAX_QUEUE:
                    raise ResourceExhausted(f"agent {a.name} already has {len(a.jobs)} jobs waiting (the limit); "
                                            "wait for some to finish or send to another agent")  # fmt: skip
                n = max_tokens or a.group.max_new_tokens
                new = self.tok.encode_chat(a.messages + messages, add_generation_prompt=True)
                if len(new) + n > self.inputs.geometry.n_ctx:
                    room = self.inputs.geometry.n_ctx - len(new)
                    raise ResourceExhausted(
                        f"agent {a.name}: the conversation would be {len(new):,} tokens + {n:,} new, past the model's "
                        f"{self.inputs.geometry.n_ctx:,}; " + (f"ask for at most max_tokens={room}" if room > 0 else
                                                               "start a new agent (new_agent) with a shorter prompt")
                    )  # fmt: skip
            for a in targets:
                jobs.append(Job(swarm=self.cfg.name, agent=a.name, messages=list(messages),
                                max_tokens=max_tokens or a.group.max_new_tokens, sampling=sampling, stop=tuple(stop),
                                idempotency_key=idempotency_key, deadline=deadline, api=api))  # fmt: skip
            if self.store is not None:  # accepted means recorded
                try:
                    self.store.add_jobs([j.record() for j in jobs])
                except StoreFull as e:
                    for a in targets:
                        if a.oneoff:
                            self._finish_agent(a, "cancelled")
                    self._record_failed(e)
                    raise
                self.flush()  # a one-off agent's snapshot, too
            for a, job in zip(targets, jobs, strict=True):
                job.dirty = False
                a.jobs.append(job)
                self.jobs[job.id] = self._open_jobs[job.id] = job
            return jobs

    def _new_oneoff(self, messages: list[dict[str, str]], max_tokens: int) -> Agent:
        k = self._oneoffs
        prompt = self.tok.encode_chat(messages, add_generation_prompt=True)
        bt = self.cfg.engine.block_tokens
        need = len(prompt) + max_tokens
        if need > self.inputs.geometry.n_ctx:
            raise ResourceExhausted(f"a one-off agent needs {need:,} tokens, past the model's "
                                    f"{self.inputs.geometry.n_ctx:,}; shorten the messages or max_tokens")  # fmt: skip
        ctx = math.ceil(need / bt) * bt
        g = AgentGroup(name=f"job{k}", count=1, context=ctx, max_new_tokens=max_tokens)
        a = Agent(name=f"job{k}-0", group=g, index=0, context=ctx, oneoff=True)
        self.agents[a.name] = a
        self._snap_dirty.add(a.name)
        reason = f"one-off agent {a.name}"
        try:
            if self._replace_reason is not None:  # workers are down: it waits with the others if it fits them all
                self._plan([d for d in self.devices if d not in self.missing])
                self._owe_placement(reason)
            else:
                self.place(self._placeable(), reason)
        except NoFeasiblePlan as e:
            del self.agents[a.name]
            self._snap_dirty.discard(a.name)
            raise ResourceExhausted(f"no worker has room for a one-off agent of {ctx:,} tokens: {e}") from e
        except scheduler.SchedulerError as e:  # a worker died or would not start: placed with the others later
            self._owe_placement(f"{reason} ({str(e)[:200]})")
        self._oneoffs += 1
        return a

    def cancel_job(self, job_id: str, reason: str = "cancelled") -> Job:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id!r} in swarm {self.cfg.name!r}")
            if job.done:
                return job
            a = self.agents[job.agent]
            if job in a.jobs:
                a.jobs.remove(job)
                job.finish("cancelled", reason)
                if a.oneoff and a.turn is None:
                    self._finish_agent(a, "cancelled")
            elif a.turn is not None and a.turn.request.job is job:
                self._cancel_turn(a, reason)
            return job

    def _fail_jobs(self, why: str, cancelled: bool = False) -> None:
        for a in self.agents.values():
            pending = list(a.jobs) + ([a.turn.request.job] if a.turn and a.turn.request.job else [])
            for job in pending:
                if job is not None:
                    job.finish("cancelled" if cancelled else "failed", "swarm_stopped" if cancelled else "error", why)
            a.jobs.clear()
