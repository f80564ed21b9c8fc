"""Calibration on the real default model, and the planner's memory figure against the engine's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from swarm.gguf_header import read_geometry
from swarm.planner import AgentGroup, Calibration, DeviceProfile, EngineSettings, Policy, plan, scratch_bytes
from swarm.planning import shared_prefix_tokens
from worker.calibrate import (
    MIN_R2,
    CalibrationOptions,
    Estimate,
    _r2,
    attention_problem,
    cache_dir,
    calibrate,
    engine_build,
)
from worker.engine import Engine, KvBudgetError, Sampling


@pytest.fixture(scope="module")
def quick_cal(default_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    mp = pytest.MonkeyPatch()
    mp.setenv("KVSWARM_CACHE", str(tmp_path_factory.mktemp("cache")))
    cal = calibrate(default_model, CalibrationOptions.quick())
    yield cal
    mp.undo()


def test_quick_calibration_measures_every_format(quick_cal) -> None:  # type: ignore[no-untyped-def]
    # Only what holds under any measurement: timings on a busy machine can be anything positive.
    cal = Calibration.from_dict(quick_cal)
    assert cal.source == "measured" and cal.machine
    assert set(cal.attn_ns) == {"f32", "f16", "q8_0", "q8_head", "q4_0"}
    for name, entry in quick_cal["attention"].items():
        lo, hi = entry["ns_per_position_layer_interval"]
        med = entry["ns_per_position_layer"]
        assert math.isfinite(med) and lo <= med <= hi, (name, entry)  # never clamped: a median may be negative
        assert len(entry["samples"]) >= CalibrationOptions.quick().repeats
        assert med == pytest.approx(float(np.median(entry["samples"])))  # the median of the repeats
        assert entry["reliable"] == (attention_problem(Estimate(med, lo, hi), entry["r2"]) is None)
    assert len(cal.weight_step_s) == 4 and len(cal.weight_step_interval) == 4  # batches 1..4, 3 interpolated
    for t, (lo, hi) in zip(cal.weight_step_s, cal.weight_step_interval, strict=True):
        assert 0 < lo <= t <= hi
    assert quick_cal["reliable"] == (not quick_cal["problems"])
    assert quick_cal["reliable"] == all(e["reliable"] for e in quick_cal["attention"].values())
    q = cal.quality
    assert q["f32"].mean_kl == 0.0 and q["f32"].top1 == 1.0
    # Fewer bits, more divergence from f32 (docs/KV_QUALITY.md measured the same order); not timing.
    assert q["f16"].mean_kl < q["q8_0"].mean_kl < q["q4_0"].mean_kl
    assert q["f16"].top1 >= q["q4_0"].top1


# One format, two short contexts, one batch size, three repeats: seconds, for the cache's behaviour.
SMALL = CalibrationOptions(pairs=(("q8_0", "q8_0"),), contexts=(128, 640), batches=(1,), quality_tokens=24, repeats=3)


def test_calibration_is_cached_and_remeasured_on_demand(default_model, capsys) -> None:  # type: ignore[no-untyped-def]
    first = calibrate(default_model, SMALL)
    files = list(cache_dir().glob("*.json"))  # this test's own, empty cache (conftest)
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["calibration"] == first and record["engine_build"] == engine_build()
    assert calibrate(default_model, SMALL) == first  # from the cache
    fresh = calibrate(default_model, SMALL, remeasure=True)
    assert fresh["attention"]["q8_0"]["samples"] != first["attention"]["q8_0"]["samples"]  # measured again
    assert fresh["quality"] == first["quality"]  # scoring is deterministic
    capsys.readouterr()
    # An entry from another engine build is ignored with a one-line warning and measured again.
    record = json.loads(files[0].read_text())
    record["engine_build"] = "0" * 16
    files[0].write_text(json.dumps(record))
    again = calibrate(default_model, SMALL)
    err = capsys.readouterr().err
    assert "from another engine build; measuring again" in err
    assert again["attention"]["q8_0"]["samples"] != fresh["attention"]["q8_0"]["samples"]
    assert json.loads(files[0].read_text())["engine_build"] == engine_build()
    # A corrupt entry likewise.
    files[0].write_text('{"calibration": {"source": "measured"')
    calibrate(default_model, SMALL)
    assert "ignoring corrupt calibration cache" in capsys.readouterr().err
    assert json.loads(files[0].read_text())["calibration"]["source"] == "measured"


def test_unreliable_fits_are_named_never_clamped() -> None:
    # By hand: the three ways a fitted cost is not trusted.
    assert attention_problem(Estimate(-3.0, -9.0, 2.0), 0.9) == "negative slope (median -3.0 ns)"
    assert attention_problem(Estimate(40.0, -1.0, 80.0), 0.9) == "interval reaches zero (-1.0..80.0 ns)"
    assert attention_problem(Estimate(40.0, 30.0, 50.0), 0.2) == f"poor fit (R^2 0.20 < {MIN_R2})"
    assert attention_problem(Estimate(40.0, 30.0, 50.0), 0.9) is None
    # R^2 by hand for four points:
    xs, ys = [0, 1, 2, 3], [1.0, 1.0, 5.0, 5.0]
    # least squares: slope 1.6, intercept 0.6 -> fitted 0.6, 2.2, 3.8, 5.4; residuals 0.4, -1.2, 1.2, -0.4
    ss_res = 0.16 + 1.44 + 1.44 + 0.16
    ss_tot = 4 * 4.0  # mean 3, deviations -2, -2, 2, 2
    assert _r2(xs, ys) == pytest.approx(1 - ss_res / ss_tot)
    # Quartiles by hand (linear interpolation between order statistics), five samples 1..5 -> 2, 3, 4.
    assert Estimate.of([5.0, 1.0, 4.0, 2.0, 3.0]) == Estimate(3.0, 2.0, 4.0)


def test_header_geometry_matches_the_engine(default_model, tiny_models) -> None:  # type: ignore[no-untyped-def]
    gguf = pytest.importorskip("gguf")
    for path in [default_model, *tiny_models.values()]:
        geom = read_geometry(path)
        eng = Engine(path)
        c = eng.config
        assert (geom.n_layer, geom.n_head, geom.n_kv_head, geom.head_dim) == (
            c["n_layer"], c["n_head"], c["n_head_kv"], c["head_dim"]
        )  # fmt: skip
        assert (geom.n_vocab, geom.n_ctx, geom.n_ff, geom.n_embd) == (
            c["n_vocab"], c["n_ctx_train"], c["n_ff"], c["n_embd"]
        )  # fmt: skip
        assert geom.weight_stream_bytes == c["weight_bytes"]
        reader = gguf.GGUFReader(str(path))  # independent reader for the resident bytes
        assert geom.resident_bytes == sum(int(t.n_bytes) for t in reader.tensors)


def test_truncated_header_is_a_clear_error(default_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from swarm.errors import ModelFileError

    bad = tmp_path / "cut.gguf"
    bad.write_bytes(default_model.read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="truncated"):
        read_geometry(bad)
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ModelFileError, match="not a GGUF"):
        read_geometry(tmp_path / "x.gguf")


@pytest.mark.parametrize("fmt", ["f16", "q8_0", "q4_0"])
def test_planned_kv_bytes_equal_what_the_engine_reserves(quick_cal, default_model, fmt: str) -> None:  # type: ignore[no-untyped-def]
    from swarm.config import load_config

    system = "You are a careful research assistant. Answer briefly and cite the step you used." * 3
    cfg = load_config({"name": "t", "agents": [{"name": "r", "count": 3, "context": 700, "system_prompt": system}]})
    prefix = shared_prefix_tokens(cfg, default_model)[0]
    geom = read_geometry(default_model)
    settings = EngineSettings()
    dev = DeviceProfile("host", "local", "cpu", 2 * 10**9, Calibration.from_dict(quick_cal))
    p = plan(geom, [dev], [AgentGroup("r", 3, 700, shared_prefix_tokens=prefix)], Policy.allow([fmt]),
             settings=settings)  # fmt: skip
    w = p.worker("host")
    assert w.kv_blocks == prefix // 16 + 3 * (math.ceil(700 / 16) - prefix // 16)  # by hand

    eng = Engine(
        default_model, kv_k=fmt, kv_v=fmt, kv_budget_bytes=w.kv_bytes, max_batch_tokens=settings.max_batch_tokens
    )
    tok = eng.tokenizer
    ids = []
    for i in range(3):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]
        prompt = tok.encode(tok.render_chat(msgs), add_bos=False)
        ids.append(eng.add_sequence(prompt, Sampling(max_new_tokens=4)))
        while eng.busy():
            eng.step()
    for sid in ids:
        eng.finish(sid)
        eng.score(sid, [])  # write the last sampled token
        eng.fill_kv(sid, 700 - len(eng.tokens(sid)))
    mem = eng.memory()
    assert mem["bytes_reserved"] == w.kv_bytes  # to the block
    assert mem["weight_bytes"] == geom.weight_stream_bytes
    assert mem["scratch_bytes"] <= scratch_bytes(geom, settings, 3, 700) == w.scratch_bytes
    with pytest.raises(KvBudgetError):  # the budget is exactly the plan's reservation
        eng.fill_kv(ids[0], 16)
