"""llama.cpp as the benchmark peer: bench/llama_peer.py run case by case in an
interpreter that has llama-cpp-python, each case right before ours so both see
the same machine load (this VM's bandwidth was seen to vary 2x within an hour),
with an optional JSON cache of the peer's rows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PEER_SCRIPT = Path(__file__).with_name("llama_peer.py")


class Peer:
    def __init__(self, python: str, cache: str | None) -> None:
        self.python = python
        self.cache = Path(cache) if cache else None
        self.cached = json.loads(self.cache.read_text()) if self.cache is not None and self.cache.exists() else None
        self.version = self.cached["version"] if self.cached else "?"
        self.rows: list[dict[str, Any]] = []  # every row measured in this run

    def run(self, cfg: dict[str, Any], match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The peer's rows for cfg (from the cache when there is one; `match` selects them there)."""
        if self.cached is not None:
            return [r for r in self.cached["results"] if match(r)]
        proc = subprocess.run([self.python, str(PEER_SCRIPT), json.dumps(cfg)], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"llama.cpp peer failed (install llama-cpp-python or pass --peer-python):\n{proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        self.version = out["version"]
        self.rows.extend(out["results"])
        return list(out["results"])

    def save(self) -> None:
        """Write this run's rows to the cache file, when one was named and did not exist."""
        if self.cache is not None and self.cached is None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            self.cache.write_text(json.dumps({"version": self.version, "results": self.rows}, indent=1))
