"""The device catalog (configs/devices.yaml): real devices with memory, bandwidth, backend and sources."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from swarm.errors import ConfigError

CATALOG = Path(__file__).resolve().parent.parent / "configs" / "devices.yaml"
BACKENDS = ("cpu", "cuda", "rocm", "metal")
_KEYS = {
    "name",
    "backend",
    "memory_bytes",
    "usable_fraction",
    "bandwidth_gbps",
    "bandwidth_efficiency",
    "compute_tops_int8",
    "sources",
    "notes",
}


@dataclass(frozen=True)
class DeviceSpec:
    id: str
    name: str
    backend: str
    memory_bytes: int
    usable_fraction: float
    bandwidth_gbps: float  # peak, 1e9 bytes/s
    bandwidth_efficiency: float  # share of peak a streaming kernel sustains
    sources: dict[str, str]
    notes: str = ""
    compute_tops_int8: float | None = None

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.usable_fraction)

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second the planner assumes a decode step streams at."""
        return self.bandwidth_gbps * 1e9 * self.bandwidth_efficiency


def _spec(dev_id: str, d: object, where: str) -> DeviceSpec:
    path = f"{where}: devices.{dev_id}"
    if not isinstance(d, dict):
        raise ConfigError(path, "is not a mapping", "give the device's keys (see the file header)")
    unknown = set(d) - _KEYS
    if unknown:
        raise ConfigError(f"{path}.{sorted(unknown)[0]}", "is not a device key", f"use only {', '.join(sorted(_KEYS))}")
    for key in ("name", "backend", "memory_bytes", "usable_fraction", "bandwidth_gbps", "bandwidth_efficiency"):
        if key not in d:
            raise ConfigError(f"{path}.{key}", "is missing", "add it (see the file header)")
    if d["backend"] not in BACKENDS:
        raise ConfigError(f"{path}.backend", f"'{d['backend']}' is unknown", f"use one of {', '.join(BACKENDS)}")
    if not isinstance(d["memory_bytes"], int) or d["memory_bytes"] <= 0:
        raise ConfigError(f"{path}.memory_bytes", "must be a positive integer of bytes", "write e.g. 25769803776")
    for key in ("usable_fraction", "bandwidth_efficiency"):
        if not isinstance(d[key], int | float) or not 0 < d[key] <= 1:
            raise ConfigError(f"{path}.{key}", f"{d[key]!r} is not in (0, 1]", "give a fraction such as 0.9")
    if not isinstance(d["bandwidth_gbps"], int | float) or d["bandwidth_gbps"] <= 0:
        raise ConfigError(f"{path}.bandwidth_gbps", "must be a positive number", "give GB/s, e.g. 1008.0")
    sources = d.get("sources") or {}
    if not isinstance(sources, dict) or not {"memory", "bandwidth"} <= set(sources):
        raise ConfigError(f"{path}.sources", "needs 'memory' and 'bandwidth'", "cite where each figure comes from")
    return DeviceSpec(
        id=dev_id,
        name=str(d["name"]),
        backend=str(d["backend"]),
        memory_bytes=int(d["memory_bytes"]),
        usable_fraction=float(d["usable_fraction"]),
        bandwidth_gbps=float(d["bandwidth_gbps"]),
        bandwidth_efficiency=float(d["bandwidth_efficiency"]),
        sources={str(k): str(v) for k, v in sources.items()},
        notes=str(d.get("notes", "")).strip(),
        compute_tops_int8=None if d.get("compute_tops_int8") is None else float(d["compute_tops_int8"]),
    )


@functools.cache
def load_catalog(path: Path = CATALOG) -> dict[str, DeviceSpec]:
    """{device id: spec}; raises ConfigError naming the bad entry."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(str(path), f"cannot be read ({e})", "restore configs/devices.yaml") from e
    if not isinstance(data, dict) or not isinstance(data.get("devices"), dict):
        raise ConfigError(str(path), "has no 'devices' mapping", "see the file header for the layout")
    return {str(k): _spec(str(k), v, str(path)) for k, v in data["devices"].items()}


def device(dev_id: str) -> DeviceSpec:
    cat = load_catalog()
    if dev_id not in cat:
        raise KeyError(dev_id)
    return cat[dev_id]
