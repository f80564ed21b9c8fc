"""A search result turned into a Plan, with the words for every decision (and for no fit at all)."""

from __future__ import annotations

import numpy as np

from swarm.planner.evaluate import _Choice, _Model
from swarm.planner.geometry import scratch_bytes
from swarm.planner.result import FormatOption, GroupOnWorker, Plan, WorkerPlan, _gb
from worker.formats import all_pairs, pair_name


def build_plan(m: _Model, counts: np.ndarray, search: str) -> Plan:
    workers = []
    geom, bt = m.geom, m.settings.block_tokens
    for w, d in enumerate(m.devices):
        c = counts[w]
        n = int(c.sum())
        tps, pi = m.value(w, c)
        present = c > 0
        max_ctx = int(m.context[present].max()) if n else 0
        scratch = scratch_bytes(geom, m.settings, n, max_ctx)
        kv, fits, qual, all_tps = m.options(w, c)
        if pi < 0:  # no agents: report the widest allowed format
            pi = int(np.argmax(m.rank))
        pair = m.pairs[pi]
        choice = m.choose(w, c) if n else None
        free = m.free_bytes(w, n, max_ctx)
        options = []
        for oi, p in enumerate(m.pairs):
            below = "" if m.floor_ok[w, oi] else f", below the default quality floor ({m.floor})"
            if oi == pi and n:
                verdict = "chosen"
            elif not fits[oi]:
                verdict = f"over memory by {_gb(kv[oi] - free)}"
            elif not qual[oi]:
                bad = [gi for gi in range(len(m.groups)) if present[gi] and not m.qual_ok[w, gi, oi]]
                verdict = m.qual_reason.get((w, bad[0], oi), "below a quality floor")
            elif np.isnan(m.attn[w, oi]):
                verdict = "not calibrated on this worker"
            else:
                verdict = (f"fits, {all_tps[oi] / tps:.3f}x the chosen tokens/s" if n and tps > 0 else "fits") + below
            options.append(
                FormatOption(
                    format=pair_name(p),
                    kv_bytes=int(kv[oi]),
                    memory_bytes=int(kv[oi]) + geom.resident_bytes + scratch,
                    tokens_per_s=float(all_tps[oi]) if all_tps[oi] > 0 else None,
                    verdict=verdict,
                    tokens_per_s_interval=m.interval(w, c, oi) if all_tps[oi] > 0 else None,
                    meets_floor=bool(m.floor_ok[w, oi]),
                )
            )
        decision = _decision(m, w, choice, free) if choice is not None else ""
        gw = tuple(
            GroupOnWorker(
                group=g.name,
                agents=int(c[gi]),
                context=g.context,
                blocks_per_agent=int(m.private[gi]),
                shared_blocks=int(m.shared[gi]),
                sliding_blocks_per_agent=int(m.sliding[gi]),
            )
            for gi, g in enumerate(m.groups)
            if c[gi]
        )
        bpt, sliding_bpt = geom.class_bytes_per_token(pair)
        sliding = int(c @ m.sliding)
        stream = geom.stream_bytes(max(n, 1))
        if sliding_bpt and bpt:  # sliding layers read at most their window: the rest is the global layers'
            crossover = max(0.0, stream - max(n, 1) * sliding_bpt * geom.sliding_window) / bpt
        else:
            crossover = stream / geom.kv_bytes_per_token(pair)
        reserved = int(c @ m.context.astype(np.int64))
        step = n / tps if n and tps > 0 else 0.0
        workers.append(
            WorkerPlan(
                worker=d.name,
                device=d.device,
                backend=d.backend,
                source=d.calibration.source,
                kv_k=pair[0],
                kv_v=pair[1],
                groups=gw,
                agents=n,
                block_bytes=bpt * bt,
                kv_blocks=int(c @ m.private + m.shared[present].sum()),
                kv_bytes=int(kv[pi]),
                sliding_block_bytes=sliding_bpt * bt,
                sliding_blocks=sliding,
                weight_bytes=geom.resident_bytes,
                scratch_bytes=scratch,
                usable_bytes=d.usable_bytes,
                crossover_context=crossover,
                crossover_per_agent=crossover / n if n else crossover,
                reserved_context=reserved,
                step_seconds=step,
                tokens_per_s=tps if n else 0.0,
                agent_tokens_per_s=tps / n if n else 0.0,
                options=tuple(options),
                tokens_per_s_interval=m.interval(w, c, pi) if n else (0.0, 0.0),
                decision=decision,
            )
        )
    total = sum(w.tokens_per_s for w in workers)
    return Plan(
        model=geom.name,
        settings=m.settings,
        workers=tuple(workers),
        tokens_per_s=total,
        agents=int(counts.sum()),
        search=search,
        tokens_per_s_interval=(
            sum(w.tokens_per_s_interval[0] for w in workers),
            sum(w.tokens_per_s_interval[1] for w in workers),
        ),
    )


def _decision(m: _Model, w: int, c: _Choice, free: float) -> str:
    """Why worker w got its format, in words and numbers."""
    name = pair_name(m.pairs[c.pair])
    if c.forced:
        better = [
            f"{pair_name(p)}{' needs' if not n else ''} {_gb(c.kv[i])}"
            for n, (i, p) in enumerate(
                [
                    (i, p)
                    for i, p in sorted(enumerate(m.pairs), key=lambda ip: -c.kv[ip[0]])
                    if m.floor_ok[w, i] and c.qual[i] and not np.isnan(m.attn[w, i])
                ][-3:]  # the three narrowest that meet the floor
            )
        ]
        return (
            f"forced by memory: it is below the default quality floor ({m.floor}), but no format meeting it "
            f"fits: {' and '.join(better) or 'none is allowed'}; the worker has {_gb(free)} for KV."
        )
    lines = []
    if c.fastest != c.pair:
        f = pair_name(m.pairs[c.fastest])
        gain = c.tps[c.fastest] / c.tps[c.pair] - 1
        lines.append(
            f"{f} predicts {gain:.1%} more tokens/s, within the calibration's noise, so it is a tie and the "
            f"tie goes to the higher quality ({name})."
        )
    else:
        narrower = [
            i for i in np.flatnonzero(c.fits & c.qual & m.floor_ok[w]) if m.rank[i] > m.rank[c.pair] and c.tps[i] > 0
        ]
        if narrower:
            i = int(max(narrower, key=lambda i: m.rank[i]))
            gain = c.tps[c.pair] / c.tps[i] - 1
            lines.append(
                f"faster than the higher-quality {pair_name(m.pairs[i])} by {gain:.1%}, more than the "
                "calibration's noise."
            )
        else:
            lines.append("the fastest of the formats that fit, and no format of higher quality fits.")
    below = [
        pair_name(p)
        for i, p in enumerate(m.pairs)
        if not m.floor_ok[w, i] and c.fits[i] and c.qual[i] and c.tps[i] > c.tps[c.pair]
    ]
    if below and m.floor is not None:
        lines.append(
            f"Faster but below the default quality floor ({m.floor}), so not used while a format meeting it "
            f"fits: {', '.join(below)}."
        )
    return " ".join(lines)


def why_nothing_fits(m: _Model) -> str:
    """Says what would fit: fewer agents, shorter contexts, a narrower format, another device."""
    geom, bt = m.geom, m.settings.block_tokens
    n_agents = sum(g.count for g in m.groups)
    max_ctx = max(g.context for g in m.groups)
    # the narrowest format every group's quality floor accepts on some worker (else the narrowest allowed)
    accepted = m.qual_ok.all(axis=1).any(axis=0)
    narrow = (
        int(np.argmin(np.where(accepted, m.block_bytes, np.inf))) if accepted.any() else int(np.argmin(m.block_bytes))
    )
    narrow_name = pair_name(m.pairs[narrow])
    bpt = geom.kv_bytes_per_token(m.pairs[narrow])
    need = sum(g.count * geom.kv_bytes(g.context, m.pairs[narrow], m.settings) for g in m.groups)
    free = [max(0.0, m.free_bytes(w, 1, max_ctx)) for w in range(len(m.devices))]
    total_free = sum(free)
    lines = [
        f"the {n_agents} agents do not fit: with the narrowest allowed format ({narrow_name}, {bpt:,} bytes per "
        f"token) their reserved contexts need {_gb(need)} of KV; the workers have {_gb(total_free)} free after "
        f"weights ({_gb(geom.resident_bytes)} each) and scratch"
    ]
    per_agent = need / n_agents
    fit_agents = int(sum(f // per_agent for f in free)) if per_agent else 0
    if fit_agents < n_agents:
        lines.append(f"- fewer agents: about {fit_agents} of {n_agents} fit at the requested contexts")
    if total_free > 0 and total_free < need:
        share = total_free / n_agents / bpt
        lines.append(f"- shorter contexts: about {int(share // bt * bt):,} tokens per agent fit for all {n_agents}")
    biggest = max(free)
    one = geom.kv_bytes(max_ctx, m.pairs[narrow], m.settings)
    if one > biggest:
        lines.append(
            f"- one agent's {max_ctx:,}-token context needs {_gb(one)}, more than the largest worker's "
            f"{_gb(biggest)} free"
        )
    narrowest_any = min(all_pairs(), key=geom.kv_bytes_per_token)
    if narrowest_any not in m.pairs and geom.supports(narrowest_any):
        nb = geom.kv_bytes_per_token(narrowest_any)
        verdict = "would fit in total" if need / bpt * nb <= total_free else "would still not fit"
        lines.append(f"- a narrower format: allowing {pair_name(narrowest_any)} ({nb:,} bytes per token) {verdict}")
    if any(not m.qual_ok[:, gi, :].all() for gi in range(len(m.groups))):
        lines.append("- a looser quality floor: some groups' floors exclude formats that would fit")
    if need > total_free:
        lines.append(f"- add a device: {_gb(need - total_free)} more free memory is needed")
    return "\n".join(lines)
