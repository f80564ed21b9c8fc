"""Facts of this host that planning and calibration read (no native code, no Ray)."""

from __future__ import annotations

import os
from pathlib import Path


def available_memory() -> int:
    """MemAvailable of this host (bytes), or total memory where /proc is missing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
