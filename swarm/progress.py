"""Live progress of a swarm run in the terminal (rich): a table of workers and one of agents."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


class LiveProgress:
    """Live progress bars per worker and agent (rich), redrawn a few times a second."""

    def __init__(self, name: str, states: Callable[[], dict[str, Any]], agents: Callable[[], Sequence[Any]]) -> None:
        """name: the swarm's; states: each worker's state(); agents: the run's progress() (AgentProgress rows)."""
        from rich.console import Console
        from rich.live import Live

        self.name, self.worker_states, self.agent_progress = name, states, agents
        self.console = Console()
        self.last = 0.0
        self.states: dict[str, Any] = {}
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < 0.5:
            return
        self.last = now
        self.states = {w: s for w, s in self.worker_states().items() if isinstance(s, dict)}
        self.live.update(self._render())

    def _render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        workers = Table(title=f"swarm {self.name}: workers", title_justify="left")
        for col in ("worker", "device", "KV format", "agents", "tokens", "tok/s", "queue", "KV reserved / budget"):
            workers.add_column(col, justify="right" if col in ("agents", "tokens", "tok/s", "queue") else "left")
        for w, s in self.states.items():
            used, budget = s["kv_bytes_reserved"], max(s["kv_budget_bytes"], 1)
            kv = Table.grid(padding=(0, 1))
            kv.add_row(ProgressBar(total=budget, completed=used, width=16),
                       f"{used / 2**20:.1f}/{budget / 2**20:.1f} MiB")  # fmt: skip
            workers.add_row(w, s["device"], s["kv_format"], str(s["active_sessions"]), str(s["tokens_generated"]),
                            f"{s['tokens_per_s']:.0f}", str(s["queue_depth"]), kv)  # fmt: skip
        agents = Table(title="agents", title_justify="left")
        for col in ("agent", "worker", "turn", "context / reserved", "tokens", "progress"):
            agents.add_column(col, justify="right" if col == "tokens" else "left")
        for p in self.agent_progress():
            agents.add_row(p.name, str(p.worker or "-"), p.turn, f"{p.history_tokens} / {p.context}",
                           str(p.tokens_generated), ProgressBar(total=p.planned_tokens, completed=p.done_tokens,
                                                                width=20))  # fmt: skip
        return Group(workers, agents)

    def close(self) -> None:
        self.update(force=True)
        self.live.stop()
