"""llama.cpp as the benchmark peer, and the record every side-by-side bench writes.

bench/llama_peer.py runs as a server in an interpreter that has llama-cpp-python;
`Peer.cell` fills the peer's caches for every configuration of one bench cell,
then alternates samples: ours, each peer configuration, ours, ... (this VM's
bandwidth was seen to swing 2x within an hour, so both sides must see the same
load). An optional JSON cache of the peer's samples is reused only when every
parameter matches exactly: the case's own (threads, tokens decoded, prompt
length or depth, KV type, flash attention, cache layout), the model file's
sha256 and llama_cpp.__version__. Anything else is measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PEER_SCRIPT = Path(__file__).with_name("llama_peer.py")
REPLY = "@@peer "  # llama_peer.py's reply prefix (llama.cpp may print lines of its own)
RESULTS = Path(__file__).with_name("results")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def spread(values: list[float]) -> dict[str, float]:
    """{"median", "min", "max"} of one side's samples of one cell."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def show(s: dict[str, float] | None, width: int = 19) -> str:
    """'205.6 (190-211)': median and range, or n/a."""
    if not s:
        return f"{'n/a':>{width}}"
    return f"{s['median']:.1f} ({s['min']:.0f}-{s['max']:.0f})".rjust(width)


class Peer:
    def __init__(self, python: str, model: Path, cache: str | None) -> None:
        self.model = model
        self.model_sha256 = file_sha256(model)
        self.cache = Path(cache) if cache else None
        # [{"key": {...}, "samples": [...]} | {"key": {...}, "error": "..."}]
        self.entries: list[dict[str, Any]] = []
        if self.cache is not None and self.cache.exists():
            self.entries = json.loads(self.cache.read_text()).get("entries", [])  # older formats: nothing reusable
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            [python, str(PEER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            bufsize=1,
        )
        self.version = self.ask({"op": "version"})["version"]

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                if line.startswith(REPLY):
                    return json.loads(line[len(REPLY) :])
        except BrokenPipeError:
            pass
        self.stderr.seek(0)
        sys.exit("llama.cpp peer died (install llama-cpp-python or pass --peer-python):\n" + self.stderr.read()[-2000:])

    def key(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Every parameter a cached sample must match."""
        return {**cfg, "model": self.model.name, "model_sha256": self.model_sha256, "peer_version": self.version}

    def cell(
        self, configs: dict[str, dict[str, Any]], rounds: int, ours: Callable[[], dict[str, float]]
    ) -> tuple[list[dict[str, float]], dict[str, dict[str, Any]]]:
        """`rounds` samples of ours alternated with `rounds` of each peer configuration
        ({name: llama_peer.py open request less op/id/model}). Returns (our samples,
        {name: {"samples": [...]} | {"error": "..."}, with "cached": bool})."""
        theirs: dict[str, dict[str, Any]] = {}
        live: list[str] = []
        for name, cfg in configs.items():
            key = self.key(cfg)
            hit = next((e for e in self.entries if e["key"] == key), None)
            if hit is not None and ("error" in hit or len(hit["samples"]) >= rounds):
                theirs[name] = {**hit, "samples": hit.get("samples", [])[:rounds], "cached": True}
                continue
            t0 = time.perf_counter()
            r = self.ask({"op": "open", "id": name, "model": str(self.model), **cfg})
            print(f"#   llama.cpp {name}: filled in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if r.get("extra_bufts") is False:
                print(
                    f"#   llama.cpp {name}: without its extra weight buffer types (AMX, repacked rows): a prefill"
                    f" with them died here ({r.get('probe')})",
                    file=sys.stderr,
                    flush=True,
                )
            if "error" in r:
                theirs[name] = {"key": key, "error": r["error"], "cached": False}
            else:
                theirs[name] = {"key": key, "samples": [], "cached": False}
                live.append(name)
        mine = []
        for _ in range(rounds):
            mine.append(ours())
            for name in live:
                r = self.ask({"op": "measure", "id": name})
                if "error" in r:
                    sys.exit(f"llama.cpp peer failed measuring {configs[name]}: {r['error']}")
                theirs[name]["samples"].append(r)
        self.ask({"op": "close"})
        for t in theirs.values():
            if not t["cached"]:
                self.entries = [e for e in self.entries if e["key"] != t["key"]]
                self.entries.append({k: v for k, v in t.items() if k != "cached"})
        return mine, theirs

    def save(self) -> None:
        """Write every entry (cached and measured in this run) to the cache file, when one was named."""
        if self.cache is not None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            self.cache.write_text(json.dumps({"entries": self.entries}, indent=1) + "\n")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def print_best_of_any_kv(cells: list[dict[str, Any]], key: str, values: list[int], label: str) -> None:
    """One line per value of cells' `key`: our best median over llama.cpp's best of every KV type and config."""
    for v in values:
        at = [c for c in cells if c[key] == v]
        if not at:
            continue
        o = max(at, key=lambda c: c["ours"]["tokens_per_s"]["median"])
        theirs = [
            (t["tokens_per_s"]["median"], c["kv"], n) for c in at for n, t in c["peer"].items() if "tokens_per_s" in t
        ]
        if theirs:
            rate, pkv, pcfg = max(theirs)
            om = o["ours"]["tokens_per_s"]["median"]
            print(
                f"# {label.format(v)}: ours {om:.1f} ({o['kv']}) / llama.cpp {rate:.1f} ({pkv} {pcfg}) "
                f"= {om / rate:.2f}"
            )


def machine() -> dict[str, Any]:
    """What the record says about where it ran."""
    cpu, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "simd": sorted(f for f in flags if f in {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni"}),
        "platform": platform.platform(),
    }


def write_record(name: str, parameters: dict[str, Any], cells: list[dict[str, Any]], **extra: Any) -> Path:
    """bench/results/<name>.json: both sides of every cell with date, machine, versions and parameters."""
    from worker import _native  # only for the ISA our kernels ran at

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "", False
    out = {
        "bench": name,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {**machine(), "kernel_isa": os.environ.get("KVSWARM_ISA") or _native.isa_levels()[-1]},
        "versions": {"kvswarm_commit": commit.strip(), "worktree_dirty": dirty, "python": platform.python_version()},
        "parameters": parameters,
        **extra,
        "cells": cells,
    }
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path


def record_name(bench: str, model: str | None) -> str:
    """bench/results/<name>.json's name: the bench's own for the default model, else with the model's name
    (so a run on another model never overwrites the default model's record)."""
    if model in (None, "", "default"):
        return bench
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in Path(str(model)).name.removesuffix(".gguf"))
    return f"{bench}-{slug}"


# Both sides' prompts use token ids up to this (llama_peer.prompt_tokens: (17 s + 31 i) % 40000 + 100).
PROMPT_MAX_TOKEN = 40099


def check_prompt_vocab(model: Path) -> None:
    """Exits with the fix when the model's vocabulary is too small for the shared prompt token ids."""
    from swarm.gguf_header import read_geometry

    n_vocab = read_geometry(model).n_vocab
    if n_vocab <= PROMPT_MAX_TOKEN:
        sys.exit(
            f"{model}: vocabulary of {n_vocab} tokens; the benchmark prompts use ids up to {PROMPT_MAX_TOKEN}. "
            "To fix: use a model with a larger vocabulary"
        )
