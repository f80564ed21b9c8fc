"""The OpenAI-compatible HTTP API of `swarm serve`: a FastAPI app on uvicorn, in a thread beside gRPC.

Same tokens and roles as gRPC (swarm/auth.py: listing and fetching need `read`,
completions `submit`), the same per-token limits, the same durable jobs (every
request is a job of the swarm that serves it, recorded before the answer
starts). Errors take OpenAI's shape {"error": {message, type, param, code}} with
the codes of one table (`_STATUS`).
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm import auth
from swarm.api.hub import Hub
from swarm.api.requests import Limits
from swarm.api.status import MAX_ERROR_CHARS
from swarm.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NoFeasiblePlan,
    NotFound,
    PortInUse,
    ResourceExhausted,
    SwarmError,
)
from swarm.http import schemas, sessions, views
from swarm.http.sessions import Starting

STREAM_THREADS = 1024  # worker threads for blocking handlers and streams (each open stream holds one)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param


# The one table: a typed error -> (HTTP status, OpenAI error type, code). First match wins.
_STATUS: list[tuple[type[BaseException], int, str, str]] = [
    (InvalidArgument, 400, "invalid_request_error", "invalid_value"),
    (NotFound, 404, "invalid_request_error", "not_found"),
    (Starting, 503, "server_error", "swarm_starting"),
    (ResourceExhausted, 429, "rate_limit_error", "not_admissible"),
    (NoFeasiblePlan, 429, "rate_limit_error", "not_admissible"),
    (AlreadyExists, 409, "invalid_request_error", "conflict"),
    (FailedPrecondition, 409, "invalid_request_error", "failed_precondition"),
    (SwarmError, 503, "server_error", "unavailable"),
]


def _error(e: BaseException) -> ApiError:
    if isinstance(e, ApiError):
        return e
    for t, status, kind, code in _STATUS:
        if isinstance(e, t):
            msg = str(e)[:MAX_ERROR_CHARS]
            return ApiError(status, msg, kind, code, e.path if isinstance(e, InvalidArgument) else None)
    return ApiError(500, f"internal error ({type(e).__name__}); the server log has it", "server_error", "internal")


def _json_error(e: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}},
                        status_code=e.status, headers=headers)  # fmt: skip


@dataclass
class Gate:
    """Bearer tokens (None: auth off) and per-identity limits, as gRPC's Gate applies them."""

    tokens: auth.Tokens | None
    limiter: auth.Limiter

    def identify(self, request: Request, needed: str) -> auth.Identity:
        if self.tokens is None:
            return auth.Identity("anonymous", "admin")
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "no bearer token; send Authorization: Bearer <token> (the OpenAI client's api_key)",
                           "invalid_request_error", "missing_api_key")  # fmt: skip
        who = self.tokens.identify(token.strip())
        if who is None:
            raise ApiError(401, "the token is not valid (unknown or revoked); use a token from `swarm token create` "
                           "or the server's default token", "invalid_request_error", "invalid_api_key")  # fmt: skip
        if not auth.allows(who.role, needed):
            raise ApiError(403, f"token {who.name!r} has role {who.role!r}; this needs {needed!r}",
                           "invalid_request_error", "permission_denied")  # fmt: skip
        return who

    def admit(self, who: auth.Identity, stream: bool) -> Callable[[], None]:
        tier = "admin" if who.role == "admin" else "shared"
        why = self.limiter.admit(who.name, tier, stream)
        if why is not None:
            raise ApiError(429, why, "rate_limit_error", "rate_limit_exceeded")
        done = threading.Event()

        def release() -> None:
            if not done.is_set():
                done.set()
                self.limiter.release(who.name, stream)

        return release


def create_app(hub: Hub, gate: Gate, limits: Limits) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = STREAM_THREADS
        yield

    app = FastAPI(title="kvswarm OpenAI-compatible API", lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None)  # fmt: skip

    async def on_error(request: Request, e: Exception) -> JSONResponse:
        return _json_error(_error(e))

    for kind in (ApiError, SwarmError, Exception):  # typed errors are answered here, without a traceback
        app.add_exception_handler(kind, on_error)

    @app.exception_handler(404)
    async def on_404(request: Request, e: Exception) -> JSONResponse:
        return _json_error(ApiError(404, f"no endpoint {request.method} {request.url.path}", "invalid_request_error",
                                    "unknown_url"))  # fmt: skip

    @app.exception_handler(405)
    async def on_405(request: Request, e: Exception) -> JSONResponse:
        return _json_error(ApiError(405, f"{request.url.path} does not take {request.method}",
                                    "invalid_request_error", "method_not_allowed"))  # fmt: skip

    async def _body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > limits.max_message_bytes:
            raise ApiError(413, f"the body is {len(raw):,} bytes, more than the limit of "
                           f"{limits.max_message_bytes:,}", "invalid_request_error", "body_too_large")  # fmt: skip
        return schemas.parse_body(raw)

    def _answer(job: Any, stream: bool, release: Callable[[], None], whole: Callable[[Any], dict[str, Any]],
                events: Callable[[Any], Iterator[str]]) -> Any:  # fmt: skip
        if stream:

            def gen() -> Iterator[str]:
                try:
                    yield from events(job)
                finally:
                    release()

            return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            views.wait_done(job)
        finally:
            release()
        err = views.failure(job)
        if err is not None:
            return JSONResponse({"error": err}, status_code=500)
        return whole(job)

    async def _run(fn: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(fn)

    @app.get("/v1/models")
    async def list_models(request: Request) -> Any:
        gate.identify(request, "read")
        now = int(time.time())
        ids = await _run(lambda: sessions.model_ids(hub))
        return {"object": "list", "data": [{"id": i, "object": "model", "created": now, "owned_by": "kvswarm"}
                                           for i in ids]}  # fmt: skip

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> Any:
        gate.identify(request, "read")
        if model not in await _run(lambda: sessions.model_ids(hub)):
            raise NotFound(f"no model {model!r} (GET /v1/models lists them)")
        return {"id": model, "object": "model", "created": int(time.time()), "owned_by": "kvswarm"}

    async def create(request: Request, parse: Any, kind: str, whole: Any, stream: Any) -> Any:
        """Checks, admits and submits one request of `kind`; answers it whole or as a stream."""
        who = gate.identify(request, "submit")
        spec = parse(await _body(request), limits)
        release = gate.admit(who, spec.stream)
        try:
            job = await _run(lambda: sessions.submit(hub, spec, kind))
        except BaseException:
            release()
            raise
        return await _run(lambda: _answer(job, spec.stream, release, whole, stream))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await create(request, schemas.chat_request, "chat", views.chat_completion, views.chat_chunks)

    @app.get("/v1/chat/completions/{completion_id}")
    async def get_chat_completion(completion_id: str, request: Request) -> Any:
        gate.identify(request, "read")
        job = sessions.find(hub, "chat", completion_id)
        if not job.done:
            raise ApiError(409, f"chat completion {completion_id} is still {job.state}", "invalid_request_error",
                           "in_progress")  # fmt: skip
        return views.chat_completion(job)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Any:
        return await create(request, schemas.responses_request, "response", views.response, views.response_events)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> Any:
        gate.identify(request, "read")
        return views.response(sessions.find(hub, "response", response_id))

    return app


@dataclass
class HttpServer:
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int
    tls: bool
    _tls_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/v1"

    def stop(self, grace: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(grace + 5)
        if self._tls_dir is not None:
            self._tls_dir.cleanup()


def start(
    hub: Hub,
    *,
    host: str,
    port: int,
    tokens: auth.Tokens | None,
    limiter: auth.Limiter,
    limits: Limits,
    tls: tuple[bytes, bytes] | None = None,
) -> HttpServer:
    """Listens on host:port (0: a free port) and serves in a thread; returns once it accepts connections."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port} for HTTP: {e}; pick another --http-port (0: off)") from e
    sock.listen(2048)
    tls_dir, cert, key = None, None, None
    if tls is not None:  # uvicorn reads PEM files: written private, removed on stop
        tls_dir = tempfile.TemporaryDirectory(prefix="kvswarm-tls-")
        cert, key = Path(tls_dir.name) / "cert.pem", Path(tls_dir.name) / "key.pem"
        auth.write_private(cert, tls[0].decode())
        auth.write_private(key, tls[1].decode())
    app = create_app(hub, Gate(tokens, limiter), limits)
    config = uvicorn.Config(app, log_level="warning", access_log=False, ssl_certfile=cert, ssl_keyfile=key,
                            timeout_graceful_shutdown=5)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise PortInUse(f"the HTTP server on {host}:{port} did not start")
    bound = sock.getsockname()[1]
    return HttpServer(server=server, thread=thread, host=host, port=int(bound), tls=tls is not None, _tls_dir=tls_dir)
