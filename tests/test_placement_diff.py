"""placement.diff: what a plan changes about what runs now, as a value (no Ray, no engine)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.planner import GroupOnWorker, Plan, WorkerPlan
from swarm.runtime.placement import (
    AgentMove,
    AgentNow,
    Current,
    GroupKey,
    WorkerNow,
    apply_to,
    diff,
    kv_budget,
)
from worker.settings import EngineSettings

FORMATS = (("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "f16"))


def worker_plan(name: str, fmt: tuple[str, str], groups: list[tuple[GroupKey, int, int, int]], block: int = 64):
    """groups: (key, agents, blocks_per_agent, shared_blocks); kv_bytes is exactly the reserved blocks."""
    gs = tuple(GroupOnWorker(str(k), n, 256, bpa, shared) for k, n, bpa, shared in groups if n > 0)
    blocks = sum(g.agents * g.blocks_per_agent + g.shared_blocks for g in gs)
    return WorkerPlan(
        worker=name, device="d", backend="cpu", source="catalog", kv_k=fmt[0], kv_v=fmt[1], groups=gs,
        agents=sum(g.agents for g in gs), block_bytes=block, kv_blocks=blocks, kv_bytes=blocks * block,
        weight_bytes=1000, scratch_bytes=10, usable_bytes=1 << 30, crossover_context=0.0, crossover_per_agent=0.0,
        reserved_context=0, step_seconds=0.0, tokens_per_s=0.0, agent_tokens_per_s=0.0, options=(),
    )  # fmt: skip


def make_plan(workers: list[WorkerPlan]) -> Plan:
    return Plan("m", EngineSettings(), tuple(workers), 0.0, sum(w.agents for w in workers), "exact")


def running(wp: WorkerPlan, budget: int | None = None) -> WorkerNow:
    return WorkerNow(True, wp.kv_k, wp.kv_v, kv_budget(wp) if budget is None else budget)


A = GroupKey("a")
B = GroupKey("b", 512)


def test_group_key_is_the_planner_name():
    assert str(A) == "a" and str(B) == "b@512"
    assert GroupKey("b", 512) == B and len({B, GroupKey("b", 512)}) == 1


def test_nothing_to_change_is_empty():
    wp = worker_plan("w0", FORMATS[0], [(A, 2, 1, 1)])
    plan = make_plan([wp])
    first = diff(plan, Current({}, (AgentNow("a-0", A, None), AgentNow("a-1", A, None))))
    assert [s.worker for s in first.start] == ["w0"] and first.reserve == ("w0",)
    assert [m.dst for m in first.moves] == ["w0", "w0"]
    again = diff(plan, apply_to(Current({}, (AgentNow("a-0", A, None), AgentNow("a-1", A, None))), first))
    assert again.empty and not again and str(again) == "no change"
    assert "start w0 with KV f16" in str(first) and "reserve 192 bytes of KV on w0" in str(first)


def test_a_format_change_restarts_the_worker():
    old = worker_plan("w0", FORMATS[0], [(A, 2, 1, 0)])
    new = worker_plan("w0", FORMATS[1], [(A, 2, 1, 0)])
    agents = (AgentNow("a-0", A, "w0"), AgentNow("a-1", A, "w0"))
    change = diff(make_plan([new]), Current({"w0": running(old)}, agents))
    assert [(s.worker, s.reason) for s in change.stop] == [("w0", "w0 restarts with KV q8_0")]
    assert [s.worker for s in change.start] == ["w0"] and not change.resize
    assert change.moves == (AgentMove("a-0", "w0", "w0"), AgentMove("a-1", "w0", "w0"))  # re-prefilled there
    assert change.leaving == ()  # their sessions end with the worker


def test_a_budget_only_change_resizes_in_place():
    old = worker_plan("w0", FORMATS[2], [(A, 1, 2, 0)])
    new = worker_plan("w0", FORMATS[2], [(A, 2, 2, 0)])
    agents = (AgentNow("a-0", A, "w0"), AgentNow("a-1", A, None))
    change = diff(make_plan([new]), Current({"w0": running(old)}, agents))
    assert not change.stop and not change.start
    assert [(r.worker, r.kv_budget_bytes, r.agents) for r in change.resize] == [("w0", 256, ("a-0", "a-1"))]
    assert change.moves == (AgentMove("a-1", None, "w0"),)
    steps = change.steps()
    assert steps.index(next(s for s in steps if s.startswith("resize"))) < steps.index("place a-1 on w0")


def test_a_lost_workers_agents_move_and_leave_before_budgets_shrink():
    w0 = worker_plan("w0", FORMATS[0], [(A, 1, 1, 0)])
    w1 = worker_plan("w1", FORMATS[0], [(A, 1, 1, 0)])
    after = worker_plan("w0", FORMATS[0], [(A, 2, 1, 0), (B, 1, 1, 0)])
    agents = (AgentNow("a-0", A, "w0"), AgentNow("a-1", A, None), AgentNow("b-0", B, "w1"))
    current = Current({"w0": running(w0), "w1": running(w1)}, agents)  # a-1 was on a w1 that died and came back
    change = diff(make_plan([after]), current)
    assert [s.worker for s in change.stop] == ["w1"]
    assert change.assignment == {"a-0": "w0", "a-1": "w0", "b-0": "w0"}
    assert AgentMove("a-0", "w0", "w0") not in change.moves  # it stays
    assert set(change.moves) == {AgentMove("a-1", None, "w0"), AgentMove("b-0", "w1", "w0")}
    shrink = diff(make_plan([w0]), Current({"w0": running(after)}, agents[:1] + (AgentNow("b-0", B, "w0"),)))
    steps = shrink.steps()
    assert steps.index("leave b-0 from w0") < steps.index(next(s for s in steps if s.startswith("resize")))


@st.composite
def cases(draw):
    keys = [GroupKey("a"), GroupKey("b", 512), GroupKey("c")][: draw(st.integers(1, 3))]
    names = [f"w{i}" for i in range(draw(st.integers(1, 3)))]
    wps = []
    for w in names:
        groups = [(k, draw(st.integers(0, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 2))) for k in keys]
        wps.append(worker_plan(w, draw(st.sampled_from(FORMATS)), groups, draw(st.sampled_from([64, 128]))))
    plan = make_plan(wps)
    total = Counter()
    for wp in wps:
        for g in wp.groups:
            total[g.group] += g.agents
    places = [*names, "gone", None]
    agents = tuple(
        AgentNow(f"{k.name}-{i}", k, draw(st.sampled_from(places))) for k in keys for i in range(total[str(k)])
    )
    workers = {}
    for w in [*names, "gone"]:
        if draw(st.booleans()):
            fmt = draw(st.sampled_from(FORMATS))
            workers[w] = WorkerNow(draw(st.booleans()), fmt[0], fmt[1], draw(st.sampled_from([0, 64, 256, 1024])))
    return plan, Current(workers, draw(st.permutations(agents)))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_diff_properties(case):
    plan, current = case
    change = diff(plan, current)
    # it never reserves past a worker's budget
    for w, res in change.reservations.items():
        assert sum(r.kv_bytes for r in res) <= kv_budget(plan.worker(w))
    # it keeps an agent where it is when the plan allows: per group and worker, min(there now, planned) stay
    for wp in plan.workers:
        for g in wp.groups:
            here = [a for a in current.agents if str(a.group) == g.group and a.worker == wp.worker]
            stay = [a for a in here if change.assignment[a.name] == wp.worker]
            assert len(stay) == min(len(here), g.agents)
    # every agent is placed where the plan has room for its group
    for wp in plan.workers:
        for g in wp.groups:
            assert (
                sum(1 for a in current.agents if str(a.group) == g.group and change.assignment[a.name] == wp.worker)
                == g.agents
            )
    # applying it and diffing again changes nothing
    after = apply_to(current, change)
    assert diff(plan, after).empty, str(diff(plan, after))
