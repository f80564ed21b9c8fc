"""`swarm models`: what each model file this host can see is, from its GGUF header alone (no weights).

worker.models finds the files (the default model, the Gemma 3 package, the models directory, --dir);
this module describes each: architecture, parameters, quant mix, size, maximum context and the KV
bytes per token of every format (per layer exactly; sliding-window layers at their window). A file
that cannot be read is described by its error, never raised.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swarm.errors import ModelFileError
from swarm.gguf_header import geometry_of, read_header
from swarm.planner import KV_FORMATS, EngineSettings
from worker.models import ModelEntry, known_models
from worker.settings import DEFAULT_ENGINE


@dataclass(frozen=True)
class KvCost:
    """One KV format's bytes on a model (the same format for K and V)."""

    bytes_per_token: int  # one position in every layer (what a full-attention cache would hold)
    global_bytes_per_token: int  # the global layers' bytes per position
    sliding_bytes_per_token: int  # the sliding-window layers' bytes per position (0: none)
    sliding_bytes_at_window: int  # the sliding layers at their full window (window x their bytes per token)
    bytes_at_max_context: int  # one sequence at the model's maximum context, as the engine reserves it


@dataclass(frozen=True)
class ModelSummary:
    name: str
    source: str
    path: str | None
    status: str  # "ready", "installed, not assembled (...)", or the error that stopped the header
    file_bytes: int = 0
    architecture: str = ""
    parameters: int = 0
    quant_mix: dict[str, int] = field(default_factory=dict)  # {ggml type: bytes}, largest first
    max_context: int = 0
    n_layer: int = 0
    sliding_layers: int = 0
    sliding_window: int = 0
    experts: str = ""  # "k of E" for a mixture of experts
    kv: dict[str, KvCost] = field(default_factory=dict)  # {format: cost}; formats the head dims allow

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe(entry: ModelEntry, settings: EngineSettings = DEFAULT_ENGINE) -> ModelSummary:
    """The summary of one listed model; a header that cannot be read gives its error as the status."""
    base = ModelSummary(entry.name, entry.source, None if entry.path is None else str(entry.path), entry.status)
    if entry.path is None:
        return base
    try:
        h = read_header(entry.path)
        geom = geometry_of(h)
    except (ModelFileError, OSError, ValueError) as e:
        return ModelSummary(entry.name, entry.source, str(entry.path), f"error: {e}")
    mix: Counter[str] = Counter()
    for t in h.tensors.values():
        mix[t.type_name] += t.nbytes
    kv = {}
    for f in KV_FORMATS:
        pair = (f, f)
        if not geom.supports(pair):
            continue
        g, s = geom.class_bytes_per_token(pair)
        kv[f] = KvCost(
            bytes_per_token=g + s,
            global_bytes_per_token=g,
            sliding_bytes_per_token=s,
            sliding_bytes_at_window=s * geom.sliding_window,
            bytes_at_max_context=geom.kv_bytes(geom.n_ctx, pair, settings),
        )
    return ModelSummary(
        name=entry.name,
        source=entry.source,
        path=str(entry.path),
        status="ready",
        file_bytes=h.file_bytes,
        architecture=geom.architecture,
        parameters=sum(t.n_elements for t in h.tensors.values()),
        quant_mix=dict(mix.most_common()),
        max_context=geom.n_ctx,
        n_layer=geom.n_layer,
        sliding_layers=geom.n_sliding,
        sliding_window=geom.sliding_window,
        experts=f"{geom.expert_used_count} of {geom.expert_count}" if geom.expert_count else "",
        kv=kv,
    )


def list_models(dirs: tuple[str | Path, ...] = ()) -> list[ModelSummary]:
    return [describe(e) for e in known_models(dirs)]


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def render(models: list[ModelSummary]) -> str:
    """The listing for people: one block per model."""
    out = []
    for m in models:
        head = f"{m.name}  [{m.source}]"
        if m.status != "ready":
            out.append(f"{head}\n  {m.path or ''}{'  ' if m.path else ''}{m.status}")
            continue
        total = sum(m.quant_mix.values()) or 1
        mix = ", ".join(f"{t} {b / total:.0%}" for t, b in m.quant_mix.items())
        arch = m.architecture + (f", {m.experts} experts" if m.experts else "")
        lines = [
            head,
            f"  {m.path}",
            f"  {arch}, {m.parameters / 1e6:,.1f}M parameters, {_size(m.file_bytes)}, {m.n_layer} layers, "
            f"max context {m.max_context:,}",
            f"  tensor types by bytes: {mix}",
        ]
        if m.sliding_layers:
            lines.append(
                f"  {m.sliding_layers} of {m.n_layer} layers slide over a {m.sliding_window:,}-token window "
                f"(their KV stops growing there)"
            )
        lines.append(f"  {'KV':<8} {'bytes/token':>12} {'sliding at window':>18} {'one sequence at max context':>28}")
        for f, c in m.kv.items():
            at_window = f"{c.sliding_bytes_at_window:,}" if m.sliding_layers else "-"
            per_token = f"{c.global_bytes_per_token:,}" + ("+" if m.sliding_layers else "")
            lines.append(f"  {f:<8} {per_token:>12} {at_window:>18} {_size(c.bytes_at_max_context):>28}")
        out.append("\n".join(lines))
    block, chunk = DEFAULT_ENGINE.block_tokens, DEFAULT_ENGINE.max_batch_tokens
    notes = (
        "bytes/token: the global layers' bytes per cached position (+: sliding layers add theirs up to their "
        f"window); max context: the blocks the engine reserves (block {block}, chunk {chunk})"
    )
    return "\n\n".join(out) + "\n\n" + notes
