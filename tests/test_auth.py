"""Tokens with roles and fair limits per token identity: a real server on a loopback port, real clients.

The server admits 40 calls at once (32 reserved for admin tokens and health
checks, so other tokens share 8, at most 4 each) and 3 open streams per token,
so the limits are reached with a handful of streams.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

from swarm import auth, scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import Limits, serve  # noqa: E402
from swarm.v1 import swarm_pb2 as pb  # noqa: E402

DEFAULT = "auth-test-default-token"
SLOTS = 40  # auth.Admission reserves 32 of them: other tokens share 8, at most 4 in flight each
STREAMS = 3  # open streams per token
CONFIG = """
name: authz
agents:
  - name: a
    count: 2
    context: 256
    max_new_tokens: 4
workers:
  - name: v
    kind: virtual
    device: x86-host
policy:
  formats: [q8_0]
engine:
  threads: 1
"""


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("auth")
    tokens_file = root / "tokens.json"
    made = {role: auth.create_token(tokens_file, role, f"t-{role}")[0] for role in auth.ROLES}
    made.update({f"{r}2": auth.create_token(tokens_file, r, f"t-{r}2")[0] for r in ("read", "submit")})
    conn = scheduler.connect(None, kv_bytes=4 * 10**9)
    srv = serve(conn=conn, port=0, token=DEFAULT, out_root=root / "runs", echo=lambda m: None, max_workers=SLOTS,
                limits=Limits(max_streams_per_client=STREAMS), tokens_file=tokens_file)  # fmt: skip
    admin = SwarmClient(srv.target, token=DEFAULT)
    admin.launch(CONFIG)
    job = admin.generate("authz", [("user", "Hi.")], agent="a-0", max_tokens=2)
    try:
        yield {"server": srv, "tokens": made, "file": tokens_file, "admin": admin, "job": job}
    finally:
        admin.close()
        srv.stop()
        scheduler.disconnect(conn)


def _code(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        r = fn()
        if hasattr(r, "__next__"):
            next(r)
            r.cancel()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _eventually(fn: Callable[[], tuple[grpc.StatusCode, str]], want: grpc.StatusCode, s: float = 15.0) -> None:
    """Streams a client cancelled are let go by the server within its poll (0.5 s); wait for that."""
    deadline = time.monotonic() + s
    got = fn()
    while got[0] != want and time.monotonic() < deadline:
        time.sleep(0.25)
        got = fn()
    assert got[0] == want, got


def _calls(c: SwarmClient, job_id: str) -> dict[str, Callable[[], Any]]:
    """One call per RPC of SwarmService, each valid enough that a caller with the role gets past the gate."""
    return {
        "ListSwarms": c.swarms,
        "GetJob": lambda: c.job(job_id),
        "ListJobs": lambda: c.jobs("authz"),
        "StreamJob": lambda: c.stub.StreamJob(pb.StreamJobRequest(job_id=job_id), metadata=c.metadata, timeout=30),
        "GetPlacement": lambda: c.placement("authz"),
        "WatchPlacement": lambda: c.watch_placement("authz", timeout=30),
        "SubmitJob": lambda: c.submit("authz", agent="a-1", messages=[("user", "Hi.")], max_tokens=1),
        "CancelJob": lambda: c.cancel(job_id),
        "LaunchSwarm": lambda: c.launch("name: [unclosed"),  # INVALID_ARGUMENT once admitted
        "StopSwarm": lambda: c.stop("no-such-swarm"),  # NOT_FOUND once admitted
        "PlanSwarm": lambda: c.plan("name: [unclosed"),
    }


def test_every_method_has_a_role() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["SwarmService"].methods}
    assert set(auth.METHOD_ROLES) == methods
    assert auth.required_role("/grpc.health.v1.Health/Check") is None
    assert auth.required_role("/kvswarm.swarm.v1.SwarmService/Unlisted") == "admin"  # not listed: admin only


@pytest.mark.parametrize("role", ["read", "submit", "admin", "default"])
def test_roles_are_enforced_for_every_rpc_class(api: dict[str, Any], role: str) -> None:
    token = DEFAULT if role == "default" else api["tokens"][role]
    have = "admin" if role == "default" else role
    with SwarmClient(api["server"].target, token=token) as c:
        for method, call in _calls(c, api["job"].id).items():
            need = auth.METHOD_ROLES[method]
            code, msg = _code(call)
            if auth.allows(have, need):
                assert code not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), (method, msg)
                if method in ("LaunchSwarm", "StopSwarm"):
                    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (method, msg)
                elif method != "PlanSwarm":  # PlanSwarm's own handling is issue 13's item 1, not the gate's
                    assert code == grpc.StatusCode.OK, (method, code, msg)
            else:
                assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code, msg)
                assert f"{method} needs role {need!r}" in msg and f"has role {role!r}" in msg, msg
        assert c.health() == "SERVING"


def test_unknown_and_missing_tokens_are_unauthenticated(api: dict[str, Any]) -> None:
    for token in (None, "kvs_not-a-token", DEFAULT + "x"):
        with SwarmClient(api["server"].target, token=token) as c:
            for method, call in _calls(c, api["job"].id).items():
                code, msg = _code(call)
                assert code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in msg, (method, code, msg)


def test_a_token_made_or_revoked_while_serving_takes_effect_without_a_restart(api: dict[str, Any]) -> None:
    env = {**os.environ, "KVSWARM_TOKENS_FILE": str(api["file"])}
    cli = [sys.executable, "-m", "swarm.cli", "token"]
    r = subprocess.run(cli + ["create", "--role", "read", "--name", "late"], capture_output=True, text=True,
                       timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith(auth.TOKEN_PREFIX) and token not in api["file"].read_text()  # only its hash is stored
    with SwarmClient(api["server"].target, token=token) as c:
        assert [s.name for s in c.swarms()] == ["authz"]
        listed = subprocess.run(cli + ["list"], capture_output=True, text=True, timeout=60, env=env)
        assert "late" in listed.stdout and "read" in listed.stdout and token not in listed.stdout
        r = subprocess.run(cli + ["revoke", "late"], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0 and "revoked 'late'" in r.stdout, r.stderr
        code, msg = _code(c.swarms)
        assert code == grpc.StatusCode.UNAUTHENTICATED, msg
        r = subprocess.run(cli + ["revoke", "late"], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 2 and "no token named 'late'" in r.stderr
    # A revocation by id prefix; the other tokens are untouched.
    tok, rec = auth.create_token(api["file"], "submit", "by-prefix")
    with SwarmClient(api["server"].target, token=tok) as c:
        assert c.swarms()
        assert auth.revoke_tokens(api["file"], rec.id[:8]) == [rec]
        assert _code(c.swarms)[0] == grpc.StatusCode.UNAUTHENTICATED
    with SwarmClient(api["server"].target, token=api["tokens"]["read"]) as c:
        assert c.swarms()


def test_an_unreadable_token_file_refuses_its_tokens_and_keeps_the_default(tmp_path: Path) -> None:
    f = tmp_path / "tokens.json"
    tok, _ = auth.create_token(f, "read", "r")
    tokens = auth.Tokens("the-default", f, echo=lambda m: None)
    assert tokens.identify(tok) == auth.Identity("r", "read")
    f.write_text("{not json")
    assert tokens.identify(tok) is None  # fail closed
    assert tokens.identify("the-default") == auth.Identity("default", "admin")


def test_token_files_are_0600_on_every_write(tmp_path: Path) -> None:
    secret = tmp_path / "cfg" / "token"
    secret.parent.mkdir()
    secret.write_text("old\n")
    secret.chmod(0o644)
    auth.write_private(secret, "new\n")  # what `swarm serve` writes its default token with
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text() == "new\n"
    tokens = tmp_path / "cfg" / "tokens.json"
    auth.create_token(tokens, "read", "first")
    tokens.chmod(0o644)
    env = {**os.environ, "KVSWARM_TOKENS_FILE": str(tokens)}
    for args in (["create", "--role", "submit", "--name", "second"], ["revoke", "first"]):
        r = subprocess.run([sys.executable, "-m", "swarm.cli", "token", *args], capture_output=True, text=True,
                           timeout=60, env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
        tokens.chmod(0o644)
    assert [r.name for r in auth.read_records(tokens)] == ["second"]
    assert not [p for p in tokens.parent.iterdir() if p.name.endswith(".tmp")]


def _quiet() -> None:
    """Streams earlier tests cancelled are let go within the server's 0.5 s poll: count from zero."""
    time.sleep(2.0)


def _watch(c: SwarmClient) -> Any:
    s = c.watch_placement("authz", timeout=120)
    next(s)  # open on the server
    return s


def test_two_identities_have_separate_stream_limits_and_client_ids_do_not_bypass(api: dict[str, Any]) -> None:
    target, tokens = api["server"].target, api["tokens"]
    a = SwarmClient(target, token=tokens["read"])
    b = SwarmClient(target, token=tokens["read2"])
    _quiet()
    held = [_watch(a) for _ in range(STREAMS)]
    try:
        code, msg = _code(lambda: a.watch_placement("authz", timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "'t-read' already has 3 open streams" in msg, msg
        # The same token from another connection, with a fresh x-client-id each time: the same identity.
        for i in range(3):
            with SwarmClient(target, token=tokens["read"], client_id=f"fresh-{i}") as again:
                code, msg = _code(lambda again=again: again.watch_placement("authz", timeout=30))
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "open streams" in msg, msg
                assert again.swarms()  # unary calls of that token still go through
        held.append(_watch(b))  # another token is not refused
        assert _code(lambda: c_stream(b, api["job"].id))[0] == grpc.StatusCode.OK
    finally:
        for s in held:
            s.cancel()
    _eventually(lambda: _code(lambda: a.watch_placement("authz", timeout=30)), grpc.StatusCode.OK)  # slots come back
    a.close()
    b.close()


def c_stream(c: SwarmClient, job_id: str) -> Any:
    return c.stub.StreamJob(pb.StreamJobRequest(job_id=job_id), metadata=c.metadata, timeout=30)


def test_health_and_admin_get_through_when_other_tokens_fill_their_share(api: dict[str, Any]) -> None:
    target, tokens = api["server"].target, api["tokens"]
    clients = {k: SwarmClient(target, token=tokens[k]) for k in ("submit", "submit2", "read", "read2")}
    held: list[Any] = []
    _quiet()
    try:
        # One submit token at its own limit: the other tokens, health checks and admin are unaffected.
        held += [_watch(clients["submit"]) for _ in range(STREAMS)]
        assert _code(lambda: clients["submit"].watch_placement("authz"))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert clients["read"].swarms() and api["admin"].swarms()
        # Other tokens together fill the 8 shared slots (3 + 3 + 2 streams).
        held += [_watch(clients["submit2"]) for _ in range(STREAMS)]
        held += [_watch(clients["read"]) for _ in range(2)]
        code, msg = _code(clients["read2"].swarms)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "admin tokens keep a reserve" in msg, msg
        code, msg = _code(lambda: clients["submit2"].submit("authz", agent="a-1", messages=[("user", "x")]))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "admin tokens keep a reserve" in msg, msg
        for _ in range(5):
            assert clients["read2"].health() == "SERVING"  # no token needed, never refused
        admin = api["admin"]
        assert [s.name for s in admin.swarms()] == ["authz"]
        assert admin.placement("authz").workers
        held += [_watch(admin) for _ in range(2)]  # admin streams come out of the reserve
        job = admin.generate("authz", [("user", "Hi.")], agent="a-1", max_tokens=2)
        assert job.state == "done"
        assert clients["read2"].health() == "SERVING"
    finally:
        for s in held:
            s.cancel()
    _eventually(lambda: _code(clients["read2"].swarms), grpc.StatusCode.OK)
    for c in clients.values():
        c.close()
