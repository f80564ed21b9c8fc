"""Calibration: what each KV format costs on this machine, measured with the engine.

For every (K, V) format it measures
  * attention cost: decode-step time at several context lengths, fitted with a
    line; the slope divided by the layer count is the cost per cached position
    per layer (ns), the number the planner multiplies by context;
  * quality: mean KL divergence and top-1 agreement of next-token distributions
    against f32 KV over a fixed text shipped with the package (float32
    activations, so only the KV format differs);
and once the weight-stream time of a decode step for batch sizes 1..16.

Results are cached per (machine, model, engine build) in
$KVSWARM_CACHE/calibration (default ~/.cache/kvswarm) and re-measured on demand.
The result is plain data (the dict form of swarm.planner.Calibration): the
worker layer does not import the planner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from worker import _native
from worker.engine import KV_FORMATS, Engine, Sampling
from worker.models import resolve_model

CALIBRATION_TEXT = Path(__file__).parent / "data" / "calibration.txt"
# Positions at which attention cost is sampled; a line through them gives the per-position cost.
DEFAULT_CONTEXTS = (512, 2048, 4096, 7936)  # up to the default model's 8k: some formats' cost bends late
QUICK_CONTEXTS = (1024, 4096)
DEFAULT_BATCHES = tuple(range(1, 17))
QUICK_BATCHES = (1, 2, 4)
# Decode steps timed per point (after WARMUP_STEPS untimed ones); the median is kept.
STEPS, WARMUP_STEPS = 7, 2
QUALITY_TOKENS, QUICK_QUALITY_TOKENS = 320, 96
CACHE_VERSION = 1


def all_pairs() -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k in KV_FORMATS for v in KV_FORMATS)


def pair_name(pair: tuple[str, str]) -> str:
    return pair[0] if pair[0] == pair[1] else f"{pair[0]}/{pair[1]}"


@dataclasses.dataclass(frozen=True)
class CalibrationOptions:
    pairs: tuple[tuple[str, str], ...] = all_pairs()
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    batches: tuple[int, ...] = DEFAULT_BATCHES
    quality_tokens: int = QUALITY_TOKENS
    threads: int = 2

    @staticmethod
    def quick(threads: int = 2) -> CalibrationOptions:
        """Diagonal formats, two contexts, three batch sizes: a few seconds, for tests and demos."""
        return CalibrationOptions(
            pairs=tuple((f, f) for f in KV_FORMATS),
            contexts=QUICK_CONTEXTS,
            batches=QUICK_BATCHES,
            quality_tokens=QUICK_QUALITY_TOKENS,
            threads=threads,
        )


def machine_id() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    isa = _native.isa_levels()[-1] if _native.isa_levels() else "ref"
    return f"{platform.node()} | {cpu or platform.machine()} | {os.cpu_count()} cpus | {isa}"


def _file_digest(path: Path, head: int = 1 << 20) -> str:
    h = hashlib.sha256()
    h.update(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        h.update(f.read(head))
    return h.hexdigest()[:16]


def cache_key(model: Path, opts: CalibrationOptions) -> str:
    engine_build = _file_digest(Path(_native.__file__), head=1 << 30)
    parts = [machine_id(), _file_digest(model), engine_build, json.dumps(dataclasses.asdict(opts)), str(CACHE_VERSION)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_dir() -> Path:
    return Path(os.environ.get("KVSWARM_CACHE", Path.home() / ".cache" / "kvswarm")) / "calibration"


def _median_step(eng: Engine, ids: Sequence[int], steps: int = STEPS) -> float:
    """Median seconds of one decode step with every sequence in `ids` generating."""
    times = []
    for i in range(WARMUP_STEPS + steps):
        t0 = time.perf_counter()
        out = eng.step()
        dt = time.perf_counter() - t0
        if len(out) != len(ids):
            raise RuntimeError(f"calibration step advanced {len(out)} of {len(ids)} sequences")
        if i >= WARMUP_STEPS:
            times.append(dt)
    return float(np.median(times))


def _decode_at(eng: Engine, ids: Sequence[int], token: int) -> float:
    """Starts a generating turn of one token on each sequence and times decode steps."""
    turn = Sampling(max_new_tokens=WARMUP_STEPS + STEPS + 1)
    for sid in ids:
        eng.append(sid, [token], turn)
    eng.step()  # the appended token itself: a decode-shaped step
    t = _median_step(eng, ids)
    for sid in ids:  # write the lazily kept last token so the sequence can be extended again
        eng.finish(sid)
        eng.score(sid, [])
    return t


def measure_attention(model: Path, pair: tuple[str, str], contexts: Sequence[int], threads: int) -> tuple[float, float]:
    """(ns per position per layer, intercept seconds): a least-squares line through step time vs context."""
    eng = Engine(model, kv_k=pair[0], kv_v=pair[1], threads=threads, prefix_sharing=False)
    sid = eng.add_sequence([], generate=False)
    xs, ys = [], []
    limit = eng.config["n_ctx_train"] - WARMUP_STEPS - STEPS - 4  # room for the timed decode steps
    for ctx in sorted({min(c, limit) for c in contexts}):
        have = len(eng.tokens(sid))
        if ctx > have:
            eng.fill_kv(sid, ctx - have, seed=ctx)
        ys.append(_decode_at(eng, [sid], token=1))
        xs.append(len(eng.tokens(sid)))
    slope, intercept = np.polyfit(np.array(xs, dtype=np.float64), np.array(ys), 1)
    return max(float(slope), 0.0) / eng.config["n_layer"] * 1e9, float(intercept)


def measure_weight_stream(model: Path, batches: Sequence[int], threads: int) -> tuple[float, ...]:
    """Decode-step seconds for batches of b sequences at a 16-position context, b = 1..max(batches);
    sizes between the measured ones are interpolated."""
    eng = Engine(model, kv_k="f16", kv_v="f16", threads=threads, prefix_sharing=False)
    measured: dict[int, float] = {}
    for b in sorted(set(batches)):
        ids = [eng.add_sequence([], generate=False) for _ in range(b)]
        for sid in ids:
            eng.fill_kv(sid, 16, seed=sid)
        measured[b] = _decode_at(eng, ids, token=1)
        for sid in ids:
            eng.free(sid)
    xs = sorted(measured)
    full = np.interp(np.arange(1, xs[-1] + 1), xs, [measured[x] for x in xs])
    return tuple(float(t) for t in np.maximum.accumulate(full))  # a bigger batch is never faster per step


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def measure_quality(
    model: Path, pairs: Iterable[tuple[str, str]], n_tokens: int, threads: int
) -> dict[str, dict[str, float]]:
    """Mean KL(f32 || format) and top-1 agreement over the shipped text, float32 activations."""
    ref_eng = Engine(model, kv_k="f32", kv_v="f32", threads=threads, float_activations=True)
    tokens = ref_eng.tokenizer.encode(CALIBRATION_TEXT.read_text())[:n_tokens]
    ref = _log_softmax(ref_eng.score(ref_eng.add_sequence([], generate=False), tokens))
    out = {}
    for pair in pairs:
        if pair == ("f32", "f32"):
            out[pair_name(pair)] = {"mean_kl": 0.0, "top1": 1.0}
            continue
        eng = Engine(model, kv_k=pair[0], kv_v=pair[1], threads=threads, float_activations=True)
        logp = _log_softmax(eng.score(eng.add_sequence([], generate=False), tokens))
        kl = float(np.mean(np.sum(np.exp(ref) * (ref - logp), axis=1)))
        top1 = float(np.mean(logp.argmax(axis=1) == ref.argmax(axis=1)))
        out[pair_name(pair)] = {"mean_kl": max(kl, 0.0), "top1": top1}
    return out


def calibrate(
    model: str | Path | None = None,
    opts: CalibrationOptions | None = None,
    *,
    remeasure: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measures (or loads from the cache) this machine's calibration for `model`:
    {source, machine, weight_step_s, attn_ns, quality} (swarm.planner.Calibration.from_dict reads it)."""
    opts = opts or CalibrationOptions()
    path = resolve_model(model)
    say = progress or (lambda _msg: None)
    cache_file = cache_dir() / f"{cache_key(path, opts)}.json"
    if cache_file.is_file() and not remeasure:
        try:
            cached = json.loads(cache_file.read_text())["calibration"]
            if isinstance(cached, dict) and cached.get("source") == "measured":
                return cached
        except (KeyError, ValueError, TypeError, json.JSONDecodeError):
            say(f"ignoring unreadable calibration cache {cache_file}")
    say(f"measuring weight-stream time for batches up to {max(opts.batches)}")
    weight = measure_weight_stream(path, opts.batches, opts.threads)
    attn = {}
    for pair in opts.pairs:
        say(f"measuring attention cost of {pair_name(pair)} at contexts {', '.join(map(str, opts.contexts))}")
        attn[pair_name(pair)] = measure_attention(path, pair, opts.contexts, opts.threads)[0]
    say(f"measuring quality of {len(opts.pairs)} formats against f32 over {opts.quality_tokens} tokens")
    quality = measure_quality(path, opts.pairs, opts.quality_tokens, opts.threads)
    cal = {
        "source": "measured",
        "machine": machine_id(),
        "weight_step_s": list(weight),
        "attn_ns": attn,
        "quality": quality,
    }
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "model": str(path),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "options": dataclasses.asdict(opts),
        "calibration": cal,
    }
    tmp = cache_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(cache_file)
    return cal
