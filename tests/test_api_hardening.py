"""Issue 13, request validation: each bad request a probe of `swarm serve` found, sent as it was.

A real server on a loopback port, real gRPC clients, real Ray and engine (the `api` fixture of
tests/test_api.py). Every test checks the status code, the message, and that the swarm survives: a
normal job still completes afterwards.
"""

from __future__ import annotations

import math
import os
import random
import resource
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

import test_api  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_api import CONFIG, TOKEN, _code  # noqa: E402

from swarm.client import SwarmClient  # noqa: E402
from swarm.config import LIMITS, show  # noqa: E402
from swarm.server import MAX_ERROR_CHARS, Limits, serve  # noqa: E402
from swarm.v1 import swarm_pb2 as pb  # noqa: E402
from worker.stops import StopScanner  # noqa: E402

api = test_api.api  # the fixture: a server on port 0 with the swarm "api" (3 helpers on 2 virtual workers)
INVALID = grpc.StatusCode.INVALID_ARGUMENT
VIRTUAL = """
workers:
  - name: v
    kind: virtual
    device: x86-host
"""


def _alive(api: dict[str, Any]) -> None:
    """The server answers health checks and a normal job completes."""
    c = api["client"]
    assert c.health() == "SERVING"
    job = c.generate("api", [("user", "Say yes.")], agent="helper-0", max_tokens=3)
    assert job.state == "done" and job.tokens > 0, job
    assert {s.name: s.state for s in c.swarms()}["api"] == "running"


def _canary(tmp: Path) -> Path:
    """A secret file outside --out whose atime moves when it is read (atime set before mtime: relatime updates)."""
    p = tmp / "canary-secret.txt"
    p.write_text("CANARY-7f3e line one\nCANARY-7f3e line two\n")
    st_ = p.stat()
    os.utime(p, ns=(st_.st_mtime_ns - 10**10, st_.st_mtime_ns))
    return p


def _atime_works(p: Path) -> bool:
    before = p.stat().st_atime_ns
    p.read_text()
    return p.stat().st_atime_ns != before


# -- 1. PlanSwarm -------------------------------------------------------------------------------------


def test_1_plan_swarm_works_over_the_wire(api: dict[str, Any]) -> None:
    c = api["client"]
    r = c.plan(CONFIG.replace("name: api", "name: planned"))
    assert r.predicted_tokens_per_s > 0 and "board" in r.table and r.explanation
    assert {w["worker"] for w in __import__("json").loads(r.plan_json)["workers"]} >= {"big", "board"}
    got, msg = _code(lambda: c.plan("name: [unclosed"))
    assert got == INVALID and msg.startswith("config_yaml: is not valid YAML"), msg
    got, msg = _code(lambda: c.plan(""))
    assert got == INVALID and "config_yaml: is empty" in msg
    assert "planned" not in {s.name for s in c.swarms()}  # a dry run
    _alive(api)


# -- 2. config_yaml is a document, model.path a served model --------------------------------------------


def test_2_config_yaml_that_is_a_string_is_never_opened(api: dict[str, Any], tmp_path: Path) -> None:
    c = api["client"]
    canary = _canary(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = canary.stat().st_atime_ns
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for path in (canary, fifo, Path("/dev/zero")):
        for call in (c.plan, c.launch):
            t0 = time.monotonic()
            got, msg = _code(lambda call=call, path=path: call(f'"{path}"'))
            assert got == INVALID, msg
            assert msg.startswith("config_yaml: is a YAML str, not a mapping") and "never a path" in msg, msg
            assert "CANARY" not in msg and time.monotonic() - t0 < 10  # a FIFO blocks no thread
    assert canary.stat().st_atime_ns == before, "the server read the canary"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 100 << 10  # /dev/zero was not read (KiB)
    if _atime_works(canary):
        assert canary.stat().st_atime_ns != before  # the check above could have seen a read
    _alive(api)


def test_2_model_path_names_only_served_models(api: dict[str, Any], tmp_path: Path) -> None:
    c = api["client"]
    canary = _canary(tmp_path)
    before = canary.stat().st_atime_ns
    probes = [str(canary), str(tmp_path / "missing.gguf"), str(tmp_path), "/dev/zero", "/etc/passwd", "../x.gguf"]
    shapes = set()
    for path in probes:
        doc = CONFIG.replace("name: api", f"name: probe\nmodel:\n  path: '{path}'")
        for call in (c.plan, c.launch):
            got, msg = _code(lambda call=call, doc=doc: call(doc))
            assert got == INVALID and msg.startswith("model.path: "), msg
            shapes.add(msg.replace(show(path), "PATH"))
        spec = pb.SwarmSpec(name="probe", model_path=path, agents=[pb.AgentGroupSpec(name="a", count=1, context=64)])
        got, msg = _code(lambda spec=spec: c.launch(spec=spec))
        assert got == INVALID
        shapes.add(msg.replace(show(path), "PATH"))
    assert len(shapes) == 1, shapes  # the same words whether the path exists, is a file, a dir or a device
    assert "is not a model this server offers" in shapes.pop()
    assert canary.stat().st_atime_ns == before
    _alive(api)


def test_2_a_calibration_file_is_never_read_over_the_api(api: dict[str, Any], tmp_path: Path) -> None:
    # workers[].calibration_file names a file on the server: a client may not make the server read one.
    c = api["client"]
    canary = _canary(tmp_path)
    before = canary.stat().st_atime_ns
    doc = CONFIG.replace(
        "  - name: big\n    kind: virtual\n    device: x86-host",
        f"  - name: big\n    kind: local\n    calibration_file: '{canary}'",
    )
    assert "calibration_file" in doc
    for call in (c.plan, c.launch):
        got, msg = _code(lambda call=call: call(doc))
        assert got == INVALID and msg.startswith("workers[0].calibration_file: is not accepted over the API"), msg
    assert canary.stat().st_atime_ns == before
    _alive(api)


def test_2_models_dir_serves_its_models_and_nothing_else(api: dict[str, Any], tmp_path: Path) -> None:
    import refmodel

    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    refmodel.write_tiny_llama(models / "sub" / "tiny.gguf", weight_type="Q8_0", n_layer=2, seed=3)
    outside = tmp_path / "outside.gguf"
    refmodel.write_tiny_llama(outside, weight_type="Q8_0", n_layer=2, seed=4)
    (models / "link.gguf").symlink_to(outside)  # a link that leads out of the directory is not served
    srv = serve(conn=api["server"].hub.conn, port=0, token=TOKEN, out_root=tmp_path / "out", echo=lambda m: None,
                models_dir=models)  # fmt: skip
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            doc = "name: m\nagents: [{name: a, count: 2, context: 64}]\nmodel: {path: %s}\n" + VIRTUAL
            plan = c.plan(doc % "sub/tiny.gguf")
            assert plan.predicted_tokens_per_s > 0
            for bad in ("link.gguf", str(outside), "tiny.gguf"):
                got, msg = _code(lambda bad=bad: c.plan(doc % bad))
                assert got == INVALID and "is not a model this server offers" in msg and "sub/tiny.gguf" in msg, msg
    finally:
        srv.server.stop(1).wait(5)
    _alive(api)


# -- 3. sampling as the engine sees it ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sampling", "needle"),
    [
        ({"top_p": 1e-300}, "sampling.top_p: 1e-300 (in float32, the engine's precision: 0.0)"),
        ({"repetition_penalty": 1e-300}, "sampling.repetition_penalty: 1e-300 (in float32"),
        ({"temperature": math.inf}, "sampling.temperature: inf"),
        ({"temperature": math.nan}, "sampling.temperature: nan"),
        ({"temperature": 1e39}, "sampling.temperature: 1e+39 (in float32, the engine's precision: inf)"),
        ({"top_p": math.nan}, "sampling.top_p: nan"),
        ({"repetition_penalty": math.inf}, "sampling.repetition_penalty: inf"),
        ({"top_k": 2**31 - 1}, "sampling.top_k"),
        ({"top_k": -1}, "sampling.top_k"),
    ],
)  # fmt: skip
def test_3_request_sampling_is_checked_in_float32(api: dict[str, Any], sampling: dict, needle: str) -> None:
    c = api["client"]
    got, msg = _code(lambda: c.submit("api", agent="helper-0", messages=[("user", "x")], sampling=sampling))
    assert got == INVALID and needle in msg, msg
    _alive(api)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("temperature: .nan", "agents[0].sampling.temperature: nan is not a finite number"),
        ("temperature: .inf", "agents[0].sampling.temperature: inf is not a finite number"),
        ("top_p: .nan", "agents[0].sampling.top_p: nan is not a finite number"),
        ("top_p: 1.0e-300", "sampling.top_p: 1e-300 (in float32, the engine's precision: 0.0) is not above 0"),
        ("repetition_penalty: .inf", "agents[0].sampling.repetition_penalty: inf is not a finite number"),
        ("repetition_penalty: 1.0e+39", "agents[0].sampling.repetition_penalty: 1e+39 is not finite in float32"),
        ("repetition_penalty: 0", "agents[0].sampling.repetition_penalty: 0.0 is below 0.001"),
        ("top_k: 1000000000000", "agents[0].sampling.top_k: 1000000000000 is above 1048576"),
        ("seed: 18446744073709551616", "agents[0].sampling.seed: 18446744073709551616 is above"),
    ],
)  # fmt: skip
def test_3_config_sampling_is_checked_in_float32(api: dict[str, Any], line: str, needle: str) -> None:
    c = api["client"]
    doc = CONFIG.replace("name: api", "name: samp").replace(
        "max_new_tokens: 16", f"max_new_tokens: 16\n    sampling:\n      {line}"
    )
    t0 = time.monotonic()
    for call in (c.plan, c.launch):
        got, msg = _code(lambda call=call: call(doc))
        assert got == INVALID and needle in msg, msg
    assert time.monotonic() - t0 < 30
    assert "samp" not in {s.name for s in c.swarms()}
    _alive(api)


def test_3_spec_sampling_is_checked_too(api: dict[str, Any]) -> None:
    c = api["client"]
    for s, needle in ((pb.Sampling(top_p=1e-300), "spec.agents[0].sampling.top_p"),
                      (pb.Sampling(temperature=math.nan), "spec.agents[0].sampling.temperature"),
                      (pb.Sampling(seed=2**64 - 1), "agents[0].sampling.seed")):  # fmt: skip
        spec = pb.SwarmSpec(name="sp", agents=[pb.AgentGroupSpec(name="a", count=1, context=64, sampling=s)],
                            workers=[pb.WorkerSpec(name="v", kind="virtual", device="x86-host")])  # fmt: skip
        got, msg = _code(lambda spec=spec: c.launch(spec=spec))
        assert got == INVALID and needle in msg, msg
    _alive(api)


# -- 4. counts and the document's size, depth and aliases ---------------------------------------------------


def test_4_counts_have_limits(api: dict[str, Any]) -> None:
    c = api["client"]
    big = CONFIG.replace("name: api", "name: many")
    t0 = time.monotonic()
    got, msg = _code(lambda: c.launch(big.replace("count: 3", "count: 1000000000")))
    assert got == INVALID and msg.startswith(f"agents[0].count: 1000000000 is above {LIMITS.max_agents_per_group}")
    assert time.monotonic() - t0 < 10  # refused before anything is built
    doc = big.replace("count: 3", "count: 3000").replace(
        "workers:", "  - {name: more, count: 3000, context: 64}\nworkers:"
    )
    got, msg = _code(lambda: c.plan(doc))
    assert got == INVALID and f"agents: has 6,000 agents in all, more than the limit of {LIMITS.max_agents:,}" in msg
    tasks = big.replace("max_new_tokens: 16", f"max_new_tokens: 16\n    tasks: [{', '.join(['t'] * 1025)}]")
    got, msg = _code(lambda: c.plan(tasks))
    assert got == INVALID and "agents[0].tasks: has 1,025 items, more than the limit of 1,024" in msg
    got, msg = _code(lambda: c.submit("api", agent="helper-0", messages=[("user", "x")], stop=["s"] * 33))
    assert got == INVALID and "stop: has 33 stop strings, more than the limit of 32" in msg
    got, msg = _code(lambda: c.submit("api", agent="helper-0", messages=[("user", "x")], stop=["s" * 513]))
    assert got == INVALID and "stop[0]: has 513 characters, more than the limit of 512" in msg
    got, msg = _code(lambda: c.jobs(limit=10**9))
    assert got == INVALID and "limit" in msg
    _alive(api)


def test_4_aliases_are_refused_before_they_are_expanded(api: dict[str, Any]) -> None:
    c = api["client"]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # The probe: ~1 MB of request, 1,500 aliases of one long string (3.4 GB once expanded).
    doc = "name: bomb\nx: &s " + "y" * 900_000 + "\nagents: [" + ", ".join(["*s"] * 1500) + "]\n"
    got, msg = _code(lambda: c.launch(doc))
    assert got == INVALID and msg.startswith("config_yaml: holds more than 4,194,304 characters of text once its "
                                             "aliases are expanded"), msg[:300]  # fmt: skip
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcdefg", "bcdefgh", strict=True)
    )
    got, msg = _code(lambda: c.plan(laughs))
    assert got == INVALID and "values once its aliases are expanded" in msg, msg
    got, msg = _code(lambda: c.plan("a: &a [*a]"))
    assert got == INVALID and "a cycle" in msg
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 300 << 10  # KiB: nothing was expanded
    _alive(api)


def test_4_deep_nesting_and_big_documents_are_invalid_argument(api: dict[str, Any]) -> None:
    c = api["client"]
    for doc, needle in (("[" * 50_000 + "]" * 50_000, "nests deeper than 32 levels"),
                        ("a: " + "{b: " * 5000 + "1" + "}" * 5000, "nests deeper than 32 levels"),
                        ("name: " + "x" * (LIMITS.max_document_bytes + 1), "is more than 1,048,576 bytes"),
                        ("n: " + "9" * 5000, "holds a value YAML cannot build")):  # fmt: skip
        got, msg = _code(lambda doc=doc: c.plan(doc))
        assert got == INVALID and msg.startswith("config_yaml: ") and needle in msg, msg[:300]
    _alive(api)


# -- 5. stop strings ------------------------------------------------------------------------------------------


def _rescan_find(text: str, stops: list[str]) -> int | None:  # the old algorithm, as the reference
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def _rescan_held(text: str, stops: list[str]) -> int:
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text("ab\n", max_size=6), max_size=5), pieces=st.lists(st.text("ab\n", max_size=4), max_size=12)
)
def test_5_the_incremental_matcher_keeps_the_rescan_semantics(stops: list[str], pieces: list[str]) -> None:
    scanner, text = StopScanner(stops), ""
    for piece in pieces:
        text += piece
        hit = scanner.feed(piece)
        assert hit == _rescan_find(text, stops)
        if hit is not None:
            return
        assert scanner.held == _rescan_held(text, stops)


def test_5_the_matcher_does_linear_work_per_character() -> None:
    # Stop strings built to make a rescan quadratic: long runs of one character, ending differently.
    stops = ["a" * 511 + chr(ord("b") + i) for i in range(32)]
    scanner = StopScanner(stops)
    steps = 0
    ac = scanner._ac
    real_step = ac.step

    def counting(node: int, ch: str) -> int:
        nonlocal steps
        while node and ch not in ac.goto[node]:
            node, steps = ac.fail[node], steps + 1
        steps += 1
        return ac.goto[node].get(ch, 0)

    ac.step = counting  # type: ignore[method-assign]
    try:
        rng = random.Random(5)
        text = "".join(rng.choice("aaaaaaaaz") for _ in range(20_000))
        for i in range(0, len(text), 3):
            assert scanner.feed(text[i : i + 3]) is None
    finally:
        ac.step = real_step  # type: ignore[method-assign]
    assert steps <= 2 * len(text)  # each failure link taken is paid for by a character that went deeper


def test_5_the_probes_stop_strings_are_refused_and_the_limit_runs(api: dict[str, Any]) -> None:
    c = api["client"]
    got, msg = _code(lambda: c.submit("api", agent="helper-0", messages=[("user", "x")], stop=["x" * 4000] * 1000))
    assert got == INVALID and "stop: has 1,000 stop strings" in msg
    stops = ["zq" * 255 + chr(0x4E00 + i) for i in range(32)]  # as many and as long as allowed, none will match
    job = c.generate("api", [("user", "Count to five.")], agent="helper-1", max_tokens=12, stop=stops)
    plain = c.generate("api", [("user", "Count to five.")], new_agent=True, max_tokens=12)
    assert job.state == "done" and job.finish_reason != "stop_string" and job.tokens > 0
    assert plain.state == "done"
    _alive(api)


# -- 6. bounded errors, defined codes ---------------------------------------------------------------------------


def test_6_errors_echo_a_bounded_prefix_and_no_call_is_unknown(api: dict[str, Any]) -> None:
    c = api["client"]
    long = "N" * 10_000
    calls = [
        lambda: c.submit(long, agent="helper-0", messages=[("user", "x")]),
        lambda: c.submit("api", agent=long, messages=[("user", "x")]),
        lambda: c.submit("api", group=long, messages=[("user", "x")]),
        lambda: c.submit("api", agent="helper-0", messages=[(long, "x")]),
        lambda: c.submit("api", agent="helper-0", messages=[("user", "x")], idempotency_key=long),
        lambda: c.placement(long),
        lambda: c.stop(long),
        lambda: c.job(long),
        lambda: c.cancel(long),
        lambda: c.stream(long),
        lambda: c.jobs(swarm=long),
        lambda: c.jobs(state=long),
        lambda: c.watch_placement(long, timeout=30),
        lambda: c.launch(CONFIG.replace("name: api", f"name: {long}")),
        lambda: c.launch(CONFIG.replace("name: api", f"name: x\n{long}: 1")),
        lambda: c.launch(CONFIG.replace("device: rk3588", f"device: {long}")),
        lambda: c.launch(
            CONFIG.replace(
                "name: api",
                "name: g\nmodel:\n  geometry: {n_layer: 2, n_kv_head: 1, head_dim: 8, weight_bytes: 1000, n_ctx: 512}",
            )
        ),  # fmt: skip
        lambda: c.launch(
            spec=pb.SwarmSpec(
                name="w",
                agents=[pb.AgentGroupSpec(name="a", count=1, context=64)],
                workers=[pb.WorkerSpec(name="v", kind="virtual", device="x86-host", memory="9" * 400)],
            )
        ),  # fmt: skip
    ]
    for fn in calls:
        got, msg = _code(fn)
        assert got in (INVALID, grpc.StatusCode.NOT_FOUND), (got, msg[:200])
        assert len(msg) <= MAX_ERROR_CHARS and long[:100] not in msg, msg[:200]
    _alive(api)


def test_6_a_request_that_used_to_assert_gets_a_defined_code(api: dict[str, Any]) -> None:
    c = api["client"]
    got, msg = _code(lambda: c.launch("name: g\nagents: [{name: a, count: 1, context: 64}]\nmodel:\n  geometry: "
                                      "{n_layer: 2, n_kv_head: 1, head_dim: 8, weight_bytes: 1000, n_ctx: 512}\n"
                                      + VIRTUAL))  # fmt: skip
    assert got == INVALID and msg.startswith("model.geometry: describes a model with no weights"), msg
    plan = c.plan("name: g\nagents: [{name: a, count: 1, context: 64}]\nmodel:\n  geometry: "
                  "{n_layer: 2, n_kv_head: 1, head_dim: 8, weight_bytes: 1000, n_ctx: 512}\n" + VIRTUAL)  # fmt: skip
    assert plan.predicted_tokens_per_s > 0
    _alive(api)


# -- 7. idempotency keys ------------------------------------------------------------------------------------------


def test_7_an_idempotency_key_reused_with_another_body_is_already_exists(api: dict[str, Any]) -> None:
    c = api["client"]
    first = c.submit("api", agent="helper-0", messages=[("user", "Hi.")], max_tokens=2, idempotency_key="k-7")
    again = c.submit("api", agent="helper-0", messages=[("user", "Hi.")], max_tokens=2, idempotency_key="k-7")
    assert [j.id for j in again] == [j.id for j in first]
    for kwargs in ({"agent": "helper-0", "messages": [("user", "Hello.")], "max_tokens": 2},
                   {"agent": "helper-1", "messages": [("user", "Hi.")], "max_tokens": 2},
                   {"agent": "helper-0", "messages": [("user", "Hi.")], "max_tokens": 3},
                   {"agent": "helper-0", "messages": [("user", "Hi.")], "max_tokens": 2, "stop": ["x"]},
                   {"agent": "helper-0", "messages": [("user", "Hi.")], "max_tokens": 2,
                    "sampling": {"temperature": 0.5}},
                   {"new_agent": True, "messages": [("user", "Hi.")], "max_tokens": 2}):  # fmt: skip
        got, msg = _code(lambda kwargs=kwargs: c.submit("api", idempotency_key="k-7", **kwargs))
        assert got == grpc.StatusCode.ALREADY_EXISTS, (kwargs, msg)
        assert msg.startswith("idempotency_key 'k-7' was used for a different request") and first[0].id in msg
    assert len([j for j in c.jobs("api") if j.idempotency_key == "k-7"]) == 1
    _alive(api)


def test_limits_are_documented() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "RELIABILITY.md").read_text()
    lim = Limits()
    for needle in (f"{LIMITS.max_agents:,}", f"{LIMITS.max_agents_per_group:,}", f"{LIMITS.max_tasks:,}",
                   f"{lim.max_stop_strings}", f"{lim.max_stop_chars}", "1 MiB", f"{LIMITS.max_depth}",
                   "tests/test_api_hardening.py", "tests/test_api_fuzz.py"):  # fmt: skip
        assert needle in text, needle
