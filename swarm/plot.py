"""`swarm plan --plot`: KV memory against context per format, with each worker's limit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from swarm.planner import Plan
from swarm.planning import PlanInputs
from worker.formats import pair_name


def plot_memory(plan: Plan, inp: PlanInputs, out: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib. To fix: pip install matplotlib") from e
    geom = inp.geometry
    workers = [w for w in plan.workers if w.agents] or list(plan.workers)
    fig, axes = plt.subplots(1, len(workers), figsize=(6 * len(workers), 4.5), squeeze=False)
    pairs = sorted({(f, f) for p in inp.policy.formats for f in p}, key=lambda p: -geom.kv_bytes_per_token(p))
    for ax, w in zip(axes[0], workers, strict=True):
        ctx = np.linspace(1, geom.n_ctx, 200)
        for p in pairs:
            kv = np.array([geom.kv_bytes(int(n), p, inp.settings) for n in ctx])  # sliding layers capped
            total = w.weight_bytes + w.scratch_bytes + w.agents * kv
            style = "-" if pair_name(p) == w.format else "--"
            ax.plot(ctx, total / 1e9, style, label=pair_name(p))
        ax.axhline(w.usable_bytes / 1e9, color="black", lw=1.2, label=f"{w.device} limit")
        if w.agents:
            per_agent = w.reserved_context / w.agents
            ax.axvline(per_agent, color="gray", lw=0.8, ls=":", label="reserved context / agent")
        ax.set_title(f"{w.worker}: {w.agents} agents, chose {w.format}")
        ax.set_xlabel("context per agent (tokens)")
        ax.set_ylabel("weights + scratch + KV (GB)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
