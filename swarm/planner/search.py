"""The search: which agents go on which worker (exhaustive when small, else greedy + local search)."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from swarm.errors import NoFeasiblePlan
from swarm.planner.build import build_plan, why_nothing_fits
from swarm.planner.calibration import DeviceProfile, Quality
from swarm.planner.evaluate import _Model
from swarm.planner.geometry import ModelGeometry
from swarm.planner.parked import ParkedAgent, parked_by_worker, resident_groups
from swarm.planner.request import AgentGroup, Policy
from swarm.planner.result import Plan
from worker.formats import KV_FORMATS
from worker.settings import EngineSettings

# Exhaustive search when the number of distinct assignments is at most this.
_EXACT_STATES = 4000
# Local search (moves and swaps between every pair of workers, for every pair of groups) when
# workers^2 x groups^2 is at most this; beyond it one sweep would cost seconds in Python.
_LOCAL_SEARCH_WORK = 40_000


def _total(m: _Model, counts: np.ndarray) -> float:
    return sum(m.value(w, counts[w])[0] for w in range(len(m.devices)))


def _greedy(m: _Model, counts: np.ndarray, order: Sequence[int]) -> bool:
    """Places every agent, group by group in `order`, where it adds the most tokens/s. False if one does not fit."""
    n_dev = len(m.devices)
    for g in order:
        left = m.groups[g].count - int(counts[:, g].sum())
        heap: list[tuple[float, int]] = []
        for w in range(n_dev):
            gain = _gain(m, counts, w, g)
            if gain is not None:
                heap.append((-gain, w))
        heapq.heapify(heap)
        while left > 0:
            if not heap:
                return False
            _, w = heapq.heappop(heap)
            counts[w, g] += 1
            left -= 1
            gain = _gain(m, counts, w, g)
            if gain is not None:
                heapq.heappush(heap, (-gain, w))
    return True


def _gain(m: _Model, counts: np.ndarray, w: int, g: int) -> float | None:
    before = m.value(w, counts[w])[0]
    counts[w, g] += 1
    after = m.value(w, counts[w])[0]
    counts[w, g] -= 1
    return None if after == -math.inf else after - before


def _first_fit(m: _Model, counts: np.ndarray) -> bool:
    """Feasibility fallback: largest agents first onto the worker with the most free room."""
    order = sorted(range(len(m.groups)), key=lambda g: (-m.groups[g].context, g))
    for g in order:
        for _ in range(m.groups[g].count - int(counts[:, g].sum())):
            best, best_w = -math.inf, -1
            for w in range(len(m.devices)):
                counts[w, g] += 1
                if m.value(w, counts[w])[0] > -math.inf:
                    c = counts[w]
                    kv, fits, _, _ = m.options(w, c)
                    room = m.free_bytes(w, int(c.sum()), int(m.context[c > 0].max())) - kv[fits].min()
                    if room > best:
                        best, best_w = room, w
                counts[w, g] -= 1
            if best_w < 0:
                return False
            counts[best_w, g] += 1
    return True


def _local_search(m: _Model, counts: np.ndarray, max_sweeps: int = 50) -> None:
    """Moves one or two agents of a group between two workers, alone or against one or two agents of
    another group coming back, while the total improves."""
    n_dev, n_grp = counts.shape
    vals = [m.value(w, counts[w])[0] for w in range(n_dev)]
    for _ in range(max_sweeps):
        improved = False
        for a, b in itertools.permutations(range(n_dev), 2):
            for g in range(n_grp):
                for k in (1, 2):
                    if counts[a, g] < k:
                        break
                    counts[a, g] -= k
                    counts[b, g] += k
                    if _keep_if_better(m, counts, vals, a, b, vals[a] + vals[b]):
                        improved = True
                        break
                    if _swap_back(m, counts, vals, a, b, g):
                        improved = True
                        break
                    counts[a, g] += k
                    counts[b, g] -= k
        if not improved:
            return


def _heuristic(m: _Model, shape: tuple[int, int], local: bool) -> tuple[np.ndarray | None, str]:
    """Greedy placement from a few group orders (largest contexts first, smallest first, largest groups
    first), each improved by local search when `local`; the best result wins."""
    ctx = [g.context for g in m.groups]
    orders = [sorted(range(shape[1]), key=lambda g: (-ctx[g], g))]
    if local:
        orders.append(sorted(range(shape[1]), key=lambda g: (ctx[g], g)))
        orders.append(sorted(range(shape[1]), key=lambda g: (-m.groups[g].count * ctx[g], g)))
    best, best_v = None, -math.inf
    for order in dict.fromkeys(tuple(o) for o in orders):
        counts = np.zeros(shape, dtype=np.int64)
        if not _greedy(m, counts, order):
            counts = np.zeros(shape, dtype=np.int64)
            if not _first_fit(m, counts):
                continue
        if local:
            _local_search(m, counts)
        v = _total(m, counts)
        if v > best_v:
            best, best_v = counts, v
    return best, "greedy+local" if local else "greedy"


def _keep_if_better(m: _Model, counts: np.ndarray, vals: list[float], a: int, b: int, before: float) -> bool:
    """True (and vals updated) when workers a and b together now beat `before` by more than rounding."""
    va, vb = m.value(a, counts[a])[0], m.value(b, counts[b])[0]
    if va + vb > before + 1e-9 * abs(before):
        vals[a], vals[b] = va, vb
        return True
    return False


def _swap_back(m: _Model, counts: np.ndarray, vals: list[float], a: int, b: int, g: int) -> bool:
    """After one agent of g moved a -> b: moves one or two agents of another group b -> a if that
    makes the pair of workers better than before the move (keeps the change and returns True)."""
    before = vals[a] + vals[b]
    for h in range(counts.shape[1]):
        if h == g:
            continue
        for k in (1, 2):
            if counts[b, h] < k:
                break
            counts[b, h] -= k
            counts[a, h] += k
            if _keep_if_better(m, counts, vals, a, b, before):
                return True
            counts[b, h] += k
            counts[a, h] -= k
    return False


def _compositions(n: int, k: int) -> Iterable[tuple[int, ...]]:
    """Every way to split n identical agents over k workers."""
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        prev, out = -1, []
        for b in bars:
            out.append(b - prev - 1)
            prev = b
        out.append(n + k - 1 - prev - 1)
        yield tuple(out)


def _n_states(groups: Sequence[AgentGroup], n_dev: int) -> int:
    total = 1
    for g in groups:
        total *= math.comb(g.count + n_dev - 1, n_dev - 1)
        if total > _EXACT_STATES:
            break
    return total


def _exhaustive(m: _Model, shape: tuple[int, int]) -> np.ndarray | None:
    n_dev, n_grp = shape
    best, best_counts = -math.inf, None
    splits = [list(_compositions(g.count, n_dev)) for g in m.groups]
    for choice in itertools.product(*splits):
        counts = np.array(choice, dtype=np.int64).T.reshape(n_dev, n_grp)
        v = _total(m, counts)
        if v > best:
            best, best_counts = v, counts.copy()
    return best_counts


def plan(
    geom: ModelGeometry,
    devices: Sequence[DeviceProfile],
    groups: Sequence[AgentGroup],
    policy: Policy | None = None,
    *,
    settings: EngineSettings | None = None,
    quality: dict[str, Quality] | None = None,
    search: str = "auto",
    parked: Sequence[ParkedAgent] = (),
) -> Plan:
    """Assigns every agent to a worker and a (K, V) format to every worker.

    search: "auto" (exhaustive when small, else greedy + local search),
    "exact", "greedy" (greedy placement only) or "greedy+local".
    parked: agents (counted in `groups`) whose KV is parked in host RAM or on disk: they take no KV
    reservation, and the plan reports their host bytes per worker (swarm/planner/parked.py).
    Raises NoFeasiblePlan, saying what would fit, when the agents cannot all be placed.
    """
    policy = policy or Policy()
    settings = settings or EngineSettings()
    if parked:
        groups = resident_groups(groups, parked)
    _validate(geom, devices, groups, policy, settings, search)
    m = _Model(geom, devices, groups, policy, settings, quality or {})
    shape = (len(devices), len(groups))
    counts: np.ndarray | None
    if search == "exact" or (search == "auto" and _n_states(groups, len(devices)) <= _EXACT_STATES):
        counts, used = _exhaustive(m, shape), "exact"
        if counts is not None and _total(m, counts) == -math.inf:
            counts = None
    else:
        counts, used = _heuristic(
            m, shape, local=search != "greedy" and (len(devices) * len(groups)) ** 2 <= _LOCAL_SEARCH_WORK
        )
    if counts is None:
        raise NoFeasiblePlan(why_nothing_fits(m))
    out = build_plan(m, counts, used)
    return dataclasses.replace(out, parked=parked_by_worker(geom, parked)) if parked else out


def _validate(
    geom: ModelGeometry,
    devices: Sequence[DeviceProfile],
    groups: Sequence[AgentGroup],
    policy: Policy,
    settings: EngineSettings,
    search: str,
) -> None:
    if search not in ("auto", "exact", "greedy", "greedy+local"):
        raise ValueError(f"search '{search}' is unknown. To fix: use auto, exact, greedy or greedy+local")
    if policy.objective != "throughput":
        raise ValueError(f"policy.objective '{policy.objective}' is unknown. To fix: use 'throughput'")
    if not devices:
        raise NoFeasiblePlan("no workers to plan for. To fix: add at least one worker")
    if len({d.name for d in devices}) != len(devices):
        raise ValueError("worker names repeat. To fix: give every worker a unique name")
    if not groups or sum(g.count for g in groups) == 0:
        raise ValueError("no agents to place. To fix: give an agent group a count of at least 1")
    for f in policy.formats:
        if f[0] not in KV_FORMATS or f[1] not in KV_FORMATS:
            raise ValueError(f"policy format {f} is unknown. To fix: use formats from {', '.join(KV_FORMATS)}")
    if settings.block_tokens < 1 or settings.max_batch_tokens < 1 or settings.threads < 1:
        raise ValueError("engine settings must be positive")
    for g in groups:
        if g.count < 0:
            raise ValueError(f"group {g.name}: count {g.count} is negative")
        if not 1 <= g.context <= geom.n_ctx:
            raise ValueError(
                f"group {g.name}: context {g.context:,} is outside 1..{geom.n_ctx:,}, the model's maximum. "
                "To fix: lower the context or use a model with a longer context"
            )
        if not 0 <= g.shared_prefix_tokens <= g.context:
            raise ValueError(f"group {g.name}: shared_prefix_tokens must be between 0 and its context")
