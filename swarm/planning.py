"""From a swarm config to planner inputs: model geometry, device profiles, agent groups, policy.

The planner stays pure; this module is where measured facts are gathered
(the GGUF header, this host's calibration, the catalog, the tokenizer).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm import planner
from swarm.config import SwarmConfig, Worker
from swarm.devices import load_catalog
from swarm.errors import ConfigError
from swarm.gguf_header import read_geometry
from worker.host import available_memory


@dataclass(frozen=True)
class PlanInputs:
    geometry: planner.ModelGeometry
    devices: tuple[planner.DeviceProfile, ...]
    groups: tuple[planner.AgentGroup, ...]
    policy: planner.Policy
    settings: planner.EngineSettings
    quality: dict[str, planner.Quality]
    model_path: Path | None
    # {"vulkan:<index>": memory budget bytes} of each local GPU a `backend: vulkan` worker runs on (its device
    # heap, uncapped by any worker's `memory:`): the KV resource `swarm launch` gives Ray for that device.
    gpu_memory: dict[str, int] = field(default_factory=dict)


def model_geometry(cfg: SwarmConfig) -> tuple[planner.ModelGeometry, Path | None]:
    g = cfg.model.geometry
    if g is not None:
        n_head = g.n_head or 4 * g.n_kv_head
        geom = planner.ModelGeometry(
            name=g.name, n_layer=g.n_layer, n_head=n_head, n_kv_head=g.n_kv_head, head_dim=g.head_dim,
            n_embd=n_head * g.head_dim, n_ff=4 * n_head * g.head_dim, n_vocab=g.n_vocab, n_ctx=g.n_ctx,
            weight_stream_bytes=int(g.weight_bytes), resident_bytes=int(g.weight_bytes),
        )  # fmt: skip
        return geom, None
    from worker.errors import ModelNotFoundError
    from worker.models import resolve_model  # the default model's location, a `swarm models` name or a path

    try:
        path = resolve_model(cfg.model.path)
    except ModelNotFoundError as e:
        raise ConfigError(
            "model.path", str(e).split(". To fix:")[0], "give a GGUF path or a name `swarm models` lists"
        ) from None
    return read_geometry(path), path


def shared_prefix_tokens(cfg: SwarmConfig, model_path: Path | None) -> list[int]:
    """Tokens of each group's system prompt as the chat template renders it (the prefix every agent shares)."""
    out = []
    tok = None
    for i, g in enumerate(cfg.agents):
        if g.shared_prefix_tokens is not None:
            out.append(g.shared_prefix_tokens)
        elif not g.system_prompt:
            out.append(0)
        elif model_path is None:
            raise ConfigError(
                f"agents[{i}].shared_prefix_tokens", "is needed: the model is given by geometry, with no tokenizer",
                "set shared_prefix_tokens or drop system_prompt",
            )  # fmt: skip
        else:
            if tok is None:
                from worker.engine import load_tokenizer

                tok = load_tokenizer(model_path)
            system = [{"role": "system", "content": g.system_prompt}]
            out.append(len(tok.encode(tok.render_chat(system, add_generation_prompt=False), add_bos=False)))
    return out


def local_gpu(w: Worker, where: str) -> tuple[str, int]:
    """(device id "vulkan:<index>", memory budget bytes) of a local `backend: vulkan` worker's GPU: the device
    heap's VK_EXT_memory_budget budget, else its size. ConfigError when this host lacks it (the message says
    what to install, or lists the devices there are)."""
    from worker.devices import vulkan_device
    from worker.errors import DeviceError

    try:
        gpu = vulkan_device(w.vulkan_index)
    except DeviceError as e:
        problem, _, fix = str(e).partition(". To fix: ")
        raise ConfigError(f"{where}.device" if w.device is not None else f"{where}.backend", problem,
                          fix or "run `swarm devices` to see what this host offers") from None  # fmt: skip
    return f"vulkan:{gpu.index}", gpu.memory_budget_bytes


def plan_inputs(
    cfg: SwarmConfig,
    *,
    calibrate: Callable[..., dict[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> PlanInputs:
    """calibrate(model_path, mode, threads) -> calibration dict, for local workers (default: worker.calibrate);
    for a `backend: vulkan` worker it is called with backend= and device= keywords too."""
    geom, path = model_geometry(cfg)
    for i, g in enumerate(cfg.agents):
        if g.context > geom.n_ctx:
            raise ConfigError(
                f"agents[{i}].context", f"{g.context:,} exceeds the model's {geom.n_ctx:,} tokens",
                "lower context or use a model with a longer context",
            )  # fmt: skip
    catalog = load_catalog()
    if cfg.policy.pairs:
        pairs = tuple(planner.parse_pair(p) for p in cfg.policy.pairs)
    else:
        pairs = tuple(itertools.product(cfg.policy.formats, cfg.policy.formats))
    qf = cfg.policy.quality_floor
    floor = None if qf.max_kl is None and qf.min_top1 is None else planner.QualityFloor(qf.max_kl, qf.min_top1)
    policy = planner.Policy(formats=pairs, objective=cfg.policy.objective, quality_floor=floor)
    devices = []
    quality: dict[str, planner.Quality] = {}
    gpu_memory: dict[str, int] = {}
    for i, w in enumerate(cfg.workers):
        # A local worker's memory: this host's RAM, or with backend vulkan its GPU's device heap.
        dev_id, backend, memory = "local", "cpu", available_memory()
        on: dict[str, Any] = {}  # calibrate's keywords for a GPU worker
        if w.kind == "local" and w.backend == "vulkan":
            dev_id, memory = local_gpu(w, f"workers[{i}]")
            gpu_memory[dev_id] = memory
            backend = "vulkan"
            on = {"backend": "vulkan", "device": w.vulkan_index}
        if w.kind == "local" and w.calibration_file:
            cal = trusted_calibration(
                read_calibration_file(w.calibration_file, f"workers[{i}].calibration_file"), geom, pairs
            )
            quality = quality or cal.quality
            usable = min(w.memory or memory, memory)
            devices.append(planner.DeviceProfile(w.name, dev_id, backend, int(usable), cal))
            continue
        if w.kind == "local" and w.calibration != "catalog":
            if path is None:
                raise ConfigError(
                    f"workers[{i}].calibration", "cannot measure a model given only by geometry",
                    "use calibration: catalog with a device, or give model.path",
                )  # fmt: skip
            if calibrate is None:
                from worker.calibrate import CalibrationOptions
                from worker.calibrate import calibrate as measure

                def calibrate(
                    p: Path, mode: str, threads: int, backend: str = "cpu", device: int = 0
                ) -> dict[str, Any]:
                    opts = CalibrationOptions.quick(threads) if mode == "quick" else CalibrationOptions(threads=threads)
                    opts = dataclasses.replace(opts, backend=backend, device=device)
                    return measure(p, opts, progress=progress)

            cal = trusted_calibration(
                planner.Calibration.from_dict(calibrate(path, w.calibration, cfg.engine.threads, **on)), geom, pairs
            )
            quality = quality or cal.quality
            usable = min(w.memory or memory, memory)
            devices.append(planner.DeviceProfile(w.name, dev_id, backend, int(usable), cal))
            continue
        if w.kind == "local":
            raise ConfigError(f"workers[{i}].calibration", "catalog needs a device", "use kind: virtual with a device")
        spec = catalog[str(w.device or "")]
        cal = planner.Calibration.from_bandwidth(geom, spec.effective_bandwidth, pairs)
        usable = min(w.memory, spec.usable_bytes) if w.memory else spec.usable_bytes
        devices.append(planner.DeviceProfile(w.name, spec.id, spec.backend, int(usable), cal))
    prefixes = shared_prefix_tokens(cfg, path)
    groups = tuple(
        planner.AgentGroup(
            name=g.name, count=g.count, context=g.context, shared_prefix_tokens=min(prefix, g.context),
            max_kl=g.min_quality.max_kl, min_top1=g.min_quality.min_top1,
        )
        for g, prefix in zip(cfg.agents, prefixes, strict=True)
    )  # fmt: skip
    settings = planner.EngineSettings(cfg.engine.block_tokens, cfg.engine.max_batch_tokens, cfg.engine.threads)
    return PlanInputs(geom, tuple(devices), groups, policy, settings, quality, path, gpu_memory)


# Share of the measured read bandwidth a decode step sustains, for a host whose calibration is
# unreliable: the catalog's CPU hosts assume 0.7 (configs/devices.yaml, x86-host).
_HOST_BANDWIDTH_EFFICIENCY = 0.7


def trusted_calibration(
    cal: planner.Calibration, geom: planner.ModelGeometry, pairs: tuple[planner.FormatPair, ...]
) -> planner.Calibration:
    """A measured calibration, or, when it stayed unreliable, a bandwidth prediction that says so."""
    if cal.reliable:
        return cal
    why = "; ".join(cal.problems) or "unreliable"
    bandwidth = cal.read_bytes_per_s or 20e9  # 20 GB/s: a single-channel DDR4 host, when not measured
    pred = planner.Calibration.from_bandwidth(
        geom, bandwidth * _HOST_BANDWIDTH_EFFICIENCY, pairs,
        source=f"predicted from catalog (this host's calibration is unreliable: {why})",
    )  # fmt: skip
    return dataclasses.replace(pred, quality=cal.quality, machine=cal.machine, reliable=False, problems=cal.problems)


# A recorded calibration is a small JSON document; anything larger is not one.
_MAX_CALIBRATION_FILE_BYTES = 4 << 20


def read_calibration_file(path: str, where: str) -> planner.Calibration:
    """A recorded calibration: `swarm calibrate --json` output, or a cache file (its "calibration")."""
    p = Path(path).expanduser()
    fix = "point it at the output of `swarm calibrate --json` or a calibration cache file"
    if not p.is_file():
        raise ConfigError(where, f"{path!r} is not a file", fix)
    if p.stat().st_size > _MAX_CALIBRATION_FILE_BYTES:
        raise ConfigError(where, f"{path!r} is larger than {_MAX_CALIBRATION_FILE_BYTES:,} bytes", fix)
    try:
        d = json.loads(p.read_text())
        return planner.Calibration.from_dict(d.get("calibration", d))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(where, f"{path!r} is not a calibration ({type(e).__name__})", fix) from None


def plan_config(cfg: SwarmConfig, **kwargs: object) -> tuple[planner.Plan, PlanInputs]:
    inp = plan_inputs(cfg, **kwargs)  # type: ignore[arg-type]
    p = planner.plan(inp.geometry, inp.devices, inp.groups, inp.policy, settings=inp.settings, quality=inp.quality)
    return p, inp
