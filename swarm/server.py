"""gRPC server for swarm.v1.SwarmService (protos/swarm/v1/swarm.proto).

One server holds one Ray connection and any number of swarms, each a
`SwarmRun` in serve mode (its agents work through their tasks, then wait for
jobs). This module wires the parts in swarm/api/ into a server: requests are
validated once into typed values (requests), handled by a thin servicer over
the hub of swarms (servicer, hub), and typed errors map onto status codes in
one table (status). Nothing a client sends is unpickled or executed: requests
are protobuf messages and YAML parsed with `yaml.safe_load`.

Security: binds 127.0.0.1 unless told otherwise; every call but health
checking needs `authorization: Bearer <token>` unless auth is disabled, with
a role that allows the method, and is admitted against limits per token
identity with a reserve for health checks and admin tokens (swarm/auth.py);
TLS when a certificate and key are given; limits on message size and prompt size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from swarm import auth, scheduler
from swarm.api.hub import Hub
from swarm.api.requests import Limits
from swarm.api.servicer import SERVICE, Servicer
from swarm.api.status import MAX_ERROR_CHARS
from swarm.errors import PortInUse
from swarm.store import Store
from swarm.v1 import swarm_pb2 as pb

if TYPE_CHECKING:
    from swarm.http import HttpServer

DEFAULT_LIMITS = Limits()

__all__ = ["MAX_ERROR_CHARS", "SERVICE", "Hub", "Limits", "Server", "Servicer", "serve", "swarm_health_name"]


# -- parsing requests safely -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Unparsable:
    """A request body that is not the method's message (bad wire format, invalid UTF-8 in a string)."""

    type_name: str
    error: str


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception as e:  # noqa: BLE001 - DecodeError and friends: answered INVALID_ARGUMENT below
            return _Unparsable(cls.DESCRIPTOR.full_name, str(e) or type(e).__name__)

    return parse


def _refuse(req: _Unparsable, context: grpc.ServicerContext) -> None:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  f"the request is not a valid {req.type_name} ({req.error}); strings must be UTF-8")  # fmt: skip


def _handlers(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The service's method handlers with parsers that turn a malformed body into INVALID_ARGUMENT."""
    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["SwarmService"].methods:
        req_cls, resp_cls = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        fn = getattr(servicer, m.name)
        if m.server_streaming:

            def stream(request: Any, context: grpc.ServicerContext, fn: Any = fn) -> Iterator[Any]:
                if isinstance(request, _Unparsable):
                    _refuse(request, context)
                yield from fn(request, context)

            handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=_parser(req_cls), response_serializer=resp_cls.SerializeToString
            )
        else:

            def unary(request: Any, context: grpc.ServicerContext, fn: Any = fn) -> Any:
                if isinstance(request, _Unparsable):
                    _refuse(request, context)
                return fn(request, context)

            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=_parser(req_cls), response_serializer=resp_cls.SerializeToString
            )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


# -- the server --------------------------------------------------------------------------------------


@dataclass
class Server:
    server: grpc.Server
    hub: Hub
    port: int
    host: str
    token: str | None
    health: health.HealthServicer
    http: HttpServer | None = None  # the OpenAI-compatible HTTP API, when it is on

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace: float = 5.0) -> None:
        self.health.enter_graceful_shutdown()
        if self.http is not None:
            self.http.stop(grace)
        self.server.stop(grace).wait(grace + 5)
        self.hub.shutdown()


def swarm_health_name(swarm: str) -> str:
    """The gRPC health service of one swarm: SERVING while it runs and records, NOT_SERVING otherwise."""
    return f"kvswarm.swarm/{swarm}"


def serve(
    *,
    conn: scheduler.Connection,
    host: str = "127.0.0.1",
    port: int = 50051,
    token: str | None,
    tls: tuple[bytes, bytes] | None = None,
    out_root: Path = Path("runs"),
    limits: Limits = DEFAULT_LIMITS,
    max_workers: int = 512,
    echo: Callable[[str], None] = print,
    calibrate: Callable[[Path, str, int], dict[str, Any]] | None = None,
    store_path: Path | None = None,
    tokens_file: Path | None = None,
    models_dir: Path | None = None,
    http_port: int | None = None,
) -> Server:
    """Starts the server (token None: auth disabled, for local development only).

    `token` is the default (admin) token; `tokens_file` holds the tokens made by
    `swarm token create`, re-read when it changes. `max_workers` calls are
    admitted at once, shared out per token identity (swarm/auth.py).

    A client's model.path may name only the default model or a *.gguf file under `models_dir`.

    Swarms and jobs are recorded in `store_path` (default <out_root>/kvswarm.db);
    swarms a previous server left running there are resumed before it listens.

    `http_port` (None: off; 0: any free port) serves the OpenAI-compatible HTTP API (swarm/http) on the
    same host, with the same tokens, limits and TLS; `Server.http.port` is the bound port.
    """
    hub = Hub(conn=conn, out_root=out_root, store=Store(store_path or out_root / "kvswarm.db"), echo=echo,
              calibrate=calibrate, models_dir=Path(models_dir) if models_dir else None)  # fmt: skip
    hub.recover()
    options = [("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_send_message_length", limits.max_message_bytes)]  # fmt: skip
    admission = auth.Admission(slots=max_workers, streams_per_identity=limits.max_streams_per_client)
    tokens = auth.Tokens(token, tokens_file, echo=echo) if token else None
    limiter = auth.Limiter(admission)  # one count of calls per token, over gRPC and HTTP together
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=admission.threads, thread_name_prefix="grpc"),
                         interceptors=[auth.Gate(tokens, limiter)], options=options,
                         maximum_concurrent_rpcs=admission.threads)  # fmt: skip
    server.add_generic_rpc_handlers((_handlers(Servicer(hub, limits)),))
    h = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(h, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, grpc.ssl_server_credentials([(tls[1], tls[0])])) if tls else \
        server.add_insecure_port(address)  # fmt: skip
    if bound == 0:
        raise PortInUse(f"cannot listen on {address}: the port is taken or not allowed")
    server.start()
    for name in ("", SERVICE):
        h.set(name, health_pb2.HealthCheckResponse.SERVING)
    hub.on_swarm_state = lambda run: h.set(swarm_health_name(run.cfg.name), health_pb2.HealthCheckResponse.SERVING
                                           if run.healthy else health_pb2.HealthCheckResponse.NOT_SERVING)  # fmt: skip
    for run in list(hub.swarms.values()):
        hub.on_swarm_state(run)
    http = None
    if http_port is not None:
        from swarm import http as http_api

        try:
            http = http_api.start(
                hub, host=host, port=http_port, tokens=tokens, limiter=limiter, limits=limits, tls=tls
            )
        except BaseException:
            server.stop(0)
            hub.shutdown()
            raise
    return Server(server=server, hub=hub, port=bound, host=host, token=token, health=h, http=http)
