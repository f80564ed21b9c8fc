"""Server-sent events as the OpenAI APIs frame them."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"  # the end of a Chat Completions stream


def data(obj: dict[str, Any]) -> str:
    """One Chat Completions chunk."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def event(kind: str, obj: dict[str, Any]) -> str:
    """One Responses event: named by its type."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj}, ensure_ascii=False)}\n\n"
