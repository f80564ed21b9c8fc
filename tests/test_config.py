"""Swarm config loading, the JSON Schema made from the same definitions, and the device catalog."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from swarm.config import json_schema, load_config, parse_bytes, schema_path
from swarm.devices import load_catalog
from swarm.errors import ConfigError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def base() -> dict:
    return {"name": "t", "agents": [{"name": "a", "count": 2, "context": 1024}]}


def test_minimal_config_gets_defaults() -> None:
    cfg = load_config(base())
    assert cfg.agents[0].count == 2 and cfg.workers[0].kind == "local"
    assert cfg.policy.formats == ("f32", "f16", "q8_0", "q8_head", "q4_0")
    assert cfg.engine.block_tokens == 16


@pytest.mark.parametrize(
    ("edit", "path", "words"),
    [
        (lambda d: d["agents"][0].update(contxt=5), "agents[0].contxt", "did you mean 'context'"),
        (lambda d: d["agents"][0].update(count=0), "agents[0].count", "below 1"),
        (lambda d: d["agents"][0].update(count="two"), "agents[0].count", "expected an integer"),
        (lambda d: d["agents"][0].pop("context"), "agents[0].context", "is missing"),
        (
            lambda d: d.update(workers=[{"name": "w", "kind": "virtual", "device": "rk3589"}]),
            "workers[0].device",
            "did you mean 'rk3588'",
        ),
        (lambda d: d.update(workers=[{"name": "w", "kind": "virtual"}]), "workers[0].device", "is missing"),
        (
            lambda d: d.update(workers=[{"name": "w", "kind": "virtual", "device": "rk3588", "memory": "900TB"}]),
            "workers[0].memory",
            "more than",
        ),
        (lambda d: d.update(workers=[{"name": "w", "memory": "lots"}]), "workers[0].memory", "not a byte count"),
        (lambda d: d.update(policy={"formats": ["f16", "int3"]}), "policy.formats[1]", "not allowed"),
        (lambda d: d.update(policy={"pairs": ["q8_0-f16"]}), "policy.pairs[0]", "is not K/V"),
        (lambda d: d["agents"].append({"name": "a", "count": 1, "context": 5}), "agents[1].name", "repeats"),
        (lambda d: d["agents"][0].update(inputs_from="nobody"), "agents[0].inputs_from", "is not a group"),
        (lambda d: d.update(agents=[]), "agents", "is empty"),
    ],
)
def test_errors_name_the_field_and_the_fix(edit, path: str, words: str) -> None:  # type: ignore[no-untyped-def]
    d = base()
    edit(d)
    with pytest.raises(ConfigError) as e:
        load_config(d)
    assert e.value.path == path
    assert words in str(e.value)
    assert "To fix:" in str(e.value)


def test_context_above_the_model_maximum_is_rejected_when_planning() -> None:
    from swarm.planning import plan_inputs

    d = base()
    d["agents"][0]["context"] = 9000
    d["workers"] = [{"name": "w", "kind": "virtual", "device": "x86-host"}]
    with pytest.raises(ConfigError, match=r"agents\[0\].context: 9,000 exceeds the model's 8,192"):
        plan_inputs(load_config(d))


def test_bytes_units() -> None:
    assert parse_bytes("2GiB", "x") == 2 * 2**30
    assert parse_bytes("1.5 GB", "x") == 1_500_000_000
    assert parse_bytes(4096, "x") == 4096
    with pytest.raises(ConfigError):
        parse_bytes(True, "x")


def test_shipped_schema_is_generated_from_the_definitions() -> None:
    assert json.loads(schema_path().read_text()) == json_schema()
    s = json_schema()
    assert s["required"] == ["name", "agents"]
    assert s["properties"]["agents"]["items"]["additionalProperties"] is False


def test_example_configs_validate_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    for path in sorted(CONFIGS.glob("*.yaml")):
        if path.name == "devices.yaml":
            continue
        jsonschema.validate(yaml.safe_load(path.read_text()), json_schema())
        load_config(path)


def test_catalog_has_the_required_devices_with_sources() -> None:
    cat = load_catalog()
    for dev in ("rk3588", "apple-m4-max", "rx-9070-xt", "rtx-4090", "a100-80gb", "h100-sxm", "h200", "x86-host"):
        spec = cat[dev]
        assert spec.memory_bytes > 0 and spec.bandwidth_gbps > 0
        assert spec.sources["memory"] and spec.sources["bandwidth"]
        assert 0 < spec.usable_bytes < spec.memory_bytes
    assert cat["rtx-4090"].memory_bytes == 24 * 2**30  # 24 GB of GDDR6X
    assert cat["rtx-4090"].bandwidth_gbps == 1008.0  # 384-bit x 21 Gbps / 8


def test_published_scenario_config_plans_a_quantized_cache() -> None:
    from swarm.planning import plan_config

    plan, _ = plan_config(load_config(CONFIGS / "plan-16gb-card.yaml"))
    w = plan.workers[0]
    assert {w.kv_k, w.kv_v} & {"q8_0", "q8_head", "q4_0"}
    assert w.source == "predicted from catalog"
    assert w.memory_bytes <= w.usable_bytes


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "../escape"), ("name", "has space"), ("agents[0].name", "a/b"), ("agents[0].name", "x[1]"),
     ("workers[0].name", ""), ("name", "-lead"), ("agents[0].name", "g.prefix")],
)  # fmt: skip
def test_names_that_cannot_become_ray_or_file_names_are_refused(field: str, value: str) -> None:
    doc = {"name": "ok", "agents": [{"name": "a", "count": 1, "context": 64}], "workers": [{"name": "w"}]}
    if field == "name":
        doc["name"] = value
    elif field.startswith("agents"):
        doc["agents"][0]["name"] = value
    else:
        doc["workers"][0]["name"] = value
    with pytest.raises(ConfigError, match=re.escape(field) + ": .* is not a usable name"):
        load_config(doc)


def test_the_quality_floor_is_bounded_and_can_be_removed() -> None:
    base = {"name": "q", "agents": [{"name": "a", "count": 1, "context": 64}]}
    with pytest.raises(ConfigError, match=r"policy\.quality_floor\.min_top1: 1.5 is above 1"):
        load_config({**base, "policy": {"quality_floor": {"min_top1": 1.5}}})
    with pytest.raises(ConfigError, match=r"policy\.quality_floor\.max_kl"):
        load_config({**base, "policy": {"quality_floor": {"max_kl": -0.1}}})
    off = load_config({**base, "policy": {"quality_floor": {"max_kl": None, "min_top1": None}}})
    assert off.policy.quality_floor.max_kl is None and off.policy.quality_floor.min_top1 is None
    assert load_config(base).policy.quality_floor.max_kl == 0.01  # the default, docs/PLANNER.md
