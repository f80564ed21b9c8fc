"""`swarm devices`: the CPU and every Vulkan device of this host, as a table or as JSON.

(swarm/devices.py is the device catalog of configs/devices.yaml: devices the planner knows of; this module
lists the ones this host actually has.)
"""

from __future__ import annotations

import argparse
import json

from worker.devices import Devices, VulkanDevice, list_devices

GIB = 1024**3


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _vulkan_notes(d: VulkanDevice) -> str:
    dot = "no"
    if d.integer_dot_product:
        dot = "yes (accelerated)" if d.integer_dot_4x8_accelerated else "yes (not accelerated)"
    driver = " ".join(x for x in (d.driver_name, d.driver_info) if x) or d.driver_version
    return (
        f"{d.vendor} {d.type}, driver {driver}, Vulkan {d.api_version}, subgroup {d.subgroup_size}, "
        f"int8 {'yes' if d.shader_int8 else 'no'}, integer dot {dot}"
    )


def render(devs: Devices) -> str:
    # rows: (device, name, memory, notes)
    rows = [
        (
            "cpu",
            devs.cpu.model,
            f"{_gib(devs.cpu.memory_available_bytes)} available",
            f"{devs.cpu.cpus} cpus, kernels {', '.join(devs.cpu.isa_levels)}",
        )
    ]
    for d in devs.vulkan:
        if d.device_local_budget:
            memory = f"{_gib(d.device_local_bytes)} heap, {_gib(d.device_local_budget)} budget"
        else:
            memory = f"{_gib(d.device_local_bytes)} heap"
        rows.append((f"vulkan:{d.index}", d.name, memory, _vulkan_notes(d)))
    head = ("DEVICE", "NAME", "MEMORY", "NOTES")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in [head, *rows]]
    if devs.vulkan_problem:
        lines.append(f"vulkan: {devs.vulkan_problem}")
    return "\n".join(lines)


def cmd_devices(args: argparse.Namespace) -> int:
    devs = list_devices()
    if args.json:
        print(json.dumps(devs.to_dict(), indent=2))
    else:
        print(render(devs))
    return 0
