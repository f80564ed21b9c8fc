"""The swarm's agents and their turns as records, and the runtime's constants."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from swarm.config import AgentGroup, SwarmConfig
from swarm.errors import (
    ConfigError,
)
from swarm.jobs import Job
from swarm.runtime.placement import GroupKey

POLL_S = 0.05
CRASH_WINDOW_S = 60.0  # deaths of one worker within this window back its restarts off
RECORD_RETRY_S = 1.0  # while the store cannot record (disk full), how often a write is tried again
RESTART_BACKOFF_MAX_S = 30.0  # the longest wait before a worker that keeps dying is started again
START_ATTEMPTS = 3  # failed starts of every worker in a row before the swarm is failed (nothing can run)
REJOIN_AFTER_S = 30.0
REPLAN_GAIN = 1.15  # a re-plan after agents finish must promise this much more aggregate tokens/s
JOIN_CHECK_S = 2.0
CANCEL_REASONS = ("cancelled", "deadline", "client_cancelled", "swarm_stopped")
DEFAULT_REVIEW = "Here are the other agents' reports. Review them."


RECORDED = {"recorded": True}  # field metadata: the store's snapshot of an agent holds this field


def recorded(obj: Any) -> dict[str, Any]:
    """The fields of a record marked RECORDED, by name (what a snapshot holds of it)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.metadata.get("recorded")}


def recorded_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.metadata.get("recorded"))


@dataclass
class TurnRequest:
    """What a turn adds and how it samples: a configured task or a job from the API."""

    messages: list[dict[str, str]] = field(metadata=RECORDED)
    max_new: int = field(metadata=RECORDED)
    sampling: dict[str, Any] | None = field(default=None, metadata=RECORDED)  # None: the group's
    job: Job | None = None
    task: bool = field(default=False, metadata=RECORDED)  # one of the agent's configured tasks


@dataclass
class Turn:
    index: int = field(metadata=RECORDED)
    user: str = field(metadata=RECORDED)
    request: TurnRequest
    prompt_tokens: int = field(default=0, metadata=RECORDED)
    reply: list[int] = field(default_factory=list, metadata=RECORDED)
    started: float = field(default=0.0, metadata=RECORDED)
    first_token_s: float | None = None
    worker: str = ""
    kv_format: str = ""
    resumed: int = field(default=0, metadata=RECORDED)  # times it was re-prefilled on another worker mid-turn
    # the tokens this turn added to the history; fresh: they are the whole conversation (it was re-rendered)
    prompt_ids: list[int] = field(default_factory=list, metadata=RECORDED)
    fresh: bool = field(default=False, metadata=RECORDED)


@dataclass
class Agent:
    name: str
    group: AgentGroup
    index: int = field(metadata=RECORDED)
    context: int = field(metadata=RECORDED)  # tokens reserved
    messages: list[dict[str, str]] = field(default_factory=list, metadata=RECORDED)
    history: list[int] = field(default_factory=list, metadata=RECORDED)  # every token the engine sequence holds
    turns_done: int = field(default=0, metadata=RECORDED)
    turn: Turn | None = None
    worker: str | None = None
    finished: bool = field(default=False, metadata=RECORDED)
    finish_note: str = field(default="", metadata=RECORDED)
    moved_from: str | None = None  # the worker it left, until it is placed again
    synced: bool = False  # its worker holds its history (False after a move)
    move_reason: str = ""
    tokens_generated: int = field(default=0, metadata=RECORDED)
    log: list[dict[str, Any]] = field(default_factory=list, metadata=RECORDED)  # transcript records
    tasks_done: int = field(default=0, metadata=RECORDED)  # configured tasks completed
    jobs: deque[Job] = field(default_factory=deque)  # API jobs waiting for their turn
    oneoff: bool = field(default=False, metadata=RECORDED)  # placed for one job, released after it

    @property
    def planner_group(self) -> GroupKey:
        return GroupKey(self.group.name, None if self.context == self.group.context else self.context)


def check_launchable(cfg: SwarmConfig) -> None:
    """What `swarm plan` accepts but a run needs besides: turns for every agent, a real model."""
    if cfg.model.geometry is not None:
        raise ConfigError("model.geometry", "describes a model with no weights", "give model.path to launch")
    for i, g in enumerate(cfg.agents):
        if not g.tasks and g.inputs_from is None:
            raise ConfigError(f"agents[{i}].tasks", "is empty", "give the turns each agent works through, or set "
                              "inputs_from to review another group's output")  # fmt: skip


def rebuild_history(transcript: Path, upto_turn: int | None = None) -> list[int]:
    """An agent's token history from its JSONL transcript: through turn `upto_turn`'s prompt, or all of it."""
    history: list[int] = []
    for line in Path(transcript).read_text().splitlines():
        rec = json.loads(line)
        if rec["role"] != "assistant":
            continue
        history = list(rec["prompt_ids"]) if rec["fresh"] else history + rec["prompt_ids"]
        if rec["turn"] == upto_turn:
            return history
        history += rec["token_ids"]
    return history


def _group_dict(g: dict[str, Any]) -> dict[str, Any]:
    """A recorded AgentGroup as config input (tuples became lists)."""
    out = {k: v for k, v in g.items() if v is not None}
    out["min_quality"] = {k: v for k, v in g.get("min_quality", {}).items() if v is not None}
    return out


def _sample(names: Any, n: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


def _format(k: str, v: str) -> str:
    return k if k == v else f"{k}/{v}"


def _last_reply(a: Agent) -> str:
    replies = [m["content"] for m in a.messages if m["role"] == "assistant"]
    return replies[-1] if replies else "(no output)"
