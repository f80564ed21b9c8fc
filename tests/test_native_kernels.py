"""The C++ kernel test driver (native/tests/kernel_test.cpp): every ISA level
against the scalar reference, natively and cross-compiled for aarch64 (NEON and
NEON dotprod, as an RK3588 worker runs them) under qemu-user. On an x86-64 CPU
without AVX-512 the avx512 level's bodies run over SIMDe's emulated intrinsics
(native/tests/avx512_emulated.cpp)."""

from __future__ import annotations

import os
import platform
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
    names = levels.split()
    assert "ref" in names
    x86 = platform.machine() in ("x86_64", "AMD64")
    # No AVX-512 here: the driver must still have checked the avx512 bodies, emulated over SIMDe.
    if x86 and "avx512" not in names and "avx512-emulated" not in names:
        if os.environ.get("KVSWARM_REQUIRE_AVX512_CHECK") == "1":
            pytest.fail("no AVX-512 on this CPU and SIMDe missing: apt-get install libsimde-dev")
        pytest.skip("the avx512 bodies went unchecked: no AVX-512 and no SIMDe (apt-get install libsimde-dev)")


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


SANITIZER_ENV = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1",
                 "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}  # fmt: skip


def _sanitizer_build() -> Path:
    build = ROOT / "build" / "native-asan"
    subprocess.run(["cmake", "-S", str(NATIVE), "-B", str(build), "-DKVS_BUILD_TESTS=ON", "-DKVS_SANITIZE=ON",
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], check=True, capture_output=True, text=True)  # fmt: skip
    subprocess.run(["cmake", "--build", str(build), "--target", "kvs_kernel_test", "kvs_engine_test", "-j", "2"],
                   check=True, capture_output=True, text=True)  # fmt: skip
    return build


@pytest.fixture(scope="module")
def asan_build() -> Path:
    return _sanitizer_build()


def _run_sanitized(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SANITIZER_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if "LeakSanitizer does not work under ptrace" in proc.stderr:  # a debugger-like sandbox: leaks unchecked
        env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("detect_leaks=1", "detect_leaks=0")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert "runtime error" not in proc.stderr and "ERROR: AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
    return proc


def test_kernels_under_address_and_undefined_behavior_sanitizers(asan_build: Path) -> None:
    proc = _run_sanitized([str(asan_build / "kvs_kernel_test")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed, failed, _ = summary(proc.stdout)
    assert failed == 0 and passed > 0


def test_engine_on_good_and_corrupt_models_under_sanitizers(asan_build: Path, tmp_path: Path) -> None:
    """Every weight type and KV format through the engine, and every corrupt-file case, with ASan and UBSan."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    import refmodel
    from test_gguf_untrusted import variants

    paths = []
    for wt in refmodel.WEIGHT_TYPES:
        p = tmp_path / f"tiny_{wt}.gguf"
        refmodel.write_tiny_llama(p, weight_type=wt, n_layer=2, seed=3)
        paths.append(p)
    good = (tmp_path / "tiny_Q4_1.gguf").read_bytes()
    for i, (data, _) in enumerate(variants(good).values()):
        p = tmp_path / f"corrupt{i}.gguf"
        p.write_bytes(data)
        paths.append(p)
    proc = _run_sanitized([str(asan_build / "kvs_engine_test"), *map(str, paths)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loaded, rejected = (int(x) for x in re.search(r"^(\d+) loaded, (\d+) rejected, 0 failed$", proc.stdout,
                                                   re.M).groups())  # fmt: skip
    assert loaded == len(refmodel.WEIGHT_TYPES) and rejected == len(paths) - loaded
