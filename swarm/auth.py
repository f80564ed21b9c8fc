"""Who may call the API, what each caller may do, and how much of the server each may hold.

Tokens. A caller sends `authorization: Bearer <token>`. The server knows two
kinds: the *default* token (`swarm serve --token`, $KVSWARM_TOKEN, or the one it
writes to ~/.config/kvswarm/token), always `admin` and named "default"; and the
tokens in the *token file* (default ~/.config/kvswarm/tokens.json, beside the
default token: tokens are the user's credentials, not a run's output), made by
`swarm token create --role ROLE`. The file holds, per token, its name, role
and the sha256 of the token, never the token itself. The server stats the file
on every call and re-reads it when it changed, so `swarm token revoke` takes
effect on the next call, without a restart. A file that cannot be read gives
no tokens (fail closed: only the default token works) until it is fixed.

Roles, least privilege first; each includes the ones before it:
- `read`: ListSwarms, GetJob, ListJobs, StreamJob, GetPlacement, WatchPlacement (and reflection);
- `submit`: SubmitJob and CancelJob;
- `admin`: PlanSwarm, LaunchSwarm, StopSwarm, and any method not listed here.
Health checks need no token. A call whose token lacks the role gets
PERMISSION_DENIED naming the role it needs.

Fair limits. Every call is admitted by `Limiter` against one count of calls
in flight, keyed by the caller's token identity (never by its address or a
header it chooses, so neither sharing a host nor inventing client ids changes
anything):
- each identity holds at most `streams_per_identity` open streams and
  `rpcs_per_identity` calls in all;
- callers other than admin tokens share `slots - reserved` slots; admin tokens
  may use all but `health_reserved`; health checks may use every slot. So when
  submit and read tokens have filled their share, health checks and admin
  calls still get through;
- the thread pool has `slots + refusal_threads` threads and gRPC's own
  `maximum_concurrent_rpcs` is the same number, so every admitted call has a
  thread and a refusal is answered at once instead of queueing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from swarm.errors import InvalidArgument, NotFound

ROLES = ("read", "submit", "admin")  # each includes the ones before it
DEFAULT_NAME = "default"  # the default token's identity
ANONYMOUS = "anonymous"  # every caller when auth is off (local development)
TOKENS_FILE = "~/.config/kvswarm/tokens.json"
TOKEN_PREFIX = "kvs_"
MIN_REVOKE_PREFIX = 6  # hex digits of a token id that name it for `swarm token revoke`

SERVICE = "kvswarm.swarm.v1.SwarmService"
HEALTH = "/grpc.health.v1.Health/"
# {method name in SwarmService: the least role that may call it}; a test checks it covers the proto.
METHOD_ROLES = {
    "PlanSwarm": "admin", "LaunchSwarm": "admin", "StopSwarm": "admin",
    "SubmitJob": "submit", "CancelJob": "submit",
    "ListSwarms": "read", "GetJob": "read", "ListJobs": "read", "StreamJob": "read", "GetPlacement": "read",
    "WatchPlacement": "read",
}  # fmt: skip
OTHER_METHOD_ROLES = {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "read"}


def required_role(method: str) -> str | None:
    """The role a full method name ('/pkg.Service/Method') needs; None: open (health checks)."""
    if method.startswith(HEALTH):
        return None
    service, _, name = method.lstrip("/").partition("/")
    if service == SERVICE and name in METHOD_ROLES:
        return METHOD_ROLES[name]
    return OTHER_METHOD_ROLES.get(method, "admin")  # not listed: admin only


def allows(role: str, needed: str) -> bool:
    return ROLES.index(role) >= ROLES.index(needed)


def check_role(role: str, path: str = "role") -> str:
    if role not in ROLES:
        raise InvalidArgument(path, f"{role!r} is not one of {', '.join(ROLES)}")
    return role


@dataclass(frozen=True)
class Identity:
    """A caller: the token's name (the key of its limits) and its role."""

    name: str
    role: str


# -- the token file ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRecord:
    """One line of the token file: the token is known only by its sha256."""

    name: str
    role: str
    sha256: str
    created: float

    @property
    def id(self) -> str:
        return self.sha256[:12]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)  # 256 random bits


def tokens_file(path: str | Path | None = None) -> Path:
    """The token file: `path`, else $KVSWARM_TOKENS_FILE, else ~/.config/kvswarm/tokens.json."""
    return Path(path or os.environ.get("KVSWARM_TOKENS_FILE") or TOKENS_FILE).expanduser()


def write_private(path: Path, text: str) -> None:
    """Writes a secret file whole (a reader sees the old or the new file) with mode 0600, whatever the old one had."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have cleared bits, never added them; this makes it exact
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_records(path: Path) -> list[TokenRecord]:
    """The token file's records ([] when there is no file); ValueError when it is not a token file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise ValueError(f"{path}: expected {{'version': 1, 'tokens': [...]}}")
    out = []
    for i, t in enumerate(data["tokens"]):
        try:
            rec = TokenRecord(name=str(t["name"]), role=str(t["role"]), sha256=str(t["sha256"]),
                              created=float(t.get("created", 0.0)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: tokens[{i}] is not a token record ({e})") from e
        if rec.role not in ROLES or len(rec.sha256) != 64:
            raise ValueError(f"{path}: tokens[{i}] has role {rec.role!r} or a malformed sha256")
        out.append(rec)
    return out


def _write_records(path: Path, records: list[TokenRecord]) -> None:
    write_private(path, json.dumps({"version": 1, "tokens": [asdict(r) for r in records]}, indent=2) + "\n")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialises read-modify-write of the token file between `swarm token` commands."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def create_token(path: Path, role: str, name: str | None = None) -> tuple[str, TokenRecord]:
    """A new token with `role`, recorded (by hash) in the token file; the token and its record."""
    check_role(role)
    token = new_token()
    digest = token_hash(token)
    name = name or f"{role}-{digest[:8]}"
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_.@" for c in name):
        raise InvalidArgument("name", f"{name[:64]!r} must be 1-64 letters, digits or - _ . @")
    if name == DEFAULT_NAME:
        raise InvalidArgument("name", f"{DEFAULT_NAME!r} is the default token's name; pick another")
    with _locked(path):
        records = read_records(path)
        if any(r.name == name for r in records):
            raise InvalidArgument("name", f"a token named {name!r} exists; revoke it first or pick another name")
        rec = TokenRecord(name=name, role=role, sha256=digest, created=time.time())
        _write_records(path, records + [rec])
    return token, rec


def revoke_tokens(path: Path, name_or_prefix: str) -> list[TokenRecord]:
    """Removes the token with this name, id prefix (at least 6 hex digits) or value; the records removed."""
    key = name_or_prefix.strip()
    with _locked(path):
        records = read_records(path)
        hit = [r for r in records if r.name == key]
        if not hit and key.startswith(TOKEN_PREFIX):
            hit = [r for r in records if r.sha256 == token_hash(key)]
        if not hit and len(key) >= MIN_REVOKE_PREFIX:
            hit = [r for r in records if r.sha256.startswith(key.lower())]
        if not hit:
            raise NotFound(f"no token named {key[:64]!r} or with an id starting so (ids: `swarm token list`; "
                           f"a prefix needs at least {MIN_REVOKE_PREFIX} characters)")  # fmt: skip
        if len(hit) > 1:
            raise InvalidArgument("name_or_prefix", f"{key!r} matches {len(hit)} tokens "
                                  f"({', '.join(r.name for r in hit)}); give more of the id")  # fmt: skip
        _write_records(path, [r for r in records if r is not hit[0]])
    return hit


class Tokens:
    """The identities a server accepts: the default token (admin) and the token file's, re-read on change."""

    def __init__(self, default: str | None, path: Path | None, echo: Callable[[str], None] = print) -> None:
        self._default = default.encode() if default else None
        self._path = path
        self._echo = echo
        self._by_hash: dict[str, Identity] = {}  # {sha256 hex: identity}
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime ns) of the file read
        self._lock = threading.Lock()

    def identify(self, token: str) -> Identity | None:
        if self._default is not None and hmac.compare_digest(token.encode(), self._default):
            return Identity(DEFAULT_NAME, "admin")
        if self._path is None:
            return None
        self._refresh()
        return self._by_hash.get(token_hash(token))  # a lookup by hash: timing says nothing about the token

    def _refresh(self) -> None:
        assert self._path is not None
        try:
            st = os.stat(self._path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            key = (0, 0, 0)
        if key == self._seen:
            return
        with self._lock:
            if key == self._seen:
                return
            try:
                by = {r.sha256: Identity(r.name, r.role) for r in read_records(self._path)}
            except (OSError, ValueError) as e:
                self._echo(f"token file unreadable, its tokens are refused until it is fixed: {e}")
                by = {}
            self._by_hash, self._seen = by, key


# -- admission -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """How many calls the server holds at once, and how they are shared out (see the module docstring)."""

    slots: int = 512  # calls in flight at once, every caller together
    reserved: int = 32  # of the slots, kept for admin tokens and health checks
    health_reserved: int = 8  # of the reserved, kept for health checks alone
    streams_per_identity: int = 256  # open streams (StreamJob, WatchPlacement, reflection) per token
    rpcs_per_identity: int = 0  # calls of any kind per token; 0: half the shared slots
    health_watches: int = 16  # Health/Watch streams, all callers together (they need no token)
    refusal_threads: int = 32  # threads beyond the slots: refusals are answered, never queued

    def __post_init__(self) -> None:
        if not 0 <= self.health_reserved <= self.reserved < self.slots:
            raise ValueError(f"need 0 <= health_reserved <= reserved < slots, got {self}")

    @property
    def shared(self) -> int:
        return self.slots - self.reserved

    @property
    def per_identity(self) -> int:
        return self.rpcs_per_identity or max(1, self.shared // 2)

    @property
    def threads(self) -> int:
        """The server's thread pool and gRPC's maximum_concurrent_rpcs."""
        return self.slots + self.refusal_threads


TIERS = ("shared", "admin", "health")


class Limiter:
    """Counts calls in flight, per identity and in all; admits a call or says why not."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self._ceiling = {"shared": adm.shared, "admin": adm.slots - adm.health_reserved, "health": adm.slots}
        self._lock = threading.Lock()
        self.in_flight = 0
        self.calls: dict[str, int] = {}  # {identity: calls in flight}
        self.streams: dict[str, int] = {}  # {identity: streams open}

    def admit(self, who: str, tier: str, stream: bool, stream_cap: int | None = None) -> str | None:
        """None when the call is admitted (release it later), else the reason it is refused."""
        adm = self.adm
        cap = adm.streams_per_identity if stream_cap is None else stream_cap
        with self._lock:
            if stream and self.streams.get(who, 0) >= cap:
                return (f"token {who!r} already has {self.streams[who]} open streams (its limit); close some or "
                        "wait for their jobs to end")  # fmt: skip
            if tier != "health" and self.calls.get(who, 0) >= adm.per_identity:
                return f"token {who!r} already has {self.calls[who]} calls in flight (its limit); retry later"
            if self.in_flight >= self._ceiling[tier]:
                return (f"the server holds {self.in_flight} calls, all it admits for {tier} callers; retry later "
                        "(health checks and admin tokens keep a reserve)")  # fmt: skip
            self.in_flight += 1
            self.calls[who] = self.calls.get(who, 0) + 1
            if stream:
                self.streams[who] = self.streams.get(who, 0) + 1
        return None

    def release(self, who: str, stream: bool) -> None:
        with self._lock:
            self.in_flight -= 1
            self.calls[who] -= 1
            if not self.calls[who]:
                del self.calls[who]
            if stream:
                self.streams[who] -= 1
                if not self.streams[who]:
                    del self.streams[who]


# -- the interceptor ---------------------------------------------------------------------------


class Gate(grpc.ServerInterceptor):
    """Authenticates (tokens None: auth off, every caller is one admin), authorises by role, admits by Limiter.

    intercept_service runs on gRPC's serving thread, so it only looks things up;
    admission happens in the wrapped handler, on the call's own thread."""

    def __init__(self, tokens: Tokens | None, limiter: Limiter) -> None:
        self.tokens, self.limiter = tokens, limiter

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        need = required_role(method)
        if need is None:  # health: no token
            handler = continuation(details)
            if handler is None:
                return None
            if method.endswith("/Check"):
                return self._admitted(handler, "health", "health")
            return self._admitted(handler, "health-watch", "shared", self.limiter.adm.health_watches)
        if self.tokens is None:
            who = Identity(ANONYMOUS, "admin")
        else:
            got = dict(details.invocation_metadata or ()).get("authorization", "")
            token = got[7:] if isinstance(got, str) and got.startswith("Bearer ") else ""
            found = self.tokens.identify(token) if token else None
            if found is None:
                why = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"
                return _deny(continuation(details), grpc.StatusCode.UNAUTHENTICATED, why)
            who = found
        handler = continuation(details)
        if handler is None:
            return None
        if not allows(who.role, need):
            name = method.rsplit("/", 1)[-1]
            return _deny(handler, grpc.StatusCode.PERMISSION_DENIED,
                         f"{name} needs role {need!r}; token {who.name!r} has role {who.role!r}. To fix: use a "
                         f"token made with `swarm token create --role {need}`")  # fmt: skip
        return self._admitted(handler, who.name, "admin" if who.role == "admin" else "shared")

    def _admitted(self, handler: Any, who: str, tier: str, stream_cap: int | None = None) -> Any:
        lim = self.limiter
        stream = bool(handler.response_streaming or handler.request_streaming)
        kind = ("stream_" if handler.request_streaming else "unary_") + ("stream" if handler.response_streaming
                                                                          else "unary")  # fmt: skip
        inner = getattr(handler, kind)

        def refuse(context: grpc.ServicerContext) -> None:
            why = lim.admit(who, tier, stream, stream_cap)
            if why is not None:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

        if handler.response_streaming:

            def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                refuse(context)
                try:
                    yield from inner(request, context)
                finally:
                    lim.release(who, stream)

            return handler._replace(**{kind: streaming})

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            refuse(context)
            try:
                return inner(request, context)
            finally:
                lim.release(who, stream)

        return handler._replace(**{kind: unary})


def _deny(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of the same kind as `handler` that refuses the call."""

    def deny(request: Any, context: grpc.ServicerContext) -> None:
        context.abort(code, message)

    if handler is None or not (handler.request_streaming or handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(deny)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    return grpc.unary_stream_rpc_method_handler(deny)
