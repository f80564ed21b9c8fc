"""The gRPC API: a real server on a loopback port, real Ray, the real engine.

Jobs are checked against the engine run alone (greedy decoding from the same
prompt tokens); every error path sends the bad request and checks the code
and the message.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

from engine_alone import greedy_alone  # noqa: E402 (tests/)

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import Limits, serve  # noqa: E402
from swarm.v1 import swarm_pb2 as pb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token-7c1d"
SYSTEM = "You are a helpful assistant. Answer briefly."
CONFIG = f"""
name: api
agents:
  - name: helper
    count: 3
    context: 512
    system_prompt: {SYSTEM}
    max_new_tokens: 16
workers:
  - name: big
    kind: virtual
    device: x86-host
  - name: board
    kind: virtual
    device: rk3588
    memory: 140MiB
policy:
  formats: [f16, q8_0, q4_0]
engine:
  threads: 1
"""
STREAM_LIMIT = 6


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path_factory.mktemp("api"), echo=lambda m: None,
                limits=Limits(max_streams_per_client=STREAM_LIMIT, max_prompt_chars=200_000))  # fmt: skip
    client = SwarmClient(srv.target, token=TOKEN)
    launched = client.launch(CONFIG)
    try:
        yield {"server": srv, "client": client, "plan": json.loads(launched.plan_json), "launched": launched}
    finally:
        client.close()
        srv.stop()
        scheduler.disconnect(conn)


def _formats(c: SwarmClient) -> dict[str, tuple[str, str]]:
    return {w.worker: (w.kv_k, w.kv_v) for w in c.placement("api").workers}


def _stream_all(c: SwarmClient, job_id: str, offset: int = 0) -> tuple[list[int], list[str], pb.Job]:
    toks: list[int] = []
    pieces: list[str] = []
    last = None
    expect = offset
    for ev in c.stream(job_id, offset):
        assert ev.offset == expect, "a gap or a repeat in the stream"
        toks += ev.token_ids
        pieces += ev.pieces
        expect += len(ev.token_ids)
        if ev.done:
            last = ev.job
    assert last is not None
    return toks, pieces, last


def _code(fn: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        r = fn()
        if hasattr(r, "__next__"):
            list(r)
    return e.value.code(), e.value.details()


# -- jobs -----------------------------------------------------------------------------------------


def test_group_jobs_stream_to_completion_with_the_engines_tokens(api: dict[str, Any]) -> None:
    c = api["client"]
    question = "Name a primary color."
    jobs = c.submit("api", group="helper", messages=[("user", question)], max_tokens=12)
    assert sorted(j.agent for j in jobs) == ["helper-0", "helper-1", "helper-2"]
    results: dict[str, Any] = {}

    def follow(job: pb.Job) -> None:
        results[job.agent] = _stream_all(c, job.id)

    threads = [threading.Thread(target=follow, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    formats = _formats(c)
    expected: dict[tuple[str, str], list[int]] = {}
    for agent, (toks, pieces, job) in results.items():
        assert job.state == "done" and job.tokens == len(toks) and job.agent == agent
        assert "".join(pieces) == job.text
        kv = formats[job.worker]
        if kv not in expected:
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            expected[kv] = greedy_alone(msgs, 12, kv)
        assert toks == expected[kv], agent


def test_a_stream_resumes_from_an_offset_without_gap_or_repeat(api: dict[str, Any]) -> None:
    c = api["client"]
    job = c.submit("api", agent="helper-1", messages=[("user", "Count from one to twenty in words.")],
                   max_tokens=40)[0]  # fmt: skip
    first: list[int] = []
    for ev in c.stream(job.id):
        first += ev.token_ids
        if len(first) >= 6 or ev.done:
            break  # the client goes away mid-stream
    cut = len(first)
    rest, _, done = _stream_all(c, job.id, offset=cut)
    whole, _, _ = _stream_all(c, job.id, offset=0)
    assert first + rest == whole and len(whole) == done.tokens
    assert done.state == "done"


def test_cancel_stops_decoding_and_frees_the_kv(api: dict[str, Any]) -> None:
    c, srv = api["client"], api["server"]
    job = c.submit("api", agent="helper-2", messages=[("user", "Write a long story about a lighthouse.")],
                   max_tokens=400)[0]  # fmt: skip
    seen = 0
    for ev in c.stream(job.id):
        seen += len(ev.token_ids)
        if seen >= 4:
            break
    run = srv.hub.swarm("api")
    worker = c.job(job.id).worker
    assert "helper-2" in run.sched.states()[worker]["sessions"]
    out = c.cancel(job.id)
    assert out.state == "cancelled" and out.finish_reason == "cancelled" and 4 <= out.tokens < 400
    assert "helper-2" not in run.sched.states()[worker]["sessions"]  # the worker freed the session's KV
    _, _, final = _stream_all(c, job.id)
    assert final.state == "cancelled"
    # The agent keeps its conversation: its next job re-prefills the history and completes.
    nxt = c.generate("api", [("user", "Say yes.")], agent="helper-2", max_tokens=4)
    assert nxt.state == "done" and nxt.tokens > 0


def test_one_off_agent_is_placed_and_released(api: dict[str, Any]) -> None:
    c = api["client"]
    before = c.placement("api").generation
    job = c.generate("api", [("system", "You are terse."), ("user", "Say hello.")], new_agent=True, max_tokens=8)
    assert job.state == "done" and job.agent.startswith("job") and job.tokens > 0
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
    toks = greedy_alone(msgs, 8, _formats(c)[job.worker])
    assert job.tokens == len(toks)
    p = c.placement("api")
    assert p.generation > before
    assert all(job.agent not in w.agents for w in p.workers)  # released after its job


def test_stop_strings_end_the_text_before_them(api: dict[str, Any]) -> None:
    c = api["client"]
    msgs = [("system", "You are terse."), ("user", "List three fruits, one per line.")]
    full = c.generate("api", msgs, new_agent=True, max_tokens=24)
    if "\n" not in full.text:
        pytest.skip(f"the model's reply has no newline to stop at: {full.text!r}")
    cut = c.generate("api", msgs, new_agent=True, max_tokens=24, stop=["\n"])
    assert cut.finish_reason == "stop_string"
    assert cut.text == full.text[: full.text.index("\n")]


def test_placement_matches_the_plan_and_ray(api: dict[str, Any]) -> None:
    c = api["client"]
    plan = api["server"].hub.swarm("api").plan.to_dict()  # the latest plan (one-off agents re-plan)
    p = c.placement("api")
    planned = {w["worker"]: w for w in plan["workers"] if w["agents"]}
    assert {w.worker for w in p.workers} == set(planned)
    ray_view = scheduler.placement("api")
    for w in p.workers:
        assert (w.kv_k, w.kv_v) == (planned[w.worker]["kv_k"], planned[w.worker]["kv_v"])
        assert w.alive and w.kv_bytes_budget >= planned[w.worker]["kv_bytes"]
        assert w.predicted_tokens_per_s == pytest.approx(planned[w.worker]["tokens_per_s"])
        assert ray_view["workers"][f"api.{w.worker}"]["node_id"] == w.node_id
    helpers = sorted(a for w in p.workers for a in w.agents if a.startswith("helper"))
    assert helpers == ["helper-0", "helper-1", "helper-2"]


def test_watch_placement_streams_changes(api: dict[str, Any]) -> None:
    c = api["client"]
    stream = c.watch_placement("api", timeout=120)
    first = next(stream)
    job = c.submit("api", new_agent=True, messages=[("user", "Hi.")], max_tokens=4)[0]
    seen = None
    for p in stream:
        if p.generation > first.generation:
            seen = p
            break
    stream.cancel()
    assert seen is not None
    c.generate("api", [("user", "Hi.")], new_agent=True, max_tokens=1)
    assert c.job(job.id).state in ("running", "done", "queued")


def test_idempotency_key_returns_the_first_jobs(api: dict[str, Any]) -> None:
    c = api["client"]
    a = c.submit("api", agent="helper-0", messages=[("user", "Hi.")], max_tokens=2, idempotency_key="k-1")
    b = c.submit("api", agent="helper-0", messages=[("user", "Hi.")], max_tokens=2, idempotency_key="k-1")
    assert [j.id for j in a] == [j.id for j in b]
    assert len([j for j in c.jobs("api") if j.idempotency_key == "k-1"]) == 1


def test_deadline_and_client_cancellation_reach_the_worker(api: dict[str, Any]) -> None:
    c = api["client"]
    long = [("system", SYSTEM), ("user", "Count from 1 to 300, separated by commas.")]  # 400 tokens, alone
    job = c.submit("api", new_agent=True, messages=long, max_tokens=400, deadline_s=0.5)[0]
    _, _, final = _stream_all(c, job.id)
    assert final.state == "cancelled" and final.finish_reason == "deadline" and final.tokens < 400
    job = c.submit("api", new_agent=True, messages=long, max_tokens=400)[0]
    with pytest.raises(grpc.RpcError) as e:
        for _ in c.stream(job.id, cancel_on_disconnect=True, timeout=1.0):
            pass
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 30
    while c.job(job.id).state == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    got = c.job(job.id)
    assert got.state == "cancelled" and got.finish_reason == "client_cancelled", got


def test_health_and_swarm_listing(api: dict[str, Any]) -> None:
    srv = api["server"]
    with SwarmClient(srv.target) as anonymous:  # health checks need no token
        assert anonymous.health() == "SERVING"
    info = {s.name: s for s in api["client"].swarms()}["api"]
    assert info.state == "running" and info.agents >= 3 and info.workers >= 1


# -- errors ------------------------------------------------------------------------------------------


def test_missing_or_wrong_token_is_unauthenticated(api: dict[str, Any]) -> None:
    srv = api["server"]
    for token in (None, "wrong"):
        with SwarmClient(srv.target, token=token) as c:
            code, msg = _code(lambda c=c: c.swarms())
            assert code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in msg
            code, _ = _code(lambda c=c: c.stream("x"))
            assert code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("kwargs", "code", "needle"),
    [
        ({"agent": "helper-0", "messages": [("user", "x")], "max_tokens": -1}, "INVALID_ARGUMENT", "max_tokens: -1"),
        ({"agent": "helper-0", "messages": [("user", "x")], "max_tokens": 10**6}, "INVALID_ARGUMENT", "max_tokens"),
        ({"agent": "helper-0", "messages": []}, "INVALID_ARGUMENT", "messages: is empty"),
        ({"agent": "helper-0", "messages": [("robot", "x")]}, "INVALID_ARGUMENT", "messages[0].role: 'robot'"),
        ({"agent": "helper-0", "messages": [("user", "x")], "sampling": {"top_p": 2.0}}, "INVALID_ARGUMENT",
         "sampling.top_p"),
        ({"agent": "helper-0", "messages": [("user", "x")], "stop": [""]}, "INVALID_ARGUMENT", "stop[0]: is empty"),
        ({"agent": "helper-0", "messages": [("user", "x")], "deadline_s": -1}, "INVALID_ARGUMENT", "deadline_s"),
        ({"agent": "nobody-0", "messages": [("user", "x")]}, "NOT_FOUND", "no agent 'nobody-0'"),
        ({"group": "nobody", "messages": [("user", "x")]}, "NOT_FOUND", "no group 'nobody'"),
        ({"new_agent": True, "messages": [("user", "word " * 9000)]}, "RESOURCE_EXHAUSTED", "past the model's"),
        ({"new_agent": True, "messages": [("user", "x" * 300_000)]}, "RESOURCE_EXHAUSTED", "characters"),
    ],
)  # fmt: skip
def test_bad_job_requests(api: dict[str, Any], kwargs: dict[str, Any], code: str, needle: str) -> None:
    got, msg = _code(lambda: api["client"].submit("api", **kwargs))
    assert got == getattr(grpc.StatusCode, code) and needle in msg, msg


def test_unknown_swarm_and_job_are_not_found(api: dict[str, Any]) -> None:
    c = api["client"]
    for fn in (lambda: c.submit("nope", agent="a-0", messages=[("user", "x")]), lambda: c.placement("nope"),
               lambda: c.job("nojob"), lambda: c.cancel("nojob"), lambda: c.stream("nojob"),
               lambda: c.stop("nope")):  # fmt: skip
        got, msg = _code(fn)
        assert got == grpc.StatusCode.NOT_FOUND and "no " in msg


def test_stream_offset_past_the_tokens_is_invalid(api: dict[str, Any]) -> None:
    c = api["client"]
    job = c.generate("api", [("user", "Hi.")], agent="helper-0", max_tokens=2)
    got, msg = _code(lambda: c.stream(job.id, offset=job.tokens + 5))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "offset" in msg


def test_launch_errors(api: dict[str, Any]) -> None:
    c = api["client"]
    got, msg = _code(lambda: c.launch(CONFIG))
    assert got == grpc.StatusCode.ALREADY_EXISTS and "'api' is already running" in msg
    got, msg = _code(lambda: c.launch(CONFIG.replace("count: 3", "count: 3\n    taks: [x]")))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "agents[0].taks" in msg and "did you mean 'tasks'" in msg
    got, msg = _code(lambda: c.launch("name: [unclosed"))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "config_yaml" in msg
    spec = pb.SwarmSpec(name="s", agents=[pb.AgentGroupSpec(name="a", count=0, context=64)])
    got, msg = _code(lambda: c.launch(spec=spec))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "agents[0].count" in msg
    too_big = (
        CONFIG.replace("name: api", "name: huge")
        .replace("count: 3", "count: 4000")
        .replace("context: 512", "context: 8192")
    )
    got, msg = _code(lambda: c.launch(too_big))
    assert got == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_stopped_swarm_refuses_jobs_and_its_streams_end(api: dict[str, Any]) -> None:
    c = api["client"]
    spec = pb.SwarmSpec(name="short", agents=[pb.AgentGroupSpec(name="a", count=1, context=256, max_new_tokens=4)],
                        workers=[pb.WorkerSpec(name="v", kind="virtual", device="x86-host")], threads=1)  # fmt: skip
    c.launch(spec=spec)
    job = c.submit("short", agent="a-0", messages=[("user", "Write a long story.")], max_tokens=300)[0]
    info = c.stop("short")
    assert info.state == "stopped"
    _, _, final = _stream_all(c, job.id)
    assert final.state == "cancelled" and final.finish_reason == "swarm_stopped"
    got, msg = _code(lambda: c.submit("short", agent="a-0", messages=[("user", "x")]))
    assert got == grpc.StatusCode.FAILED_PRECONDITION and "stopped" in msg
    assert scheduler.placement("short")["workers"] == {}


def test_streams_per_client_are_limited(api: dict[str, Any]) -> None:
    c = api["client"]
    job = c.submit("api", agent="helper-2", messages=[("user", "Write a long story.")], max_tokens=300)[0]
    streams = [c.stub.StreamJob(pb.StreamJobRequest(job_id=job.id), metadata=c.metadata) for _ in range(STREAM_LIMIT)]
    for s in streams:
        next(s)  # each is open on the server
    got, msg = _code(lambda: c.stream(job.id))
    assert got == grpc.StatusCode.RESOURCE_EXHAUSTED and "open streams" in msg
    for s in streams:
        s.cancel()
    c.cancel(job.id)
    with SwarmClient(api["server"].target, token=TOKEN, client_id="other") as other:  # another client is not limited
        assert other.job(job.id).state == "cancelled"


# -- a client without stubs, the CLI, TLS, generated code ---------------------------------------------


def test_reflection_lets_a_generic_client_complete_a_job(api: dict[str, Any]) -> None:
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    channel = grpc.insecure_channel(api["server"].target)
    md = [("authorization", f"Bearer {TOKEN}")]
    # Reflection calls carry the token too: wrap the channel.
    channel = grpc.intercept_channel(channel, _Metadata(md))
    db = ProtoReflectionDescriptorDatabase(channel)
    services = db.get_services()
    assert "kvswarm.swarm.v1.SwarmService" in services and "grpc.health.v1.Health" in services
    pool = descriptor_pool.DescriptorPool(db)
    svc = pool.FindServiceByName("kvswarm.swarm.v1.SwarmService")
    methods = {m.name: m for m in svc.methods}
    assert {"SubmitJob", "StreamJob", "CancelJob", "GetPlacement", "WatchPlacement", "LaunchSwarm"} <= set(methods)
    Req = message_factory.GetMessageClass(methods["SubmitJob"].input_type)
    Resp = message_factory.GetMessageClass(methods["SubmitJob"].output_type)
    req = Req()
    req.swarm, req.agent, req.max_tokens = "api", "helper-0", 3
    msg = req.messages.add()
    msg.role, msg.content = "user", "Hi."
    submit = channel.unary_unary("/kvswarm.swarm.v1.SwarmService/SubmitJob", request_serializer=Req.SerializeToString,
                                 response_deserializer=Resp.FromString)  # fmt: skip
    job_id = submit(req, timeout=60).jobs[0].id
    SReq = message_factory.GetMessageClass(methods["StreamJob"].input_type)
    SEv = message_factory.GetMessageClass(methods["StreamJob"].output_type)
    stream = channel.unary_stream("/kvswarm.swarm.v1.SwarmService/StreamJob", request_serializer=SReq.SerializeToString,
                                  response_deserializer=SEv.FromString)  # fmt: skip
    sreq = SReq()
    sreq.job_id = job_id
    events = list(stream(sreq, timeout=120))
    assert events[-1].done and events[-1].job.state == "done"
    assert sum(len(e.token_ids) for e in events) == events[-1].job.tokens > 0
    channel.close()


class _Metadata(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamStreamClientInterceptor
):
    def __init__(self, md: list[tuple[str, str]]) -> None:
        self.md = md

    def _details(self, d: Any) -> Any:
        return d._replace(metadata=list(d.metadata or []) + self.md)

    def intercept_unary_unary(self, cont: Any, d: Any, req: Any) -> Any:
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont: Any, d: Any, req: Any) -> Any:
        return cont(self._details(d), req)

    def intercept_stream_stream(self, cont: Any, d: Any, reqs: Any) -> Any:
        return cont(self._details(d), reqs)


def test_cli_clients(api: dict[str, Any]) -> None:
    env = {**os.environ, "KVSWARM_TOKEN": TOKEN, "KVSWARM_SERVER": api["server"].target}
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "submit", "api", "--agent", "helper-0", "Say hi.",
                        "--max-tokens", "4"], capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "helper-0 on" in r.stderr and "tokens" in r.stderr
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "jobs", "--swarm", "api"], capture_output=True, text=True,
                       timeout=120, env=env)  # fmt: skip
    assert r.returncode == 0 and "helper-0" in r.stdout
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "cancel", "nojob"], capture_output=True, text=True,
                       timeout=120, env=env)  # fmt: skip
    assert r.returncode == 2 and "NOT_FOUND" in r.stderr
    r = subprocess.run([sys.executable, "-m", "swarm.cli", "jobs"], capture_output=True, text=True, timeout=120,
                       env={**env, "KVSWARM_TOKEN": "bad"})  # fmt: skip
    assert r.returncode == 2 and "UNAUTHENTICATED" in r.stderr


def _self_signed(tmp: Path) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    return cert.public_bytes(pem), key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())  # fmt: skip


def test_tls_server(api: dict[str, Any], tmp_path: Path) -> None:
    # One address, 127.0.0.1 (its certificate names it): "localhost" resolves to two, and port 0 picks a port
    # free on the first; where the second address already had that port, the plain client below reached
    # another test's server there (UNIMPLEMENTED instead of the TLS handshake's UNAVAILABLE).
    cert, key = _self_signed(tmp_path)
    srv = serve(conn=api["server"].hub.conn, host="127.0.0.1", port=0, token=TOKEN, tls=(cert, key),
                out_root=tmp_path, echo=lambda m: None)  # fmt: skip
    try:
        with SwarmClient(f"127.0.0.1:{srv.port}", token=TOKEN, root_certificates=cert) as c:
            assert c.health() == "SERVING" and c.swarms() == []
        with SwarmClient(f"127.0.0.1:{srv.port}", token=TOKEN, timeout_s=5) as plain:
            got, _ = _code(lambda: plain.swarms())
            assert got == grpc.StatusCode.UNAVAILABLE
    finally:
        srv.server.stop(1).wait(5)


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    tools = pytest.importorskip("grpc_tools.protoc")
    args = ["protoc", f"-I{ROOT / 'protos'}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", str(ROOT / "protos" / "swarm" / "v1" / "swarm.proto")]  # fmt: skip
    assert tools.main(args) == 0
    for name in ("swarm_pb2.py", "swarm_pb2.pyi", "swarm_pb2_grpc.py"):
        assert (tmp_path / "swarm" / "v1" / name).read_text() == (ROOT / "swarm" / "v1" / name).read_text(), (
            f"swarm/v1/{name} is stale: run `make protos`"
        )


def test_garbage_bodies_are_invalid_argument_and_the_server_lives_on(api: dict[str, Any]) -> None:
    channel = grpc.insecure_channel(api["server"].target)
    md = [("authorization", f"Bearer {TOKEN}")]
    raw = channel.unary_unary("/kvswarm.swarm.v1.SwarmService/SubmitJob", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)  # fmt: skip
    # Field 1 (swarm, a string) holding bytes that are not UTF-8.
    bad_utf8 = b"\x0a\x04\xff\xfe\xfd\xfc"
    for body in (bad_utf8, b"\xff\xff\xff\xff", b"\x0a\x10short"):
        with pytest.raises(grpc.RpcError) as e:
            raw(body, timeout=30, metadata=md)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert "not a valid kvswarm.swarm.v1.SubmitJobRequest" in e.value.details()
    stream = channel.unary_stream("/kvswarm.swarm.v1.SwarmService/StreamJob", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)  # fmt: skip
    with pytest.raises(grpc.RpcError) as e:
        list(stream(bad_utf8, timeout=30, metadata=md))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A body past the message-size limit is refused by gRPC before it is parsed.
    with pytest.raises(grpc.RpcError) as e:
        api["client"].submit("api", agent="helper-0", messages=[("user", "x" * (5 << 20))])
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    channel.close()
    assert api["client"].health() == "SERVING"
    assert api["client"].generate("api", [("user", "Hi.")], agent="helper-0", max_tokens=2).state == "done"
