"""Park calibration: what parking, restoring and re-prefilling one session costs here, per KV format.

For each (K, V) format it prefills a session of each of `SIZES` tokens (timed: the re-prefill),
snapshots it (`Engine.export_kv`: park to RAM), writes the snapshot as a park file (park to
disk: the snapshot plus the file), imports it back from memory (restore from RAM) and from the
file (restore from disk: read, checksum, import). Each repeat fits a line through its sizes;
the slope is one estimate of the ns per token and the intercept of the fixed ns. The result is
the median of the repeats with the interquartile interval (worker/calibrate_stats.py), in the
form `worker.lifecycle.ParkCosts.from_dict` reads.

A few hundred ms on the default model: the re-prefills dominate (SIZES add up to 20 tokens per
repeat). Cached next to the other calibration data (worker/calibrate.py's directory and key
scheme); an entry from another engine build is measured again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from worker.calibrate import _file_digest, cache_dir, engine_build, machine_id
from worker.calibrate_stats import INTERVAL, Estimate
from worker.engine import Engine
from worker.formats import pair_name
from worker.models import resolve_model
from worker.park import ParkedKV
from worker.settings import DEFAULT_ENGINE

# Session lengths timed (tokens): two points give each repeat's line; short enough to stay within a
# few hundred ms of prefill, far enough apart that the slope is not all noise.
SIZES = (4, 16)
# Repeats: the median is the estimate, the quartiles its interval (three is the fewest with an interval).
REPEATS = 3
OPS = ("park_ram", "restore_ram", "park_disk", "restore_disk", "reprefill")
CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ParkCalibrationOptions:
    pairs: tuple[tuple[str, str], ...] = (("f16", "f16"),)
    sizes: tuple[int, ...] = SIZES
    repeats: int = REPEATS
    threads: int = DEFAULT_ENGINE.threads


def cache_key(model: Path, opts: ParkCalibrationOptions) -> str:
    parts = ["park", machine_id(), _file_digest(model), json.dumps(dataclasses.asdict(opts)), str(CACHE_VERSION)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _time(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter_ns()
    out = fn()
    return float(time.perf_counter_ns() - t0), out


def _measure_pair(model: Path, pair: tuple[str, str], opts: ParkCalibrationOptions, work: Path) -> dict[str, Any]:
    eng = Engine(model, kv_k=pair[0], kv_v=pair[1], threads=opts.threads, prefix_sharing=False)
    n_vocab = int(eng.config["n_vocab"])
    digest = _file_digest(eng.model_path)
    # {op: [(tokens, ns), ...] per repeat}
    points: dict[str, list[list[tuple[int, float]]]] = {op: [[] for _ in range(opts.repeats)] for op in OPS}
    for r in range(opts.repeats):
        for n in opts.sizes:
            tokens = [(1 + 7 * i + 13 * r) % n_vocab for i in range(n)]

            def prefill(tokens: list[int] = tokens) -> int:
                sid = eng.add_sequence(tokens, generate=False)
                while eng.busy():
                    eng.step()
                return sid

            ns, seq = _time(prefill)
            points["reprefill"][r].append((n, ns))
            ns, blob = _time(lambda seq=seq: eng.export_kv(seq))
            points["park_ram"][r].append((n, ns))
            path = work / f"calibrate-{pair_name(pair).replace('/', '-')}-{n}.park"

            def park_disk(seq: int = seq, path: Path = path) -> None:
                parked = ParkedKV("calibration", tuple(eng.tokens(seq)), pair[0], pair[1], digest,
                                  eng.export_kv(seq), time.time())  # fmt: skip
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(parked.to_bytes())
                tmp.replace(path)

            ns, _ = _time(park_disk)
            points["park_disk"][r].append((n, ns))
            eng.free(seq)
            ns, seq = _time(lambda blob=blob: eng.import_kv(blob))
            points["restore_ram"][r].append((n, ns))
            eng.free(seq)
            ns, seq = _time(lambda path=path: eng.import_kv(ParkedKV.from_bytes(path.read_bytes(), digest).payload))
            points["restore_disk"][r].append((n, ns))
            eng.free(seq)
            path.unlink(missing_ok=True)
    out: dict[str, Any] = {}
    for op in OPS:
        slopes, fixed = [], []
        for pts in points[op]:
            xs = np.array([x for x, _ in pts], dtype=np.float64)
            ys = np.array([y for _, y in pts], dtype=np.float64)
            slope, icpt = np.polyfit(xs, ys, 1)
            slopes.append(float(slope))
            fixed.append(float(icpt))
        per_token, icpt_est = Estimate.of(slopes), Estimate.of(fixed)
        out[op] = {"per_token_ns": per_token.median, "per_token_ns_interval": [per_token.low, per_token.high],
                   "fixed_ns": icpt_est.median, "fixed_ns_interval": [icpt_est.low, icpt_est.high],
                   "samples": [[list(p) for p in pts] for pts in points[op]]}  # fmt: skip
    return out


def calibrate_park(
    model: str | Path | None = None,
    opts: ParkCalibrationOptions | None = None,
    *,
    work_dir: Path | None = None,
    remeasure: bool = False,
) -> dict[str, Any]:
    """{"source": "measured", "machine", "engine_build", "interval", "formats": {pair name: {op: {per_token_ns,
    per_token_ns_interval, fixed_ns, fixed_ns_interval, samples}}}}, cached per (machine, model, options).

    work_dir: where the park files are written while timing (the park directory's file system)."""
    opts = opts or ParkCalibrationOptions()
    if opts.repeats < 3:
        raise ValueError(f"park calibration repeats must be at least 3 for an interval, got {opts.repeats}")
    if len(set(opts.sizes)) < 2 or min(opts.sizes) < 1:
        raise ValueError(f"park calibration needs two or more distinct positive sizes, got {opts.sizes}")
    path = resolve_model(model)
    build = engine_build()
    cache_file = cache_dir() / f"park-{cache_key(path, opts)}.json"
    if not remeasure and cache_file.is_file():
        try:
            record = json.loads(cache_file.read_text())
            if record.get("engine_build") == build and record["calibration"]["source"] == "measured":
                return dict(record["calibration"])
        except (KeyError, ValueError, TypeError, OSError):
            pass  # corrupt: measured again and rewritten
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvswarm-park-cal-", dir=work_dir) as tmp:
        formats = {pair_name(p): _measure_pair(path, p, opts, Path(tmp)) for p in opts.pairs}
    cal = {"source": "measured", "machine": machine_id(), "engine_build": build, "interval": INTERVAL,
           "repeats": opts.repeats, "sizes": list(opts.sizes), "formats": formats}  # fmt: skip
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = cache_file.with_suffix(f".{os.getpid()}.tmp")
    tmp_file.write_text(json.dumps({"model": str(path), "engine_build": build, "options": dataclasses.asdict(opts),
                                    "calibration": cal}, indent=1))  # fmt: skip
    tmp_file.replace(cache_file)
    return cal
