"""`swarm launch` end to end on a local Ray (the README's main command), and its input checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from swarm.config import load_config
from swarm.errors import ConfigError
from swarm.launch import check_launchable, rebuild_history
from swarm.scheduler import compact_names, expand_names

ROOT = Path(__file__).resolve().parent.parent


def _ray_pids() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10).stdout
    return {int(ln.split()[0]) for ln in out.splitlines()[1:] if "raylet" in ln or "gcs_server" in ln}


def test_demo_swarm_runs_and_stops_everything_it_started(tmp_path: Path) -> None:
    # The demo as shipped, but its local worker plans with a recorded calibration (a fixture file),
    # not a live one: the formats asserted below are a decision, and a decision is never taken from
    # this machine's speed in a test.
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    assert demo["workers"][0]["kind"] == "local"
    demo["workers"][0]["calibration_file"] = str(ROOT / "tests" / "fixtures" / "calibration_smollm2.json")
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(demo))
    before = _ray_pids()
    r = subprocess.run(
        [sys.executable, "-m", "swarm.cli", "launch", str(config), "--no-live",
         "--out", str(tmp_path), "--timeout", "900"],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "dashboard: http://127.0.0.1:" in r.stdout
    cfg = load_config(config)
    summary = json.loads((tmp_path / "summary.json").read_text())
    expected = {f"{g.name}-{i}": max(len(g.tasks), 1) for g in cfg.agents for i in range(g.count)}
    assert {n: a["turns"] for n, a in summary["agents"].items()} == expected
    assert all(a["finish"] == "done" for a in summary["agents"].values())
    # The planner gave the workers different KV formats (the point of the demo's memory caps): with the
    # fixture's costs q8_0 is 2x cheaper per position than f16 (50 vs 103 ns, +-5%) and meets the
    # quality floor, so the roomy local worker takes it; q4_0 is below the floor (KL 0.12), so only the
    # capped boards, where nothing better fits, get it.
    formats = {w["worker"]: (w["kv_k"], w["kv_v"]) for w in summary["initial_plan"]["workers"] if w["agents"]}
    assert formats == {"local": ("q8_0", "q8_0"), "board": ("q4_0", "q4_0"), "tiny": ("q4_0", "q4_0")}, formats
    assert next(w for w in summary["initial_plan"]["workers"] if w["worker"] == "tiny")["decision"].startswith(
        "forced by memory"
    )
    for name in expected:
        lines = (tmp_path / "agents" / f"{name}.jsonl").read_text().splitlines()
        records = [json.loads(ln) for ln in lines]
        replies = [r for r in records if r["role"] == "assistant"]
        assert len(replies) == expected[name]
        for rep in replies:
            assert rep["worker"] in formats
            assert 0 < rep["tokens"] == len(rep["token_ids"])
            assert rep["kv_format"] in {k if k == v else f"{k}/{v}" for k, v in formats.values()}
        assert len(rebuild_history(tmp_path / "agents" / f"{name}.jsonl")) == replies[-1]["history_tokens"]
    # The critic read every researcher's last reply.
    critic = [json.loads(ln) for ln in (tmp_path / "agents" / "critic-0.jsonl").read_text().splitlines()]
    first_user = next(r for r in critic if r["role"] == "user")["content"]
    for i in range(cfg.agents[0].count):
        last = [json.loads(ln) for ln in (tmp_path / "agents" / f"researcher-{i}.jsonl").read_text().splitlines()]
        assert f"Report from researcher-{i}:\n{last[-1]['content']}" in first_user
    assert _ray_pids() <= before, "swarm launch left Ray processes running"


def test_launch_needs_turns_and_a_real_model() -> None:
    cfg = load_config({"name": "x", "agents": [{"name": "a", "count": 1, "context": 64}]})
    with pytest.raises(ConfigError, match=r"agents\[0\]\.tasks: is empty"):
        check_launchable(cfg)
    geo = {"n_layer": 2, "n_kv_head": 1, "head_dim": 8, "weight_bytes": 1000, "n_ctx": 128}
    cfg = load_config({"name": "x", "model": {"geometry": geo},
                       "agents": [{"name": "a", "count": 1, "context": 64, "tasks": ["hi"]}]})  # fmt: skip
    with pytest.raises(ConfigError, match=r"model\.geometry"):
        check_launchable(cfg)


def test_inputs_from_cycle_is_named() -> None:
    agents = [{"name": "a", "count": 1, "context": 64, "inputs_from": "b"},
              {"name": "b", "count": 1, "context": 64, "inputs_from": "a"}]  # fmt: skip
    with pytest.raises(ConfigError, match=r"agents\[0\]\.inputs_from: makes a cycle \(a <- b <- a\)"):
        load_config({"name": "x", "agents": agents})


def test_launch_cli_reports_config_errors_without_starting_ray(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nagents:\n  - name: a\n    count: 1\n    context: 64\n    taks: [hi]\n")
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "launch", str(bad)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 2
    assert "agents[0].taks" in r.stderr and "did you mean 'tasks'" in r.stderr


def test_bundle_names_compact_and_expand() -> None:
    names = ["researcher.prefix", "researcher-0", "researcher-1", "researcher-2", "critic-0", "critic-2", "x-1"]
    text = compact_names(names)
    assert text == "researcher.prefix researcher[0-2] critic[0] critic[2] x[1]"
    assert expand_names(text) == names
    many = [f"a-{i}" for i in range(5000)]
    assert compact_names(many) == "a[0-4999]" and expand_names("a[0-4999]") == many


def test_an_agent_nearing_its_reservation_is_replanned_in_place(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from swarm.launch import launch

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = load_config({
        "name": "grow",
        "agents": [{"name": "a", "count": 2, "context": 64, "max_new_tokens": 24,
                    "tasks": ["Count from one to ten.", "Now count from eleven to twenty."]}],
        "workers": [{"name": "v", "kind": "virtual", "device": "x86-host"}],
        "policy": {"formats": ["q8_0"]},
        "engine": {"threads": 1},
    })  # fmt: skip
    summary = launch(cfg, out_dir=tmp_path, live=False, timeout_s=600, echo=lambda m: None)
    first = summary["events"][0]
    assert first["event"] == "placed" and first["reason"] == "launch"
    grown = [e for e in summary["events"] if e["event"] == "placed" and "tokens of context" in e["reason"]]
    assert grown, summary["events"]
    assert not [e for e in summary["events"] if e["event"] == "moved"], "a budget change must not restart the worker"
    block = cfg.engine.block_tokens
    for name, a in summary["agents"].items():
        assert a["finish"] == "done" and a["turns"] == 2, name
        assert a["history_tokens"] <= a["context_reserved"] and a["context_reserved"] % block == 0
        replies = [json.loads(ln) for ln in (tmp_path / "agents" / f"{name}.jsonl").read_text().splitlines()]
        assert all(r["tokens"] == 24 or r["token_ids"][-1] in (0, 2) for r in replies if r["role"] == "assistant")
    plan_bytes = summary["plan"]["workers"][0]["kv_bytes"]
    per_token = summary["plan"]["workers"][0]["block_bytes"] // block
    need = sum(-(-a["context_reserved"] // block) * block for a in summary["agents"].values()) * per_token
    assert plan_bytes >= need and summary["workers"]["v"]["kv_budget_bytes"] == plan_bytes


def test_agents_finishing_frees_room_and_the_rest_move_where_they_run_faster(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from swarm.launch import launch

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = load_config({
        "name": "moves",
        "agents": [
            {"name": "quick", "count": 2, "context": 256, "tasks": ["Say hi."], "max_new_tokens": 4},
            {"name": "slow", "count": 2, "context": 512, "max_new_tokens": 12,
             "tasks": ["Name a color.", "Name another.", "One more.", "And a last one."]},
        ],
        "workers": [
            {"name": "fast", "kind": "virtual", "device": "apple-m2", "memory": "108MiB"},  # room for 512 tokens of KV
            {"name": "pi", "kind": "virtual", "device": "raspberry-pi-5"},
        ],
        "policy": {"formats": ["q8_0"]},
        "engine": {"threads": 1},
    })  # fmt: skip
    summary = launch(cfg, out_dir=tmp_path, live=False, timeout_s=600, echo=lambda m: None)
    events = summary["events"]
    gain = [e for e in events if e["event"] == "replan_gain"]
    assert gain and gain[0]["planned"] > 1.15 * gain[0]["now"], events
    moved = [e for e in events if e["event"] == "moved" and e["reason"].startswith("agents finished")]
    assert moved and all(e["src"] == "pi" and e["dst"] == "fast" for e in moved)
    for name, a in summary["agents"].items():
        assert a["finish"] == "done", name
        replies = [json.loads(ln) for ln in (tmp_path / "agents" / f"{name}.jsonl").read_text().splitlines()]
        assert len([r for r in replies if r["role"] == "assistant"]) == (1 if name.startswith("quick") else 4)
        assert len(rebuild_history(tmp_path / "agents" / f"{name}.jsonl")) == a["history_tokens"]
