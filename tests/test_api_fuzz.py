"""Property-based fuzzing of every SwarmService RPC against a live server (issue 13).

Hypothesis builds request messages field by field: extremes, NaN and inf, huge strings and counts,
paths of files outside the server's --out (a canary, a FIFO, /dev/zero), YAML bombs. After each example:
the status is a defined code (never UNKNOWN, and never INTERNAL: that is a bug), the server is healthy.
At the end a normal job completes with the greedy tokens of the engine run alone, the canary was never
read, and the server opened no file outside the directories it may use (its open files are sampled
throughout: the server is in-process, so /proc/self/fd is its table).

CI runs KVSWARM_FUZZ_EXAMPLES (default 60) examples; `make fuzz-api` runs the nightly size.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

import yaml  # noqa: E402
from engine_alone import greedy_alone  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_api import CONFIG, TOKEN  # noqa: E402

from swarm import planner, scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.gguf_header import read_geometry  # noqa: E402
from swarm.server import Limits, serve  # noqa: E402
from swarm.v1 import swarm_pb2 as pb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("KVSWARM_FUZZ_EXAMPLES", "60"))
# Every code a handler may answer with on purpose; UNKNOWN (an escaped exception) and INTERNAL (a bug
# the handler caught) fail the run. DEADLINE_EXCEEDED: a stream that legitimately waits, cut by the client.
DEFINED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _catalog_calibration(path: Path, mode: str, threads: int) -> dict[str, Any]:
    """Local workers are priced from a nominal bandwidth: a fuzzed PlanSwarm must not spend minutes measuring
    (and the measurement's cache lives outside --out)."""
    geom = read_geometry(path)
    pairs = [
        (k, v) for k in ("f32", "f16", "q8_0", "q8_head", "q4_0") for v in ("f32", "f16", "q8_0", "q8_head", "q4_0")
    ]
    return planner.Calibration.from_bandwidth(geom, 20e9, pairs).to_dict()


class _FdWatch:
    """Samples the paths of this process's open files every few ms (a file opened and closed between two
    samples is missed; the canary's atime covers reads of the one file that matters most)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fd-watch")

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._run_once()

    def _run_once(self) -> None:
        with contextlib.suppress(OSError):
            for n in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    self.seen.add(os.readlink(f"/proc/self/fd/{n}"))

    def __enter__(self) -> _FdWatch:
        self._run_once()
        self.before = set(self.seen)  # open already (pytest's output, Ray's logs): not the requests' doing
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    outside = tmp_path_factory.mktemp("outside")  # files a request must never reach
    canary = outside / "canary-secret.txt"
    canary.write_text("CANARY-91ab\n" * 4)
    st_ = canary.stat()
    os.utime(canary, ns=(st_.st_mtime_ns - 10**10, st_.st_mtime_ns))  # atime before mtime: a read moves it
    fifo = outside / "fifo"
    os.mkfifo(fifo)
    out = tmp_path_factory.mktemp("fuzz-out")
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(
        conn=conn,
        port=0,
        token=TOKEN,
        out_root=out,
        echo=lambda m: None,
        calibrate=_catalog_calibration,
        limits=Limits(max_streams_per_client=16),
    )
    client = SwarmClient(srv.target, token=TOKEN, timeout_s=120)
    client.launch(CONFIG)
    job = client.generate("api", [("user", "Hi.")], agent="helper-0", max_tokens=2)
    try:
        yield {
            "server": srv,
            "client": client,
            "canary": canary,
            "fifo": fifo,
            "out": out,
            "job": job.id,
            "atime": canary.stat().st_atime_ns,
            "calls": {},
        }
    finally:
        client.close()
        srv.stop()
        scheduler.disconnect(conn)


# -- strategies, one per field type ---------------------------------------------------------------------------

_PATHS = ["/etc/passwd", "/dev/zero", "/dev/urandom", "/proc/self/environ", "../../../../etc/shadow", "~/.ssh/id_rsa"]


def _texts(special: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=24),
        st.sampled_from(
            [
                "",
                "api",
                "helper",
                "helper-0",
                "helper-2",
                "nobody-0",
                "default",
                "x86-host",
                "rk3588",
                "\x00",
                "a" * 64,
                "🙂" * 40,
                "' OR 1=1 --",
                "${HOME}",
                "%s%n",
                *special,
                *_PATHS,
            ]
        ),
        st.integers(1, 200_000).map(lambda n: "N" * n),
    )


_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 1e-45, 1.1e-38, 0.5, 1.0, 1.0000001, 10.0, 100.0, 1e39, 1e308, -1.0]),
)
_INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2, 16, 64, 8192, 2**31 - 1, -(2**31)]))
_UINT64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]))


def _counts(elem: st.SearchStrategy[Any], big: int) -> st.SearchStrategy[list[Any]]:
    """A short list, or a huge one of a repeated element."""
    return st.one_of(
        st.lists(elem, max_size=4), st.tuples(elem, st.sampled_from([big, 5 * big])).map(lambda t: [t[0]] * t[1])
    )


def _sampling() -> st.SearchStrategy[pb.Sampling]:
    return st.builds(
        pb.Sampling, temperature=_FLOATS, top_k=_INT32, top_p=_FLOATS, repetition_penalty=_FLOATS, seed=_UINT64
    )


def _yaml_docs(special: list[str]) -> st.SearchStrategy[str]:
    scalar = st.one_of(_texts(special), _INT32, _FLOATS, st.booleans(), st.none(), st.integers(10**12, 10**30))
    value = st.recursive(
        scalar,
        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)),
        max_leaves=12,
    )
    group = st.fixed_dictionaries(
        {
            "name": st.sampled_from(["g", "helper", "x" * 70]),
            "count": st.one_of(_INT32, st.just(10**9)),
            "context": st.one_of(_INT32, st.just(10**12)),
        },
        optional={
            "sampling": st.fixed_dictionaries(
                {},
                optional={
                    "temperature": _FLOATS,
                    "top_p": _FLOATS,
                    "repetition_penalty": _FLOATS,
                    "top_k": _INT32,
                    "seed": _UINT64,
                },
            ),
            "tasks": st.lists(_texts(special), max_size=3),
            "max_new_tokens": _INT32,
            "system_prompt": value,
            "inputs_from": _texts(special),
        },
    )
    worker = st.fixed_dictionaries(
        {"name": st.sampled_from(["v", "w", "local"]), "kind": st.sampled_from(["virtual", "local", "cluster", "x"])},
        optional={
            "device": st.sampled_from(["x86-host", "rk3588", "nope"]),
            "memory": st.one_of(_texts(special), _INT32, st.just("9" * 400), st.just("1e999GiB")),
            "calibration": st.sampled_from(["full", "catalog"]),
        },
    )
    doc = st.fixed_dictionaries(
        {"name": st.sampled_from(["fz", "api", "x/y"]), "agents": st.lists(group, min_size=1, max_size=2)},
        optional={
            "workers": st.lists(worker, min_size=1, max_size=2),
            "model": st.fixed_dictionaries({}, optional={"path": _texts(special), "geometry": value}),
            "policy": st.fixed_dictionaries(
                {}, optional={"formats": st.lists(st.sampled_from(["f16", "q8_0", "q4_0", "f64"]), max_size=30)}
            ),
            "engine": st.fixed_dictionaries(
                {}, optional={"threads": _INT32, "max_batch_tokens": _INT32, "block_tokens": _INT32}
            ),
            "extra": value,
        },
    )
    bombs = st.sampled_from(
        [
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcdefg", "bcdefgh", strict=True)),
            "[" * 20_000 + "]" * 20_000,
            "a: &a [*a]",
            "x: &s " + "y" * 600_000 + "\nagents: [" + ", ".join(["*s"] * 1500) + "]",
            "n: " + "9" * 5000,
            "t: 2001-13-45",
            "!!python/object/apply:os.system ['true']",
            "\t\x1f",
            "x" * (1 << 20) + "x",
        ]
    )
    paths = st.sampled_from(special + _PATHS).map(lambda p: f'"{p}"')
    return st.one_of(doc.map(lambda d: yaml.safe_dump(d, allow_unicode=True)), bombs, paths, st.text(max_size=200))


def _spec(special: list[str]) -> st.SearchStrategy[pb.SwarmSpec]:
    group = st.builds(
        pb.AgentGroupSpec,
        name=_texts(special),
        count=_INT32,
        context=_INT32,
        system_prompt=_texts(special),
        tasks=_counts(_texts(special), 2000),
        inputs_from=_texts(special),
        max_new_tokens=_INT32,
        sampling=_sampling(),
    )
    worker = st.builds(
        pb.WorkerSpec,
        name=st.sampled_from(["v", "w"]),
        kind=st.sampled_from(["virtual", "", "x"]),
        device=st.sampled_from(["x86-host", "rk3588", ""]),
        memory=_texts(special),
        calibration=st.sampled_from(["", "catalog", "full"]),
    )
    return st.builds(
        pb.SwarmSpec,
        name=_texts(special),
        model_path=_texts(special),
        agents=st.lists(group, max_size=2),
        workers=st.lists(worker, max_size=2),
        kv_formats=_counts(st.sampled_from(["f16", "q4_0", "zz"]), 2000),
        threads=_INT32,
    )


def _requests(special: list[str]) -> st.SearchStrategy[tuple[str, Any]]:
    text = _texts(special)
    message = st.builds(
        pb.Message, role=st.one_of(st.sampled_from(["user", "system", "assistant"]), text), content=text
    )
    submit = st.builds(
        pb.SubmitJobRequest,
        swarm=st.one_of(st.just("api"), text),
        messages=_counts(message, 300),
        max_tokens=_INT32,
        stop=_counts(text, 1000),
        idempotency_key=st.one_of(st.just(""), text),
        deadline_s=_FLOATS,
        sampling=st.one_of(st.none(), _sampling()),
    ).flatmap(
        lambda r: st.sampled_from(["agent", "group", "new_agent", None]).flatmap(
            lambda t: st.one_of(text, st.just("helper-1"), st.just("helper")).map(lambda name: _target(r, t, name))
        )
    )
    job_id = st.one_of(text, st.just(special[-1]))
    by_method: dict[str, st.SearchStrategy[Any]] = {
        "PlanSwarm": st.builds(pb.PlanSwarmRequest, config_yaml=_yaml_docs(special)),
        "LaunchSwarm": st.one_of(
            st.builds(pb.LaunchSwarmRequest, config_yaml=_yaml_docs(special)),
            st.builds(pb.LaunchSwarmRequest, spec=_spec(special)),
            st.just(pb.LaunchSwarmRequest()),
        ),
        "StopSwarm": st.builds(pb.StopSwarmRequest, swarm=text.filter(lambda s: s != "api")),
        "ListSwarms": st.just(pb.ListSwarmsRequest()),
        "SubmitJob": submit,
        "StreamJob": st.builds(
            pb.StreamJobRequest, job_id=job_id, offset=_INT32, cancel_job_on_disconnect=st.booleans()
        ),
        "GetJob": st.builds(pb.GetJobRequest, job_id=job_id),
        "ListJobs": st.builds(pb.ListJobsRequest, swarm=text, state=text, limit=_INT32),
        "CancelJob": st.builds(pb.CancelJobRequest, job_id=text),
        "GetPlacement": st.builds(pb.GetPlacementRequest, swarm=text),
        "WatchPlacement": st.builds(pb.GetPlacementRequest, swarm=text),
    }
    assert set(by_method) == {m.name for m in pb.DESCRIPTOR.services_by_name["SwarmService"].methods}
    # Each method equally often (st.one_of would favour the first ones as examples shrink).
    return st.sampled_from(sorted(by_method)).flatmap(lambda m: by_method[m].map(lambda r: (m, r)))


def _target(req: pb.SubmitJobRequest, target: str | None, name: str) -> pb.SubmitJobRequest:
    if target == "new_agent":
        req.new_agent = True
    elif target is not None:
        setattr(req, target, name)
    return req


def _call(c: SwarmClient, method: str, req: Any) -> tuple[grpc.StatusCode, str, Any]:
    fn = getattr(c.stub, method)
    try:
        if method in ("StreamJob", "WatchPlacement"):
            stream = fn(req, timeout=3, metadata=c.metadata)
            for _ in stream:
                pass
            return grpc.StatusCode.OK, "", None
        return grpc.StatusCode.OK, "", fn(req, timeout=120, metadata=c.metadata)
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None


def _undo(c: SwarmClient, method: str, resp: Any) -> None:
    """What a fuzzed call started is ended at once, so the swarm stays light on two cores."""
    if method == "SubmitJob" and resp is not None:
        for j in resp.jobs:
            c.cancel(j.id)
    if method == "LaunchSwarm" and resp is not None and resp.swarm.name != "api":
        c.stop(resp.swarm.name)


def test_every_rpc_survives_fuzzed_requests(fuzz: dict[str, Any]) -> None:
    c: SwarmClient = fuzz["client"]
    special = [str(fuzz["canary"]), str(fuzz["fifo"]), str(fuzz["canary"].parent), fuzz["job"]]
    calls: dict[str, int] = fuzz["calls"]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=os.environ.get("CI") is not None,
        suppress_health_check=list(HealthCheck),
    )
    @given(_requests(special))
    def one(call: tuple[str, Any]) -> None:
        method, req = call
        code, details, resp = _call(c, method, req)
        calls[f"{method} {code.name}"] = calls.get(f"{method} {code.name}", 0) + 1
        assert code in DEFINED, f"{method} -> {code.name}: {details[:500]}"
        assert len(details) <= 2100, f"{method}: {len(details)} characters of error"
        assert "CANARY" not in details
        _undo(c, method, resp)
        assert c.health() == "SERVING"

    with _FdWatch() as watch:
        one()
        # A normal job still completes, with the tokens of the engine alone.
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
        job = c.generate("api", [(m["role"], m["content"]) for m in msgs], new_agent=True, max_tokens=8)
    assert job.state == "done", job
    kv = {w.worker: (w.kv_k, w.kv_v) for w in c.placement("api").workers}
    toks = [t for ev in c.stream(job.id) for t in ev.token_ids]
    assert toks == greedy_alone(msgs, 8, kv.get(job.worker, (job.kv_format, job.kv_format)))
    assert fuzz["canary"].stat().st_atime_ns == fuzz["atime"], "the server read the canary"
    allowed = (
        str(fuzz["out"]),
        str(ROOT),
        sys.prefix,
        sys.base_prefix,
        "/tmp/ray",
        "/dev/",
        "/proc/",
        "/sys/",
        "socket:",
        "pipe:",
        "anon_inode:",
        str(Path(pytest.__file__).parent),
    )
    outside = sorted(
        p
        for p in watch.seen - watch.before
        if (not p.startswith(allowed) and not p.startswith("/tmp/pytest-of-"))
        or p.startswith(str(fuzz["canary"].parent))
    )
    assert not outside, f"the server opened files outside its directories: {outside[:10]}"
    print(f"\n{sum(calls.values())} fuzzed calls: " + ", ".join(f"{k} x{v}" for k, v in sorted(calls.items())))
