"""Calibration: what each KV format costs on this machine, measured with the engine, with error bars.

For every (K, V) format it measures
  * attention cost: decode-step time at several context lengths; each repeat
    fits a line through its points, and the slope divided by the layer count is
    one estimate of the cost per cached position per layer (ns). The repeats
    interleave the formats (every format is timed at a context before any
    format moves on, in an order that rotates per repeat), so drift in the
    machine's speed hits every format alike;
  * quality: mean KL divergence and top-1 agreement of next-token distributions
    against f32 KV over a fixed text shipped with the package (float32
    activations, so only the KV format differs);
and the weight-stream time of a decode step for several batch sizes, with the
batch sizes interleaved the same way.

Every cost is reported as the median of its repeats with the interquartile
range of the repeats as its interval (`INTERVAL`). A fit whose median slope is
not positive, whose interval reaches zero, or whose pooled R^2 is poor is
measured again (`MAX_ROUNDS`); one that stays so is flagged unreliable, never
clamped. The planner plans a worker with an unreliable calibration from its
measured read bandwidth ("predicted from catalog"), not from these numbers.

Results are cached per (machine, model, options) in $KVSWARM_CACHE/calibration
(default ~/.cache/kvswarm); an entry that is corrupt or from another engine
build is ignored with a one-line warning and measured again. The result is
plain data (the dict form of swarm.planner.Calibration): the worker layer does
not import the planner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from worker import _native
from worker.calibrate_stats import INTERVAL, AttentionFit, Estimate, attention_problem
from worker.calibrate_stats import MIN_R2 as MIN_R2  # re-exported: tests read the threshold here
from worker.calibrate_stats import pooled_r2 as _r2
from worker.devices import backend_kwargs, check_backend
from worker.engine import Engine, read_gguf
from worker.formats import KV_FORMATS, all_pairs, kv_row_bytes, pair_name
from worker.host import available_memory
from worker.models import attention_layout, resolve_model
from worker.sampling import Sampling
from worker.settings import DEFAULT_ENGINE

CALIBRATION_TEXT = Path(__file__).parent / "data" / "calibration.txt"
# Positions at which attention cost is sampled; a line through them gives the per-position cost.
DEFAULT_CONTEXTS = (512, 2048, 4096, 7936)  # up to the default model's 8k: some formats' cost bends late
QUICK_CONTEXTS = (1024, 4096)
DEFAULT_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16)  # sizes between them are interpolated
QUICK_BATCHES = (1, 2, 4)
# Repeats of every measurement: the median is the estimate, the quartiles its interval. Five is the
# fewest whose interquartile range is not just the two extremes' neighbours.
DEFAULT_REPEATS, QUICK_REPEATS = 7, 5
# Decode steps timed per point (after WARMUP_STEPS untimed ones); their median is one sample.
STEPS, WARMUP_STEPS = 5, 1
QUALITY_TOKENS, QUICK_QUALITY_TOKENS = 320, 96
# Rounds of repeats for an unreliable fit before it is flagged (the first round plus re-measurements).
MAX_ROUNDS = 3
# Share of MemAvailable the KV of the formats measured side by side may take (formats beyond it are
# interleaved in groups).
_MEMORY_SHARE = 0.25
CACHE_VERSION = 2


@dataclasses.dataclass(frozen=True)
class CalibrationOptions:
    pairs: tuple[tuple[str, str], ...] = all_pairs()
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    batches: tuple[int, ...] = DEFAULT_BATCHES
    quality_tokens: int = QUALITY_TOKENS
    threads: int = DEFAULT_ENGINE.threads
    repeats: int = DEFAULT_REPEATS
    backend: str = "cpu"  # the engine's backend: "cpu" or "vulkan" (worker.devices.BACKENDS)
    device: int = 0  # backend vulkan: the Vulkan device index

    @staticmethod
    def quick(threads: int = DEFAULT_ENGINE.threads) -> CalibrationOptions:
        """Diagonal formats, two contexts, three batch sizes: seconds, for tests and demos."""
        return CalibrationOptions(
            pairs=tuple((f, f) for f in KV_FORMATS),
            contexts=QUICK_CONTEXTS,
            batches=QUICK_BATCHES,
            quality_tokens=QUICK_QUALITY_TOKENS,
            threads=threads,
            repeats=QUICK_REPEATS,
        )


def machine_id(backend: str = "cpu", device: int = 0) -> str:
    """This host (name, CPU, cpus, best ISA level); for backend vulkan also the GPU and its driver."""
    host = _host_id()
    if backend == "cpu":
        return host
    gpu = check_backend(backend, device)
    assert gpu is not None  # check_backend returns the device for every backend but the CPU
    return f"{host} | {gpu.label} {gpu.driver_version}"


def _host_id() -> str:
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


def engine_build() -> str:
    """Digest of the compiled engine: a calibration is only valid for the build that measured it."""
    return _file_digest(Path(_native.__file__), head=1 << 30)


def cache_key(model: Path, opts: CalibrationOptions) -> str:
    """Per machine, model file, options and cache version; a GPU's calibration also per device and driver
    (machine_id names them). A CPU calibration's key leaves the backend out (it is what it was before GPUs)."""
    options = dataclasses.asdict(opts)
    if opts.backend == "cpu":
        del options["backend"], options["device"]
    parts = [machine_id(opts.backend, opts.device), _file_digest(model), json.dumps(options), str(CACHE_VERSION)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_dir() -> Path:
    return Path(os.environ.get("KVSWARM_CACHE", Path.home() / ".cache" / "kvswarm")) / "calibration"


# -- timing --------------------------------------------------------------------------


def _median_step(eng: Engine, ids: Sequence[int]) -> float:
    """Median seconds of one decode step with every sequence in `ids` generating."""
    times = []
    for i in range(WARMUP_STEPS + STEPS):
        t0 = time.perf_counter()
        out = eng.step()
        dt = time.perf_counter() - t0
        if len(out) != len(ids):
            raise RuntimeError(f"calibration step advanced {len(out)} of {len(ids)} sequences")
        if i >= WARMUP_STEPS:
            times.append(dt)
    return float(np.median(times))


def _decode_at(eng: Engine, ids: Sequence[int], token: int) -> float:
    """Starts a generating turn of one token on each sequence and times decode steps.

    Sequence i is given token + i (so a mixture of experts routes a batch's rows apart, as real
    sequences do, instead of every row alike)."""
    turn = Sampling(max_new_tokens=WARMUP_STEPS + STEPS + 1)
    n_vocab = int(eng.config["n_vocab"])
    for i, sid in enumerate(ids):
        eng.append(sid, [(token + i) % n_vocab], turn)
    eng.step()  # the appended token itself: a decode-shaped step
    t = _median_step(eng, ids)
    for sid in ids:  # write the lazily kept last token so the sequence can be extended again
        eng.finish(sid)
        eng.score(sid, [])
    return t


def kv_layout(model: Path) -> list[tuple[int, int, int, int]]:
    """Per layer (n_kv_head, key_dim, value_dim, window) from the model's header (worker.models' rule)."""
    meta = read_gguf(model)["metadata"]
    arch = meta.get("general.architecture")
    return attention_layout(meta, int(meta[f"{arch}.block_count"]))


def attended_positions(layout: Sequence[tuple[int, int, int, int]], context: int) -> int:
    """(layer, cached position) pairs a decode step at `context` reads: sliding layers stop at their window."""
    return sum(min(context, w) if w else context for _, _, _, w in layout)


def _memory_groups(
    model: Path, pairs: Sequence[tuple[str, str]], max_ctx: int, memory: int | None = None
) -> list[list[tuple[str, str]]]:
    """Splits the pairs into groups whose KV at max_ctx fits in _MEMORY_SHARE of `memory` (default: this
    host's available memory; a GPU's device memory for backend vulkan) (on a big host: one group, every
    format interleaved with every other). A sliding layer holds at most its window plus one step's tokens."""
    layout = kv_layout(model)
    budget = _MEMORY_SHARE * (available_memory() if memory is None else memory)
    groups: list[list[tuple[str, str]]] = [[]]
    used = 0
    for k, v in pairs:
        need = sum(
            h
            * (kv_row_bytes(k, kd) + kv_row_bytes(v, vd))
            * (min(max_ctx, w + DEFAULT_ENGINE.max_batch_tokens) if w else max_ctx)
            for h, kd, vd, w in layout
        )
        if groups[-1] and used + need > budget:
            groups.append([])
            used = 0
        groups[-1].append((k, v))
        used += need
    return groups


def measure_attention(
    model: Path,
    pairs: Sequence[tuple[str, str]],
    contexts: Sequence[int],
    threads: int,
    repeats: int,
    backend: str = "cpu",
    device: int = 0,
) -> dict[tuple[str, str], AttentionFit]:
    """For each pair: `repeats` slope estimates (ns per position per layer), the formats interleaved.

    Each pair's engine holds one sequence that grows through the contexts; at each context every
    pair is timed `repeats` times, in an order that rotates per repeat. Repeat r's slope is the
    least-squares line through its points at every context. An unreliable fit is measured again
    (a fresh sequence, `repeats` more samples) up to MAX_ROUNDS rounds in all.
    """
    out: dict[tuple[str, str], AttentionFit] = {}
    gpu = check_backend(backend, device)
    memory = gpu.memory_budget_bytes if gpu is not None else None  # where the KV lives
    todo = list(pairs)
    samples: dict[tuple[str, str], list[float]] = {p: [] for p in pairs}
    points: dict[tuple[str, str], list[tuple[int, float]]] = {p: [] for p in pairs}
    for _round in range(MAX_ROUNDS):
        if not todo:
            break
        for group in _memory_groups(model, todo, max(contexts), memory):
            _measure_group(model, group, contexts, threads, repeats, samples, points, backend, device)
        again = []
        for p in todo:
            est = Estimate.of(samples[p])
            r2 = _r2([x for x, _ in points[p]], [y for _, y in points[p]])
            problem = attention_problem(est, r2)
            out[p] = AttentionFit(est, r2, tuple(samples[p]), problem)
            if problem:
                again.append(p)
        todo = again
    return out


def _measure_group(
    model: Path,
    group: Sequence[tuple[str, str]],
    contexts: Sequence[int],
    threads: int,
    repeats: int,
    samples: dict[tuple[str, str], list[float]],
    points: dict[tuple[str, str], list[tuple[int, float]]],
    backend: str = "cpu",
    device: int = 0,
) -> None:
    on = backend_kwargs(backend, device)
    engines = {p: Engine(model, kv_k=p[0], kv_v=p[1], threads=threads, prefix_sharing=False, **on) for p in group}
    seqs = {p: e.add_sequence([], generate=False) for p, e in engines.items()}
    layout = kv_layout(model)
    n_ctx = next(iter(engines.values())).config["n_ctx_train"]
    limit = n_ctx - len(contexts) * repeats * (WARMUP_STEPS + STEPS + 2) - 4  # room for every timed step
    points_at = sorted({min(c, limit) for c in contexts if min(c, limit) > 0})
    if len(points_at) < 2 and limit >= 8:  # a short-context model: two points inside its context
        points_at = [limit // 4, limit]
    if len(points_at) < 2:
        raise ValueError(
            f"calibration: the model's {n_ctx}-token context leaves room for fewer than two of the contexts "
            f"{list(contexts)} after the timed steps. To fix: calibrate with smaller contexts or a longer-context model"
        )
    per_repeat: dict[tuple[str, str], list[list[tuple[int, float]]]] = {p: [[] for _ in range(repeats)] for p in group}
    for ctx in points_at:
        for p in group:
            have = len(engines[p].tokens(seqs[p]))
            if ctx > have:
                engines[p].fill_kv(seqs[p], ctx - have, seed=ctx)
        for r in range(repeats):
            order = list(group[r % len(group) :]) + list(group[: r % len(group)])
            for p in order:
                y = _decode_at(engines[p], [seqs[p]], token=1)
                # x: (layer, position) pairs the step reads, so the slope is per position per layer
                # with sliding-window layers counted only up to their window
                per_repeat[p][r].append((attended_positions(layout, len(engines[p].tokens(seqs[p]))), y))
    for p in group:
        for pts in per_repeat[p]:
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            slope = float(np.polyfit(np.array(xs, dtype=np.float64), np.array(ys), 1)[0]) if len(set(xs)) > 1 else 0.0
            samples[p].append(slope * 1e9)
            points[p].extend(pts)


def measure_weight_stream(
    model: Path, batches: Sequence[int], threads: int, repeats: int, backend: str = "cpu", device: int = 0
) -> tuple[tuple[Estimate, ...], dict[int, tuple[float, ...]]]:
    """Decode-step seconds for batches of b sequences at a 16-position context, b = 1..max(batches).

    The measured sizes are interleaved (an order rotating per repeat), every repeat on fresh
    16-position sequences; sizes between measured ones are interpolated. Nothing forces the curve
    to rise: it is what was measured. Returns (an Estimate per b, {measured b: samples}).
    """
    on = backend_kwargs(backend, device)
    eng = Engine(model, kv_k="f16", kv_v="f16", threads=threads, prefix_sharing=False, **on)
    sizes = sorted(set(batches))
    samples: dict[int, list[float]] = {b: [] for b in sizes}
    for r in range(repeats):
        for b in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
            ids = [eng.add_sequence([], generate=False) for _ in range(b)]
            for sid in ids:
                eng.fill_kv(sid, 16, seed=sid)
            samples[b].append(_decode_at(eng, ids, token=1))
            for sid in ids:
                eng.free(sid)
    est = {b: Estimate.of(samples[b]) for b in sizes}
    grid = np.arange(1, sizes[-1] + 1)
    cols = [np.interp(grid, sizes, [getattr(est[b], f) for b in sizes]) for f in ("median", "low", "high")]
    full = tuple(Estimate(float(m), float(lo), float(hi)) for m, lo, hi in zip(*cols, strict=True))
    return full, {b: tuple(v) for b, v in samples.items()}


def read_bandwidth(backend: str, device: int, threads: int) -> float:
    """Bytes per second a streaming read sustains: host memory for the CPU, device memory for Vulkan (a
    device-local copy, counting the bytes read and written; NOTE: 0 until the module has the copy timer)."""
    if backend == "cpu":
        return float(_native.measure_read_bandwidth(threads, 1 << 28, 3))
    if not hasattr(_native, "_backend_copy_bandwidth"):
        return 0.0
    return float(_native._backend_copy_bandwidth(backend, device, 1 << 28, 5))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    out: np.ndarray = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return out


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


def _warn(message: str) -> None:
    print(f"kvswarm: {message}", file=sys.stderr)


def _read_cache(cache_file: Path, build: str) -> dict[str, Any] | None:
    """The cached calibration, or None (with a one-line warning when the entry is unusable)."""
    if not cache_file.is_file():
        return None
    try:
        record = json.loads(cache_file.read_text())
        cached = record["calibration"]
        if not isinstance(cached, dict) or cached.get("source") != "measured":
            raise ValueError("not a measured calibration")
        if record.get("engine_build") != build:
            _warn(f"calibration cache {cache_file.name} is from another engine build; measuring again")
            return None
        return cached
    except (KeyError, ValueError, TypeError, OSError) as e:  # json.JSONDecodeError is a ValueError
        _warn(f"ignoring corrupt calibration cache {cache_file} ({type(e).__name__}: {e}); measuring again")
        return None


def calibrate(
    model: str | Path | None = None,
    opts: CalibrationOptions | None = None,
    *,
    remeasure: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measures (or loads from the cache) this machine's calibration for `model`.

    Returns the dict that swarm.planner.Calibration.from_dict reads: source, machine, engine_build,
    weight_step_s (medians, batch 1..max) and weight_step_s_interval, attn_ns (medians) and
    attention ({pair: ns_per_position_layer, ns_per_position_layer_interval, r2, samples,
    reliable}), quality, reliable and problems, read_bytes_per_s and the interval's definition.
    """
    opts = opts or CalibrationOptions()
    if opts.repeats < 3:
        raise ValueError(f"calibration repeats must be at least 3 for an interval, got {opts.repeats}")
    path = resolve_model(model)
    say = progress or (lambda _msg: None)
    build = engine_build()
    check_backend(opts.backend, opts.device)  # DeviceError naming the fix, before any measurement
    cache_file = cache_dir() / f"{cache_key(path, opts)}.json"
    if not remeasure:
        cached = _read_cache(cache_file, build)
        if cached is not None:
            return cached
    say(f"measuring weight-stream time for batches {', '.join(map(str, opts.batches))} x {opts.repeats} repeats")
    weight, _ = measure_weight_stream(path, opts.batches, opts.threads, opts.repeats, opts.backend, opts.device)
    names = ", ".join(pair_name(p) for p in opts.pairs)
    say(f"measuring attention cost of {names} at contexts {', '.join(map(str, opts.contexts))}, interleaved")
    fits = measure_attention(path, opts.pairs, opts.contexts, opts.threads, opts.repeats, opts.backend, opts.device)
    # NOTE: quality is measured on the CPU engine for every backend: it is the KV format's effect on the
    # model's outputs (float32 activations), not a property of the device that runs it.
    say(f"measuring quality of {len(opts.pairs)} formats against f32 over {opts.quality_tokens} tokens")
    quality = measure_quality(path, opts.pairs, opts.quality_tokens, opts.threads)
    problems = [f"{pair_name(p)}: {f.problem} after {MAX_ROUNDS} rounds" for p, f in fits.items() if f.problem]
    bad_weight = [b + 1 for b, e in enumerate(weight) if not e.median > 0]
    if bad_weight:
        problems.append(f"weight step: non-positive time at batches {bad_weight}")
    cal = {
        "source": "measured",
        "machine": machine_id(opts.backend, opts.device),
        "engine_build": build,
        "interval": INTERVAL,
        "repeats": opts.repeats,
        "weight_step_s": [e.median for e in weight],
        "weight_step_s_interval": [[e.low, e.high] for e in weight],
        "attn_ns": {pair_name(p): f.estimate.median for p, f in fits.items()},
        "attention": {pair_name(p): f.to_dict() for p, f in fits.items()},
        "quality": quality,
        "reliable": not problems,
        "problems": problems,
        "read_bytes_per_s": read_bandwidth(opts.backend, opts.device, opts.threads),
    }
    for msg in problems:
        _warn(f"unreliable calibration: {msg}; plans for this host will use its bandwidth instead")
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "model": str(path),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine_build": build,
        "options": dataclasses.asdict(opts),
        "calibration": cal,
    }
    tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(cache_file)
    return cal
