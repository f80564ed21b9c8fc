"""What compute devices this host offers: the CPU, and every Vulkan device the native module sees.

The typed face of `_native.has_vulkan()` / `_native.vulkan_devices()` (native/backend/); `swarm devices`
renders it.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker import _native
from worker.errors import DeviceError
from worker.host import available_memory

BACKENDS = ("cpu", "vulkan")  # the engine's backends (native/backend/backend.h make_backend)

# What to install when the module was built without the Vulkan backend.
VULKAN_BUILD_FIX = (
    "apt-get install libvulkan-dev glslc mesa-vulkan-drivers (or `make vulkan-tools` as root), then `make build`"
)
_NO_VULKAN_DEVICE = "the Vulkan loader found no device (install a Vulkan driver, e.g. mesa-vulkan-drivers)"


@dataclass(frozen=True)
class CpuDevice:
    model: str  # /proc/cpuinfo "model name", else the machine type
    cpus: int
    isa_levels: tuple[str, ...]  # kernel levels this CPU runs, best last
    memory_available_bytes: int  # MemAvailable (the CPU backend's memory is host RAM)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["isa_levels"] = list(self.isa_levels)
        return d


@dataclass(frozen=True)
class VulkanDevice:
    index: int
    name: str
    type: str  # discrete, integrated, virtual, cpu, other
    vendor: str
    vendor_id: int
    device_id: int
    driver_name: str
    driver_info: str
    driver_version: str
    api_version: str
    device_local_bytes: int  # largest device-local heap
    device_local_budget: int  # its VK_EXT_memory_budget budget, 0 when the extension is absent
    memory_budget_ext: bool
    subgroup_size: int
    subgroup_arithmetic: bool  # subgroupAdd & co. in compute shaders (the matmuls' subgroup variants)
    shader_int8: bool
    shader_float16: bool
    integer_dot_product: bool
    integer_dot_4x8_accelerated: bool
    max_workgroup_size: int
    max_storage_buffer_range: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def memory_budget_bytes(self) -> int:
        """What the engine may use of the device: the VK_EXT_memory_budget budget, else the heap's size."""
        return self.device_local_budget or self.device_local_bytes

    @property
    def label(self) -> str:
        """vulkan:<index> <name> (<driver> <version>): how a worker's Repr and the dashboard name it."""
        driver = " ".join(x for x in (self.driver_name, self.driver_info or self.driver_version) if x)
        return f"vulkan:{self.index} {self.name} ({driver})"


@dataclass(frozen=True)
class Devices:
    cpu: CpuDevice
    vulkan_built: bool  # the module has the Vulkan backend
    vulkan: tuple[VulkanDevice, ...]
    vulkan_problem: str | None  # why there are no Vulkan devices (not built, no loader, no driver)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu.to_dict(),
            "vulkan": {
                "built": self.vulkan_built,
                "devices": [d.to_dict() for d in self.vulkan],
                "problem": self.vulkan_problem,
            },
        }


def has_vulkan() -> bool:
    """True when this build of the native module has the Vulkan backend."""
    return bool(_native.has_vulkan())


def vulkan_devices() -> list[VulkanDevice]:
    """Every Vulkan device; RuntimeError naming what to install when Vulkan is not built or has no loader."""
    return [VulkanDevice(**d) for d in _native.vulkan_devices()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def list_devices() -> Devices:
    cpu = CpuDevice(
        model=_cpu_model(),
        cpus=os.cpu_count() or 1,
        isa_levels=tuple(_native.isa_levels()),
        memory_available_bytes=available_memory(),
    )
    built = has_vulkan()
    if not built:
        problem = f"Vulkan support was not built into this module. To fix: {VULKAN_BUILD_FIX}"
        return Devices(cpu=cpu, vulkan_built=False, vulkan=(), vulkan_problem=problem)
    try:
        found = tuple(vulkan_devices())
    except RuntimeError as e:
        return Devices(cpu=cpu, vulkan_built=True, vulkan=(), vulkan_problem=str(e))
    if not found:
        return Devices(cpu=cpu, vulkan_built=True, vulkan=(), vulkan_problem=_NO_VULKAN_DEVICE)
    return Devices(cpu=cpu, vulkan_built=True, vulkan=found, vulkan_problem=None)


def vulkan_device(index: int) -> VulkanDevice:
    """Vulkan device `index` of this host; DeviceError saying what is missing (the build, a loader or driver,
    that index: the message lists the devices there are)."""
    if not has_vulkan():
        raise DeviceError(f"Vulkan support was not built into this module. To fix: {VULKAN_BUILD_FIX}")
    try:
        found = vulkan_devices()
    except RuntimeError as e:
        raise DeviceError(str(e)) from None
    if not found:
        raise DeviceError(_NO_VULKAN_DEVICE)
    if not 0 <= index < len(found):
        listing = "; ".join(f"vulkan:{d.index} {d.name}" for d in found)
        raise DeviceError(
            f"vulkan device {index} does not exist: this host has {len(found)} ({listing}). "
            f"To fix: use an index from 0 to {len(found) - 1} (`swarm devices` lists them)"
        )
    return found[index]


def gpu_memory_budgets() -> dict[str, int]:
    """{"vulkan:<index>": memory_budget_bytes} of every Vulkan device of this host ({} where there is none):
    what `swarm serve` offers Ray for GPU workers' KV, before it knows which configs will come."""
    return {f"vulkan:{d.index}": d.memory_budget_bytes for d in list_devices().vulkan}


def check_backend(backend: str, device: int) -> VulkanDevice | None:
    """Validates an engine's backend and device before anything is loaded: None for the CPU, the Vulkan
    device for vulkan; DeviceError for an unknown backend or a device this host lacks."""
    if backend not in BACKENDS:
        raise DeviceError(f"unknown backend {backend!r}. To fix: use one of {', '.join(BACKENDS)}")
    if backend == "cpu":
        return None
    return vulkan_device(device)


def backend_kwargs(backend: str, device: int) -> dict[str, Any]:
    """Engine(...) keywords for a backend: none for the CPU (the engine's default, so its path is untouched)."""
    return {} if backend == "cpu" else {"backend": backend, "device": device}
