"""Scale: 2,000 agents over 20 virtual workers launch through the API, each has its turn, and the swarm stops.

The full size of the issue runs here (about a minute and a half on 2 cores);
the timings are bench/scale.py's to report (docs/BENCHMARKS.md), never
asserted. What is asserted: every agent had exactly its one turn and made
tokens, the placement lists every agent once over every worker, and the stop
leaves no worker behind.
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

pytest.importorskip("ray")

from swarm import scheduler  # noqa: E402

AGENTS, WORKERS, MAX_NEW = 2000, 20, 2
BENCH = Path(__file__).resolve().parent.parent / "bench" / "scale.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_2000_agents_over_20_virtual_workers_each_get_their_turn(tmp_path: Path) -> None:
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    try:
        r = _bench().run_scale(AGENTS, WORKERS, max_new=MAX_NEW, placement_calls=3, out_root=tmp_path,
                               timeout_s=900, conn=conn, say=lambda m: None)  # fmt: skip
        assert scheduler.placement(f"scale{AGENTS}")["workers"] == {}  # stopped: no worker actor is left
    finally:
        scheduler.disconnect(conn)
    assert r["state"] == "stopped" and r["stopped_state"] == "stopped"
    turns = r["turns"]  # {agent: (tasks done, tokens generated, transcript records)}
    assert sorted(turns) == sorted(f"a-{i}" for i in range(AGENTS))
    wrong = {a: t for a, t in turns.items() if t[0] != 1 or t[2] != 1 or not 1 <= t[1] <= MAX_NEW}
    assert not wrong, f"{len(wrong)} agents without exactly one turn, e.g. {list(wrong.items())[:5]}"
    assert r["tokens_generated"] == sum(t[1] for t in turns.values())
    placed = Counter(r["placement_agents"])
    assert set(placed) == set(turns) and max(placed.values()) == 1  # every agent, once
    assert r["placement_workers"] == WORKERS
    assert r["get_placement_idle_ms"]["calls"] == 3
