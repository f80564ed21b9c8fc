"""The C++ kernel test driver (native/tests/kernel_test.cpp): every ISA level
against the scalar reference, natively and cross-compiled for aarch64 (NEON and
NEON dotprod, as an RK3588 worker runs them) under qemu-user."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"


def build_and_run(build_dir: Path, extra_cmake: list[str], runner: list[str]) -> str:
    subprocess.run(
        ["cmake", "-S", str(NATIVE), "-B", str(build_dir), "-DKVS_BUILD_TESTS=ON", *extra_cmake],
        check=True,
        capture_output=True,
        text=True,
    )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", "kvs_kernel_test", "-j", "2"],
        check=True,
        capture_output=True,
        text=True,
    )
    proc = subprocess.run([*runner, str(build_dir / "kvs_kernel_test")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def summary(out: str) -> tuple[int, int, str]:
    counts = re.search(r"^(\d+) passed, (\d+) failed$", out, re.M)
    levels = re.search(r"^levels: (.*)$", out, re.M)
    assert counts and levels, out
    return int(counts.group(1)), int(counts.group(2)), levels.group(1)


def test_native_levels_match_reference() -> None:
    out = build_and_run(ROOT / "build" / "native-test", [], [])
    passed, failed, levels = summary(out)
    assert failed == 0 and passed > 0
    assert "ref" in levels.split()


def test_aarch64_neon_under_qemu() -> None:
    tools = [shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")]
    if not all(tools):
        if os.environ.get("KVSWARM_REQUIRE_ARM") == "1":
            pytest.fail("aarch64 cross toolchain or qemu-user missing: apt-get install g++-aarch64-linux-gnu qemu-user")
        pytest.skip("aarch64 cross toolchain or qemu-user not installed (make test installs them when root)")
    toolchain = NATIVE / "cmake" / "aarch64-linux-gnu.cmake"
    out = build_and_run(
        ROOT / "build" / "aarch64-test",
        [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"],
        ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"],
    )
    passed, failed, levels = summary(out)
    assert failed == 0 and passed > 0
    assert {"neon", "neon_dotprod"} <= set(levels.split()), levels
