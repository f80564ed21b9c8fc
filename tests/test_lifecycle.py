"""The session lifecycle policy (worker/lifecycle.py) with explicit numbers: every expected decision is
computed by hand in the test, never taken from a live calibration."""

from __future__ import annotations

import pytest

from worker import lifecycle
from worker.lifecycle import (
    DEFAULT_PAUSE_S,
    IdleSession,
    OpCost,
    ParkCosts,
    PauseModel,
    choose_resume,
    group_of,
    keep_value,
    plan_evictions,
    recreate_options,
)

# ns: RAM is cheap, disk has a large fixed cost, re-prefill is 0.1 ms per token.
COSTS = ParkCosts(
    park_ram=OpCost(1e5, 100),
    restore_ram=OpCost(1e5, 200),
    park_disk=OpCost(1e6, 1000),
    restore_disk=OpCost(2e6, 2000),
    reprefill=OpCost(0, 1e5),
)
ROOMY = {"ram": 1 << 30, "disk": 1 << 30}


def test_group_of() -> None:
    assert group_of("researcher-3") == "researcher"
    assert group_of("researcher[3]") == "researcher"
    assert group_of("web-search-12") == "web-search"
    assert group_of("critic") == "critic"
    assert group_of("-3") == "-3"  # no name before the index: the whole name


def test_pause_model_pools_the_group_until_the_agent_has_its_own() -> None:
    m = PauseModel()
    assert m.expected_remaining("researcher-0") == DEFAULT_PAUSE_S  # nothing seen: the prior
    assert m.expected_remaining("researcher-0", 0.5) == DEFAULT_PAUSE_S - 0.5
    m.observe("researcher-0", 1.0)
    m.observe("researcher-0", 3.0)
    m.observe("researcher-1", 5.0)
    # two own pauses (< MIN_OWN_PAUSES = 3): pooled with the group's others: (1 + 3 + 5) / 3
    assert m.expected_remaining("researcher-0") == pytest.approx(3.0)
    # idle 2 s already: the pauses longer than 2 are 3 and 5, remaining (1 + 3) / 2
    assert m.expected_remaining("researcher-0", 2.0) == pytest.approx(2.0)
    # idle longer than any pause seen: expected to stay away as long again
    assert m.expected_remaining("researcher-0", 6.0) == pytest.approx(6.0)
    m.observe("researcher-0", 2.0)
    # three own pauses: its own only, (1 + 3 + 2) / 3
    assert m.expected_remaining("researcher-0") == pytest.approx(2.0)
    # a new agent of the group: the group's (1 + 3 + 5 + 2) / 4
    assert m.expected_remaining("researcher-7") == pytest.approx(2.75)
    assert m.expected_remaining("critic-0") == DEFAULT_PAUSE_S  # another group: the prior
    with pytest.raises(ValueError, match="must be >= 0"):
        m.observe("critic-0", -1.0)


def test_costs_and_recreate_options() -> None:
    # 100 tokens: ram 1.1e5 + 1.2e5 = 2.3e5; disk 1.1e6 + 2.2e6 = 3.3e6; re-prefill 1e7
    s = IdleSession("a", tokens=100, pool_bytes=10**6, park_bytes=50_000, idle_s=0.0)
    assert recreate_options(s, COSTS, ROOMY) == [(2.3e5, "ram"), (3.3e6, "disk"), (1e7, "none")]
    assert recreate_options(s, COSTS, {"ram": 49_999, "disk": 0}) == [(1e7, "none")]  # fits no tier
    # 10 tokens: disk 1.01e6 + 2.02e6 = 3.03e6 costs more than re-prefilling 1e6
    short = IdleSession("b", tokens=10, pool_bytes=10**5, park_bytes=5_000, idle_s=0.0)
    assert recreate_options(short, COSTS, {"ram": 0, "disk": 1 << 30}) == [(1e6, "none"), (3.03e6, "disk")]
    assert ParkCosts.from_dict(COSTS.to_dict()) == COSTS
    with pytest.raises(ValueError, match="reprefill"):
        ParkCosts.from_dict({k: v for k, v in COSTS.to_dict().items() if k != "reprefill"})


def test_evicts_the_session_of_least_value_first() -> None:
    m = PauseModel()
    for _ in range(3):
        m.observe("coder-0", 0.5)  # back in 0.5 s
        m.observe("coder-1", 8.0)  # a long tool call
    a = IdleSession("coder-0", tokens=100, pool_bytes=10**6, park_bytes=50_000, idle_s=0.0)
    b = IdleSession("coder-1", tokens=100, pool_bytes=10**6, park_bytes=50_000, idle_s=0.0)
    # value = cheapest recreate ns / (pool bytes * remaining s): a 2.3e5 / (1e6 * 0.5) = 0.46, b 2.3e5 / 8e6
    assert keep_value(a, COSTS, m, ROOMY) == pytest.approx(0.46)
    assert keep_value(b, COSTS, m, ROOMY) == pytest.approx(0.02875)
    out = plan_evictions([a, b], 1, policy="measured", costs=COSTS, pauses=m, room=ROOMY)
    assert [(d.session, d.action, d.where) for d in out] == [("coder-1", "park", "ram")]
    assert "8.00 s" in out[0].reason and "0.2 ms via ram" in out[0].reason
    out = plan_evictions([a, b], 1_500_000, policy="measured", costs=COSTS, pauses=m, room=ROOMY)
    assert [d.session for d in out] == ["coder-1", "coder-0"]
    # RAM holds one snapshot only: the second goes to disk (3.3e6 < re-prefill 1e7)
    out = plan_evictions([a, b], 2 * 10**6, policy="measured", costs=COSTS, pauses=m,
                         room={"ram": 60_000, "disk": 1 << 30})  # fmt: skip
    assert [(d.session, d.where) for d in out] == [("coder-1", "ram"), ("coder-0", "disk")]
    # no room anywhere: both dropped
    out = plan_evictions([a, b], 2 * 10**6, policy="measured", costs=COSTS, pauses=m, room={"ram": 0, "disk": 0})
    assert [(d.session, d.action) for d in out] == [("coder-1", "drop"), ("coder-0", "drop")]


def test_short_history_is_dropped_rather_than_written_to_disk() -> None:
    s = IdleSession("w-0", tokens=10, pool_bytes=10**5, park_bytes=5_000, idle_s=0.0)
    out = plan_evictions([s], 1, policy="measured", costs=COSTS, pauses=PauseModel(), room={"ram": 0, "disk": 1 << 30})
    assert [(d.action, d.where) for d in out] == [("drop", "none")]  # re-prefill 1.0 ms < disk 3.0 ms


def test_drop_policy_takes_the_longest_idle_first() -> None:
    a = IdleSession("x-0", tokens=100, pool_bytes=10**6, park_bytes=1, idle_s=3.0)
    b = IdleSession("x-1", tokens=100, pool_bytes=10**6, park_bytes=1, idle_s=1.0)
    out = plan_evictions([b, a], 1, policy="drop", costs=COSTS, pauses=PauseModel(), room=ROOMY)
    assert [(d.session, d.action, d.where) for d in out] == [("x-0", "drop", "none")]
    out = plan_evictions([b, a], 10**7, policy="drop", costs=COSTS, pauses=PauseModel(), room=ROOMY)
    assert [d.session for d in out] == ["x-0", "x-1"]  # all of them when the need is larger
    with pytest.raises(ValueError, match="measured"):
        plan_evictions([a], 1, policy="lru", costs=COSTS, pauses=PauseModel(), room=ROOMY)


def test_measured_policy_without_costs_drops() -> None:
    a = IdleSession("x-0", tokens=100, pool_bytes=10**6, park_bytes=1, idle_s=3.0)
    out = plan_evictions([a], 1, policy="measured", costs=None, pauses=PauseModel(), room=ROOMY)
    assert out[0].action == "drop" and "no park costs" in out[0].reason


def test_resume_takes_the_measured_crossover() -> None:
    # restore from disk 2e6 + 2000 n vs re-prefill 1e5 n: they cross at n = 2e6 / 98000 = 20.4 tokens
    assert choose_resume("s", "disk", 20, COSTS).action == "reprefill"  # 2.04e6 > 2.0e6
    assert choose_resume("s", "disk", 21, COSTS).action == "restore"  # 2.042e6 < 2.1e6
    # from RAM: 1e5 + 200 n vs 1e5 n: restore from n = 2 (1.004e5 < 2e5); n = 1: 1.002e5 > 1e5
    assert choose_resume("s", "ram", 1, COSTS).action == "reprefill"
    assert choose_resume("s", "ram", 2, COSTS).action == "restore"
    d = choose_resume("s", "disk", 100, COSTS)
    assert (d.action, d.where) == ("restore", "disk") and "2.2 ms <= re-prefill 10.0 ms" in d.reason
    assert choose_resume("s", "ram", 5, None).action == "restore"
    with pytest.raises(ValueError, match="parked session"):
        choose_resume("s", "pool", 5, COSTS)


def test_counts_every_state() -> None:
    assert lifecycle.counts(["idle", "idle", "parked"]) == {"active": 0, "idle": 2, "parked": 1, "dropped": 0}
