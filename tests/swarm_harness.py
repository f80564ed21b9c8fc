"""What the swarm-level tests (faults, reliability, disk full, KV ships, lifecycle) share.

A swarm of two virtual x86 workers serving two `helper` agents on the default
model, q8_0 KV, one engine thread each; waiting for a condition; and draining a
job's stream while checking it has no gap or repeat.
"""

from __future__ import annotations

import time
from typing import Any

from swarm.client import SwarmClient

# A (re)start on a loaded 2-core machine: Ray placement plus a model load.
WAIT_S = 180.0
SYSTEM = "You are a helpful assistant. Answer briefly."


def two_worker_config(name: str, max_new_tokens: int, system_prompt: str = SYSTEM, extra: str = "") -> str:
    """The swarm YAML: 2 helpers (512-token context) on workers a and b; `extra` is appended as is."""
    return f"""
name: {name}
agents:
  - name: helper
    count: 2
    context: 512
    system_prompt: {system_prompt}
    max_new_tokens: {max_new_tokens}
workers:
  - name: a
    kind: virtual
    device: x86-host
  - name: b
    kind: virtual
    device: x86-host
policy:
  formats: [q8_0]
engine:
  threads: 1
{extra}"""


def until(pred: Any, what: str, timeout: float = WAIT_S) -> Any:
    """pred()'s first truthy value, polled every 0.2 s; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def finish(c: SwarmClient, job_id: str) -> tuple[list[int], Any]:
    """The job's tokens and final state, read from its stream (each event must start where the last ended)."""
    toks: list[int] = []
    for ev in c.stream(job_id, retries=20):
        assert ev.offset == len(toks), f"gap or repeat at {ev.offset}"
        toks += ev.token_ids
        if ev.done:
            return toks, ev.job
    raise AssertionError(f"the stream of {job_id} ended without the job ending")
