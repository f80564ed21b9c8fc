"""Capacity planner: byte formulas, published figures, decisions and search quality.

Byte figures are written out by hand; the optimum is checked against a brute
force written here independently of the planner's own search.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.errors import NoFeasiblePlan
from swarm.planner import (
    AgentGroup,
    Calibration,
    DeviceProfile,
    EngineSettings,
    ModelGeometry,
    Policy,
    Quality,
    all_pairs,
    kv_row_bytes,
    pair_name,
    plan,
    scratch_bytes,
)


def geometry(layers: int, kv_heads: int, head_dim: int, weights: int, ctx: int = 131_072) -> ModelGeometry:
    heads = kv_heads * 4
    return ModelGeometry(
        "synthetic",
        layers,
        heads,
        kv_heads,
        head_dim,
        heads * head_dim,
        4 * heads * head_dim,
        32_000,
        ctx,
        weights,
        weights,
    )


SMOLLM = ModelGeometry("smollm2", 30, 9, 3, 64, 576, 1536, 49152, 8192, 96_436_224, 100_000_000)


def catalog(geom: ModelGeometry, name: str, usable: float, gbps: float) -> DeviceProfile:
    return DeviceProfile(name, name, "cpu", int(usable), Calibration.from_bandwidth(geom, gbps * 1e9, all_pairs()))


# -- byte formulas -----------------------------------------------------------------


def test_row_bytes_by_hand() -> None:
    assert kv_row_bytes("f32", 64) == 64 * 4
    assert kv_row_bytes("f16", 64) == 64 * 2
    assert kv_row_bytes("q8_0", 64) == 2 * (2 + 32)  # two blocks: f16 scale + 32 int8
    assert kv_row_bytes("q4_0", 64) == 2 * (2 + 16)  # two blocks: f16 scale + 16 bytes of nibbles
    assert kv_row_bytes("q8_head", 64) == 64 + 4  # int8 per value + one f32 scale
    with pytest.raises(ValueError, match="divisible by 32"):
        kv_row_bytes("q8_0", 48)


def test_row_bytes_match_the_engine() -> None:
    from worker import _native

    for fmt, hd in itertools.product(("f32", "f16", "q8_0", "q8_head", "q4_0"), (32, 64, 128)):
        assert kv_row_bytes(fmt, hd) == _native.kv_row_bytes(fmt, hd)


def test_published_52_layer_figures() -> None:
    # 52 layers with 256 K + 256 V values per layer per token (2 KV heads x head_dim 128).
    g = geometry(52, 2, 128, 0)
    f32 = g.kv_bytes_per_token(("f32", "f32")) * 131_072
    assert f32 == 52 * 512 * 4 * 131_072 == 13_958_643_712  # "about 14 GB (13.96e9)"
    q8 = g.kv_bytes_per_token(("q8_0", "q8_0")) * 131_072
    assert q8 == 52 * 512 // 32 * 34 * 131_072  # 34 bytes per 32 values
    assert 3.6e9 < q8 < 3.8e9  # "about 3.7 GB"


def test_published_28_layer_figures() -> None:
    g = geometry(28, 8, 128, 0)
    assert g.kv_bytes_per_token(("f16", "f16")) // 28 == 8 * 128 * 2 * 2 == 4096
    assert g.kv_bytes_per_token(("q8_head", "q8_head")) // 28 == 8 * (128 + 4) * 2 == 2112


def test_reserved_blocks_count_a_shared_prefix_once() -> None:
    dev = catalog(SMOLLM, "host", 64e9, 50)
    p = plan(SMOLLM, [dev], [AgentGroup("a", 3, 1000, shared_prefix_tokens=100)], Policy.allow(["f16"]))
    w = p.worker("host")
    # 1000 tokens -> ceil(1000/16) = 63 blocks per agent; 100 shared tokens -> 6 full blocks held once.
    assert w.kv_blocks == 6 + 3 * (63 - 6)
    assert w.kv_bytes == w.kv_blocks * 16 * 23_040
    assert w.crossover_context == pytest.approx(96_436_224 / 23_040)
    assert w.crossover_per_agent == pytest.approx(96_436_224 / 23_040 / 3)


# -- decisions the planner must reach ------------------------------------------------


def test_eight_agents_16k_on_a_16gb_card_get_a_quantized_cache() -> None:
    g = geometry(32, 8, 128, int(5.5e9))
    assert g.kv_bytes_per_token(("f16", "f16")) * 16_384 * 8 == pytest.approx(17.2e9, rel=0.01)
    assert g.kv_bytes_per_token(("q8_0", "q8_0")) * 16_384 * 8 == pytest.approx(9.1e9, rel=0.01)
    card = catalog(g, "card", 15.5e9, 640 * 0.8)  # 16 GB card; about 10 GB left after 5.5 GB of weights
    w = plan(g, [card], [AgentGroup("agents", 8, 16_384)]).worker("card")
    assert w.kv_k in ("q8_0", "q8_head", "q4_0") or w.kv_v in ("q8_0", "q8_head", "q4_0")
    assert w.memory_bytes <= card.usable_bytes
    verdicts = {o.format: o.verdict for o in w.options}
    assert verdicts["f16"].startswith("over memory")
    # f16 runs out near 9.5k tokens per agent: free / (8 agents x 131,072 bytes per token).
    free = card.usable_bytes - g.resident_bytes - w.scratch_bytes
    limit = free / (8 * 131_072)
    assert 9_300 < limit < 9_700
    f16_only = Policy.allow(["f16"])
    plan(g, [card], [AgentGroup("agents", 8, int(limit) - 64)], f16_only)
    with pytest.raises(NoFeasiblePlan, match="fewer agents|shorter contexts"):
        plan(g, [card], [AgentGroup("agents", 8, int(limit) + 64)], f16_only)


def test_one_short_agent_gets_an_unquantized_cache_when_q8_is_slower() -> None:
    f16_ns = 100.0
    cost = {"f32": 1.1, "f16": 1.0, "q8_0": 1.2, "q8_head": 1.25, "q4_0": 1.3}  # per position, relative to f16
    cal = Calibration("measured", (0.01,), {pair_name(p): f16_ns * (cost[p[0]] + cost[p[1]]) / 2 for p in all_pairs()})
    host = DeviceProfile("host", "x86-host", "cpu", 64 * 2**30, cal)
    w = plan(SMOLLM, [host], [AgentGroup("a", 1, 257)]).worker("host")
    assert (w.kv_k, w.kv_v) == ("f16", "f16")


def test_quality_floor_excludes_formats() -> None:
    quality = {pair_name(p): Quality(0.1 if "q4_0" in p else 1e-4, 0.9) for p in all_pairs()}
    dev = catalog(SMOLLM, "d", 0.5e9, 30)
    loose = plan(SMOLLM, [dev], [AgentGroup("a", 4, 4096)], quality=quality).worker("d")
    strict = plan(SMOLLM, [dev], [AgentGroup("a", 4, 4096, max_kl=0.01)], quality=quality).worker("d")
    assert "q4_0" in (loose.kv_k, loose.kv_v)  # bytes-only costs favour the narrowest format
    assert "q4_0" not in (strict.kv_k, strict.kv_v)
    assert any("quality floor" in o.verdict for o in strict.options)


def test_nothing_fits_says_what_would() -> None:
    dev = catalog(SMOLLM, "small", 0.3e9, 30)
    with pytest.raises(NoFeasiblePlan) as e:
        plan(SMOLLM, [dev], [AgentGroup("a", 40, 8192)], Policy.allow(["f16"]))
    msg = str(e.value)
    for fix in ("fewer agents", "shorter contexts", "narrower format", "add a device"):
        assert fix in msg


def test_bad_input_names_the_fix() -> None:
    dev = catalog(SMOLLM, "d", 1e9, 30)
    with pytest.raises(ValueError, match="model's maximum"):
        plan(SMOLLM, [dev], [AgentGroup("a", 1, 9000)])
    with pytest.raises(ValueError, match="no agents"):
        plan(SMOLLM, [dev], [AgentGroup("a", 0, 100)])
    with pytest.raises(ValueError, match="unique"):
        plan(SMOLLM, [dev, dev], [AgentGroup("a", 1, 100)])


def test_plan_is_a_printable_serialisable_value() -> None:
    devs = [catalog(SMOLLM, "a", 0.4e9, 30), catalog(SMOLLM, "b", 2e9, 90)]
    p = plan(SMOLLM, devs, [AgentGroup("g", 5, 4096, shared_prefix_tokens=64)])
    assert p == plan(SMOLLM, devs, [AgentGroup("g", 5, 4096, shared_prefix_tokens=64)])
    import json

    d = json.loads(p.to_json())
    assert sum(w["agents"] for w in d["workers"]) == 5
    text = str(p) + p.explain()
    assert "crossover" in text and "predicted from catalog" in text
    for w in p.workers:
        assert w.format in text


# -- search quality and properties ---------------------------------------------------------

_BASE_NS = {"f32": 150.0, "f16": 103.0, "q8_0": 50.0, "q8_head": 86.0, "q4_0": 67.0}


@st.composite
def instances(draw, max_agents: int = 6, max_workers: int = 3):  # type: ignore[no-untyped-def]
    n_dev = draw(st.integers(1, max_workers))
    devs = []
    for i in range(n_dev):
        speed = draw(st.floats(0.3, 3.0))
        w0 = draw(st.floats(0.003, 0.02))
        twist = {f: draw(st.floats(0.7, 1.4)) for f in _BASE_NS}  # the measured cost need not follow bytes
        cal = Calibration(
            "measured",
            tuple(w0 * (1 + 0.05 * b) for b in range(16)),
            {
                pair_name(p): speed * (_BASE_NS[p[0]] * twist[p[0]] + _BASE_NS[p[1]] * twist[p[1]]) / 2
                for p in all_pairs()
            },
        )
        devs.append(DeviceProfile(f"w{i}", "x", "cpu", int(draw(st.floats(0.15e9, 0.8e9))), cal))
    n_groups = draw(st.integers(1, 3))
    groups, total = [], 0
    for j in range(n_groups):
        count = draw(st.integers(1, max(1, max_agents - total - (n_groups - j - 1))))
        total += count
        groups.append(
            AgentGroup(
                f"g{j}",
                count,
                draw(st.sampled_from([64, 257, 1024, 2048, 4096, 8192])),
                shared_prefix_tokens=draw(st.sampled_from([0, 40])),
            )
        )
    return devs, groups


def _brute_force(geom: ModelGeometry, devs, groups, s: EngineSettings) -> float:  # type: ignore[no-untyped-def]
    """Every agent on every worker, every format on every worker; -inf if nothing fits."""
    agents = [g for g in groups for _ in range(g.count)]
    best = -math.inf
    bt = s.block_tokens
    for assign in itertools.product(range(len(devs)), repeat=len(agents)):
        total = 0.0
        for w, dev in enumerate(devs):
            mine = [a for a, where in zip(agents, assign, strict=True) if where == w]
            if not mine:
                continue
            present = {a.name: a for a in mine}
            shared = sum(min(a.shared_prefix_tokens, a.context - 1) // bt for a in present.values())
            blocks = sum(math.ceil(a.context / bt) - min(a.shared_prefix_tokens, a.context - 1) // bt for a in mine)
            blocks += shared
            room = (
                dev.usable_bytes - geom.resident_bytes - scratch_bytes(geom, s, len(mine), max(a.context for a in mine))
            )
            ctx = sum(a.context for a in mine)
            rates = [
                len(mine)
                / (
                    dev.calibration.weight_time(len(mine))
                    + dev.calibration.attn_ns[pair_name(p)] * 1e-9 * geom.n_layer * ctx
                )
                for p in all_pairs()
                if blocks * bt * geom.kv_bytes_per_token(p) <= room
            ]
            if not rates:
                total = -math.inf
                break
            total += max(rates)
        best = max(best, total)
    return best


@settings(max_examples=40, deadline=None)
@given(instances())
def test_small_plans_are_within_5_percent_of_brute_force(inst) -> None:  # type: ignore[no-untyped-def]
    devs, groups = inst
    best = _brute_force(SMOLLM, devs, groups, EngineSettings())
    if best == -math.inf:
        with pytest.raises(NoFeasiblePlan):
            plan(SMOLLM, devs, groups)
        return
    p = plan(SMOLLM, devs, groups)
    assert p.tokens_per_s >= 0.95 * best
    assert p.tokens_per_s <= best * (1 + 1e-9)  # a plan cannot beat the optimum
    h = plan(SMOLLM, devs, groups, search="greedy+local")  # the search used for large swarms
    assert h.tokens_per_s <= best * (1 + 1e-9)
    for w in h.workers:
        assert w.memory_bytes <= w.usable_bytes


@settings(max_examples=60, deadline=None)
@given(instances(), st.sampled_from(["auto", "greedy+local"]))
def test_never_over_memory(inst, search: str) -> None:  # type: ignore[no-untyped-def]
    devs, groups = inst
    try:
        p = plan(SMOLLM, devs, groups, search=search)
    except NoFeasiblePlan:
        return
    assert sum(w.agents for w in p.workers) == sum(g.count for g in groups)
    for w in p.workers:
        assert w.weight_bytes + w.scratch_bytes + w.kv_bytes == w.memory_bytes <= w.usable_bytes


@settings(max_examples=40, deadline=None)
@given(instances(), st.integers(0, 2), st.floats(1.0, 4.0))
def test_more_memory_never_lowers_throughput(inst, which: int, factor: float) -> None:  # type: ignore[no-untyped-def]
    devs, groups = inst
    which %= len(devs)
    bigger = list(devs)
    d = devs[which]
    bigger[which] = DeviceProfile(d.name, d.device, d.backend, int(d.usable_bytes * factor), d.calibration)
    try:
        before = plan(SMOLLM, devs, groups).tokens_per_s
    except NoFeasiblePlan:
        return
    assert plan(SMOLLM, bigger, groups).tokens_per_s >= before * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(instances(), st.data())
def test_a_subset_of_agents_never_needs_more(inst, data) -> None:  # type: ignore[no-untyped-def]
    devs, groups = inst
    try:
        full = plan(SMOLLM, devs, groups)
    except NoFeasiblePlan:
        return
    fewer = [AgentGroup(g.name, data.draw(st.integers(0, g.count)), g.context, g.shared_prefix_tokens) for g in groups]
    if sum(g.count for g in fewer) == 0:
        return
    sub = plan(SMOLLM, devs, fewer)  # must not raise
    for w in sub.workers:
        assert w.memory_bytes <= w.usable_bytes
    # Every worker can hold its part of the subset at least as cheaply as the full plan held its part.
    assert sum(w.agents for w in sub.workers) <= sum(w.agents for w in full.workers)


def test_large_swarm_uses_the_heuristic_and_places_everyone() -> None:
    devs = [catalog(SMOLLM, f"w{i}", (0.5 + i % 4) * 1e9, 20 + i % 7) for i in range(40)]
    groups = [AgentGroup(f"g{j}", 50, 512 * (1 + j)) for j in range(4)]
    p = plan(SMOLLM, devs, groups)
    assert p.search.startswith("greedy")
    assert sum(w.agents for w in p.workers) == 200
    for w in p.workers:
        assert w.memory_bytes <= w.usable_bytes
