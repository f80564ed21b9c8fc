"""The gRPC API's parts, one job each; swarm/server.py wires them into a server.

- `requests`: a request validated once, at the boundary, into a typed value (and the limits it is held to);
- `views`: domain values as protobuf messages;
- `status`: the one table from typed errors to status codes;
- `hub`: every swarm the server runs (registry, launch, stop, recovery after a restart);
- `servicer`: the thin RPC handlers (convert, call the hub or a swarm, convert back).
"""
