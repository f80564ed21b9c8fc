"""`swarm launch`: run a whole agent swarm, placed by the planner, on Ray workers.

The driver owns every agent's conversation and token history (the engine's
sequence on its worker is a cache of it), so a session can move: to a new
worker it is re-prefilled from that history, and its transcript stays whole.
Ray is reached only through swarm/scheduler.py.

Re-planning happens when
- a worker dies or stops answering: its agents move to the survivors,
- a cluster worker whose device was missing at launch joins,
- an agent's next turn would run past its reserved context: it is re-planned
  with the larger context (or, if nothing fits, the turn is cut at the
  reservation and its transcript says so),
and when agents finish their KV reservations are released.

The runtime itself lives in swarm/runtime/ (one job per module, see its __init__); this module keeps the
entry point and re-exports the names other modules import from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm import scheduler
from swarm.config import SwarmConfig
from swarm.planning import plan_inputs
from swarm.runtime.agents import Agent, Turn, TurnRequest, check_launchable, rebuild_history
from swarm.runtime.loop import SwarmRun
from swarm.runtime.report import summary_table
from worker.host import available_memory

__all__ = ["Agent", "SwarmRun", "Turn", "TurnRequest", "check_launchable", "launch", "rebuild_history", "summary_table"]


# -- entry point -------------------------------------------------------------------------------


def launch(
    cfg: SwarmConfig,
    *,
    address: str | None = None,
    keep: bool = False,
    out_dir: Path | None = None,
    echo: Callable[[str], None] = print,
    live: bool = True,
    timeout_s: float | None = None,
    calibrate: Callable[[Path, str, int], dict[str, Any]] | None = None,
    on_tick: Callable[[SwarmRun], None] | None = None,
) -> dict[str, Any]:
    """Plans, starts Ray (or joins one), runs the swarm to the end, writes transcripts and a summary."""
    check_launchable(cfg)
    inputs = plan_inputs(cfg, calibrate=calibrate, progress=None)
    out = out_dir or Path(cfg.output_dir) / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # KV reservations: host RAM for CPU workers, each local GPU's device heap for the GPU workers on it
    conn = scheduler.connect(address, kv_bytes=available_memory(), keep=keep, device_kv_bytes=inputs.gpu_memory)
    echo(f"Ray: {conn.address}  dashboard: {conn.dashboard_url or '(not running)'}")
    if conn.auth_token_path:
        echo(f"  log in to the dashboard with the token in {conn.auth_token_path}")
    sched = scheduler.Scheduler(cfg.name, conn)
    try:
        run = SwarmRun(cfg, inputs, sched, out, echo=echo, live=live)
        run.on_tick = on_tick
        summary = run.run(timeout_s=timeout_s)
        echo(summary_table(summary))
        echo(f"transcripts: {out / 'agents'}  summary: {out / 'summary.json'}")
        if keep:
            echo(f"--keep: the swarm's workers stay up; `swarm status --address {conn.address}` shows them, "
                 "`ray stop` ends them")  # fmt: skip
        return summary
    finally:
        if not keep:
            sched.shutdown()
            scheduler.disconnect(conn)
        else:
            scheduler.disconnect(conn, stop_head=False)
