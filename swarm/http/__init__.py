"""The OpenAI-compatible HTTP API (docs/HTTP_API.md): Chat Completions and Responses over the swarm's sessions.

request bodies -> schemas (typed, checked once) -> sessions (which agent, a durable job) -> views (OpenAI
objects, SSE chunks and events); grammar builds llguidance grammars for structured output and tool calls.
"""

from swarm.http.app import HttpServer, start

__all__ = ["HttpServer", "start"]
