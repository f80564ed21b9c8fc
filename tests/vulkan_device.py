"""The Vulkan device the Vulkan tests run on, and what they do without one.

KVSWARM_VULKAN_DEVICE=N picks a device; otherwise lavapipe (llvmpipe) when present, else the first.
Without a device the tests skip, unless KVSWARM_REQUIRE_VULKAN=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from worker import _native

REQUIRE_VULKAN = os.environ.get("KVSWARM_REQUIRE_VULKAN") == "1"


def _pick_device() -> tuple[int | None, str]:
    """(device index, "") or (None, why there is none)."""
    if not _native.has_vulkan():
        fix = "apt-get install libvulkan-dev glslc mesa-vulkan-drivers, then make build"
        return None, f"this build has no Vulkan backend ({fix})"
    try:
        devices: list[dict[str, Any]] = _native.vulkan_devices()
    except RuntimeError as e:
        return None, f"Vulkan unavailable: {e}"
    if not devices:
        return None, "the Vulkan loader found no device (apt-get install mesa-vulkan-drivers for lavapipe)"
    if "KVSWARM_VULKAN_DEVICE" in os.environ:
        return int(os.environ["KVSWARM_VULKAN_DEVICE"]), ""
    for d in devices:
        if d["driver_name"] == "llvmpipe" or d["name"].startswith("llvmpipe"):
            return int(d["index"]), ""
    return int(devices[0]["index"]), ""


DEVICE, NO_DEVICE_REASON = _pick_device()


def vulkan_device() -> int:
    """The device index; skips the test (fails it under KVSWARM_REQUIRE_VULKAN=1) when there is none."""
    if DEVICE is None:
        if REQUIRE_VULKAN:
            pytest.fail(f"KVSWARM_REQUIRE_VULKAN=1 but {NO_DEVICE_REASON}")
        pytest.skip(NO_DEVICE_REASON)
    return DEVICE
