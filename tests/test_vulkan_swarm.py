"""GPU workers in a swarm (issue 16): `backend: vulkan` / `device:` on a worker, its memory from the device heap,
calibration cached per device and driver, Ray's GPU resource, `swarm generate --backend vulkan`, bench/gpu.py,
and a swarm with one Vulkan worker and one CPU worker on a real local Ray.

The config checks run everywhere. What needs a Vulkan device is skipped, with the reason, when there is none
(KVSWARM_REQUIRE_VULKAN=1, as in CI, makes that a failure); what needs the engine's forward on Vulkan is
skipped until the engine takes `backend=` (worker/engine.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from tinymodels import tiny_model  # tests/

from swarm import scheduler
from swarm.cli import main as swarm_main
from swarm.cli_engine import BACKEND_CHOICES
from swarm.config import load_config
from swarm.errors import ConfigError, DeviceError
from swarm.launch import launch
from swarm.planning import plan_config, plan_inputs
from swarm.scheduler import KV_RESOURCE, device_kv_resource, gpu_request, kv_resource
from worker import _native
from worker.calibrate import CalibrationOptions, cache_key, machine_id
from worker.devices import BACKENDS, check_backend
from worker.engine import Engine
from worker.models import resolve_model
from worker.service import EngineWorker, WorkerSpec

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "tests" / "fixtures" / "calibration_smollm2.json"  # a recorded calibration: no measuring
REQUIRE_VULKAN = os.environ.get("KVSWARM_REQUIRE_VULKAN") == "1"


def _devices() -> tuple[list[dict[str, Any]], str]:
    """(the Vulkan devices, "") or ([], why there are none)."""
    if not _native.has_vulkan():
        return [], "this build has no Vulkan backend (apt-get install libvulkan-dev glslc mesa-vulkan-drivers)"
    try:
        found: list[dict[str, Any]] = _native.vulkan_devices()
    except RuntimeError as e:
        return [], f"Vulkan unavailable: {e}"
    return found, "" if found else "the Vulkan loader found no device"


DEVICES, NO_DEVICE_REASON = _devices()
# The engine runs its forward on Vulkan once Engine takes backend= (worker/engine.py).
ENGINE_HAS_BACKEND = "backend" in inspect.signature(Engine.__init__).parameters


@pytest.fixture(scope="module")
def device() -> int:
    if not DEVICES:
        if REQUIRE_VULKAN:
            pytest.fail(f"KVSWARM_REQUIRE_VULKAN=1 but {NO_DEVICE_REASON}")
        pytest.skip(NO_DEVICE_REASON)
    return int(os.environ.get("KVSWARM_VULKAN_DEVICE", "0"))


@pytest.fixture(scope="module")
def vulkan_engine(device: int) -> int:
    if not ENGINE_HAS_BACKEND:
        pytest.skip("Engine(backend='vulkan') has not landed yet (worker/engine.py)")
    return device


def _config(workers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "name": "gpu-cpu",
        "agents": [{"name": "a", "count": 4, "context": 256, "tasks": ["Say hi.", "Say bye."], "max_new_tokens": 6}],
        "workers": workers,
        "policy": {"formats": ["f16"]},
        "engine": {"threads": 1},
        **extra,
    }


# ---- the config: what it alone can tell ----


@pytest.mark.parametrize(
    ("worker", "path", "message"),
    [
        ({"backend": "metal"}, r"workers\[0\]\.backend", "'metal' is not allowed.*use one of cpu, vulkan"),
        ({"kind": "virtual", "device": "rk3588", "backend": "vulkan"}, r"workers\[0\]\.backend",
         "vulkan is set on a virtual worker.*kind: local with backend: vulkan"),
        ({"backend": "vulkan", "device": "rtx4090"}, r"workers\[0\]\.device",
         "'rtx4090' is not a Vulkan device index.*device: 0"),
        ({"kind": "virtual", "device": 1}, r"workers\[0\]\.device",
         "1 is a Vulkan device index; a virtual worker names a catalog device"),
        ({"device": 0}, r"workers\[0\]\.device", "is set on a local worker"),
        ({"backend": "vulkan", "device": -1}, r"workers\[0\]\.device", "-1 is below 0"),
    ],
)  # fmt: skip
def test_config_refuses_a_bad_backend_or_device(worker: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{path}: .*{message}"):
        load_config(_config([{"name": "w", **worker}]))


def test_backend_lists_agree() -> None:
    """The CLI's choices (swarm/cli_engine.py, importable without the engine) are the worker layer's backends,
    and the config's Literal the same."""
    from swarm.config import Worker

    assert BACKEND_CHOICES == BACKENDS
    assert typing.get_args(typing.get_type_hints(Worker)["backend"]) == BACKENDS
    assert Worker(name="w").backend == "cpu"


def test_unknown_backend_is_a_device_error() -> None:
    with pytest.raises(DeviceError, match="unknown backend 'metal'. To fix: use one of cpu, vulkan"):
        check_backend("metal", 0)
    assert check_backend("cpu", 7) is None  # the CPU has no device index


def test_gpu_request_follows_what_ray_sees() -> None:
    spec = WorkerSpec(name="g", kind="local", device="vulkan:0", model="default", kv_k="f16", kv_v="f16",
                      kv_budget_bytes=1 << 20, backend="vulkan")  # fmt: skip
    assert gpu_request(spec, {"CPU": 2.0, "GPU": 1.0})
    assert not gpu_request(spec, {"CPU": 2.0})  # Ray sees no GPU (lavapipe, or one Ray does not count)
    assert not gpu_request(dataclasses.replace(spec, backend="cpu"), {"GPU": 8.0})


def test_missing_vulkan_is_a_config_error_naming_the_fix(tmp_path: Path) -> None:
    """Without a Vulkan loader (here: a path that does not exist), planning a `backend: vulkan` worker says what
    to install. Runs in any build (a build without Vulkan says how to build it)."""
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(yaml.safe_dump(_config([{"name": "gpu", "backend": "vulkan",
                                            "calibration_file": str(CALIBRATION)}])))  # fmt: skip
    code = (
        "import sys\n"
        "from swarm.config import load_config\n"
        "from swarm.errors import ConfigError\n"
        "from swarm.planning import plan_inputs\n"
        "try:\n"
        f"    plan_inputs(load_config({str(cfg)!r}))\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
    )
    env = dict(os.environ, KVSWARM_VULKAN_LOADER="/nonexistent/libvulkan.so.1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout  # fmt: skip
    assert out.startswith("workers[0].backend: ")
    if _native.has_vulkan():
        assert "/nonexistent/libvulkan.so.1" in out and "apt-get install libvulkan1" in out
    else:
        assert "not built" in out and "apt-get install libvulkan-dev glslc" in out


# ---- on a Vulkan device: planning, calibration key, CLI errors ----


def test_gpu_worker_memory_comes_from_the_device_heap(device: int) -> None:
    d = _native.vulkan_devices()[device]
    heap = d["device_local_budget"] or d["device_local_bytes"]  # the budget where VK_EXT_memory_budget has one
    cal = str(CALIBRATION)
    cfg = load_config(_config([
        {"name": "cpu", "calibration_file": cal},
        {"name": "gpu", "backend": "vulkan", "device": device, "calibration_file": cal},
        {"name": "capped", "backend": "vulkan", "device": device, "calibration_file": cal, "memory": "150MiB"},
    ]))  # fmt: skip
    inp = plan_inputs(cfg)
    by_name = {p.name: p for p in inp.devices}
    gpu = by_name["gpu"]
    assert (gpu.device, gpu.backend, gpu.usable_bytes) == (f"vulkan:{device}", "vulkan", heap)
    assert by_name["capped"].usable_bytes == min(150 * 2**20, heap)
    assert inp.gpu_memory == {f"vulkan:{device}": heap}  # the device's KV resource: uncapped by a worker's memory
    assert (by_name["cpu"].device, by_name["cpu"].backend) == ("local", "cpu")


def test_device_index_out_of_range_lists_the_devices(device: int) -> None:
    n = len(_native.vulkan_devices())
    cfg = load_config(_config([{"name": "gpu", "backend": "vulkan", "device": n,
                                "calibration_file": str(CALIBRATION)}]))  # fmt: skip
    with pytest.raises(ConfigError, match=rf"^workers\[0\]\.device: vulkan device {n} does not exist: this host has "
                       rf"{n} \(vulkan:0 .*\)\. To fix: use an index from 0 to {n - 1}"):  # fmt: skip
        plan_inputs(cfg)


def test_calibration_is_cached_per_device_and_driver(device: int) -> None:
    d = _native.vulkan_devices()[device]
    model = resolve_model(None)
    cpu = CalibrationOptions.quick(1)
    gpu = dataclasses.replace(cpu, backend="vulkan", device=device)
    assert d["name"] in machine_id("vulkan", device) and d["driver_version"] in machine_id("vulkan", device)
    assert machine_id("vulkan", device).startswith(machine_id())  # the host, then its GPU
    assert cache_key(model, gpu) != cache_key(model, cpu)
    assert cache_key(model, gpu) == cache_key(model, dataclasses.replace(gpu))  # stable
    with pytest.raises(DeviceError, match="does not exist"):
        cache_key(model, dataclasses.replace(gpu, device=len(_native.vulkan_devices())))


@pytest.mark.parametrize("command", [["generate", "hi", "--max-tokens", "2"], ["calibrate", "--quick"]])
def test_cli_refuses_a_device_it_lacks(device: int, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    n = len(_native.vulkan_devices())
    assert swarm_main([*command, "--backend", "vulkan", "--device", str(n)]) == 2
    err = capsys.readouterr().err
    assert f"swarm {command[0]}: --backend vulkan --device {n}: vulkan device {n} does not exist" in err
    assert _native.vulkan_devices()[0]["name"] in err  # the devices there are, by name


def test_worker_refuses_a_device_before_loading_the_model(device: int) -> None:
    n = len(_native.vulkan_devices())
    with pytest.raises(DeviceError, match=f"vulkan device {n} does not exist"):
        EngineWorker(WorkerSpec(name="g", kind="local", device=f"vulkan:{n}", model="/nonexistent.gguf",
                                kv_k="f16", kv_v="f16", kv_budget_bytes=1 << 20, backend="vulkan",
                                device_index=n))  # fmt: skip


# ---- with the engine's forward on Vulkan ----


# NOTE: the CLI, worker, bench and swarm tests below run the tiny llama model: what they check is the path from
# the command or config to the device, and tests/test_vulkan_engine.py checks the default model's numbers there
# (lavapipe takes seconds per decode step of it).


def test_generate_on_vulkan(vulkan_engine: int, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "The capital of France is", "--max-tokens", "4", "--json", "--model", str(tiny_model("llama"))]
    assert swarm_main([*argv, "--backend", "vulkan", "--device", str(vulkan_engine)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == f"vulkan:{vulkan_engine}"
    assert len(out["generated_ids"]) == 4
    assert swarm_main(argv) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert cpu["backend"] == "cpu" and cpu["prompt_ids"] == out["prompt_ids"]


def test_worker_repr_names_the_gpu(vulkan_engine: int) -> None:
    d = _native.vulkan_devices()[vulkan_engine]
    model = str(tiny_model("llama"))
    w = EngineWorker(WorkerSpec(name="g", kind="local", device=f"vulkan:{vulkan_engine}", model=model, kv_k="f16",
                                kv_v="f16", kv_budget_bytes=8 << 20, threads=1, backend="vulkan",
                                device_index=vulkan_engine))  # fmt: skip
    try:
        assert repr(w).startswith(f"EngineWorker(g on vulkan:{vulkan_engine} {d['name']} (")
    finally:
        w.stop()


def test_bench_gpu_quick_runs(vulkan_engine: int, tmp_path: Path) -> None:
    # Two cells of one step each, on the tiny model (the record is named after it, bench/peer.py record_name).
    model = tiny_model("llama")
    argv = f"--quick --device {vulkan_engine} --kv q8_0 --seqs 2 --depths 0 20 --steps 1 --out {tmp_path}".split()
    r = subprocess.run([sys.executable, "gpu.py", *argv, "--model", str(model)], cwd=ROOT / "bench",
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    record = json.loads((tmp_path / f"gpu-{model.name.removesuffix('.gguf')}-quick.json").read_text())
    assert record["gpu"]["name"] == _native.vulkan_devices()[vulkan_engine]["name"]
    assert record["copy_bandwidth_bytes_per_s"] > 0
    cells = {(c["kv"], c["seqs"], c["depth"]) for c in record["cells"]}
    assert cells == {("q8_0", 2, 0), ("q8_0", 2, 20)}
    for c in record["cells"]:
        assert c["tokens_per_s"] == pytest.approx(c["seqs"] / c["median_step_s"], rel=1e-12)
        assert c["bandwidth_share"] == pytest.approx(
            c["bytes_per_step"] / record["copy_bandwidth_bytes_per_s"] / c["median_step_s"], rel=1e-12
        )


def _device_heap(index: int) -> int:
    """The memory planning gives a GPU worker, read from the device facts: its VK_EXT_memory_budget budget where
    the driver has one, else the device-local heap's size."""
    d = _native.vulkan_devices()[index]
    return int(d["device_local_budget"] or d["device_local_bytes"])


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("/proc/meminfo has no MemTotal")


def test_kv_resource_of_a_worker() -> None:
    """A local GPU worker's KV is held in its device's resource; CPU and cluster workers hold the node's."""
    spec = WorkerSpec(name="g", kind="local", device="vulkan:1", model="default", kv_k="f16", kv_v="f16",
                      kv_budget_bytes=1 << 20, backend="vulkan", device_index=1)  # fmt: skip
    assert kv_resource(spec) == device_kv_resource("vulkan:1") == "kv_bytes:vulkan:1"
    assert kv_resource(dataclasses.replace(spec, backend="cpu", device="local")) == KV_RESOURCE == "kv_bytes"
    # a cluster node declares its kv_bytes for whatever device it has
    assert kv_resource(dataclasses.replace(spec, kind="cluster", device="rtx4090")) == KV_RESOURCE


def test_gpu_kv_reservations_are_not_held_to_host_memory(device: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16 item 6, on a real local Ray whose host offers less KV memory (1 MiB of `kv_bytes`) than the
    GPU's heap (what the config's GPU worker plans with): a local GPU worker reserves 4 MiB against its
    device's resource; a CPU worker with the same budget is refused, naming the host's resource."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    host_kv = 1 << 20
    cfg = load_config(_config([{"name": "gpu", "backend": "vulkan", "device": device,
                                "calibration_file": str(CALIBRATION)}]))  # fmt: skip
    gpu_memory = plan_inputs(cfg).gpu_memory  # what `swarm launch` gives Ray
    assert gpu_memory == {f"vulkan:{device}": _device_heap(device)}
    assert _device_heap(device) > 4 * host_kv  # the premise: the GPU has more than the host offers
    conn = scheduler.connect(None, kv_bytes=host_kv, device_kv_bytes=gpu_memory, num_cpus=2)
    try:
        res = scheduler.cluster_resources()
        assert res[KV_RESOURCE] == host_kv
        assert res[f"kv_bytes:vulkan:{device}"] == _device_heap(device)
        sched = scheduler.Scheduler("heap", conn)
        spec = WorkerSpec(name="gpu", kind="local", device=f"vulkan:{device}", model=str(tiny_model("llama")),
                          kv_k="f16", kv_v="f16", kv_budget_bytes=4 * host_kv, threads=1, swarm="heap",
                          backend="vulkan", device_index=device)  # fmt: skip
        sched.start_workers([(spec, 64 << 20)])
        sched.reserve("gpu", [scheduler.Reservation("a-0", 2 * host_kv), scheduler.Reservation("a-1", 2 * host_kv)])
        held = [b for g in scheduler.placement("heap")["placement_groups"] if " kv" in g["name"] for b in g["bundles"]]
        assert [(b["label"], b["kv_bytes"], b["kv_resource"]) for b in held] == [
            ("a-0", 2 * host_kv, f"kv_bytes:vulkan:{device}"), ("a-1", 2 * host_kv, f"kv_bytes:vulkan:{device}")
        ]  # fmt: skip
        cpu = dataclasses.replace(spec, name="cpu", device="local", backend="cpu", device_index=0)
        with pytest.raises(scheduler.SchedulerError, match=f"needs {4 * host_kv:,} bytes of resource kv_bytes, "
                           f"the cluster offers {host_kv:,}"):  # fmt: skip
            sched.start_workers([(cpu, 64 << 20)])
        sched.shutdown()
    finally:
        scheduler.disconnect(conn)


def test_swarm_with_a_vulkan_worker_and_a_cpu_worker(
    vulkan_engine: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two local workers on a real local Ray (`swarm launch`), one on the CPU and one on the GPU, planned from a
    recorded calibration (a decision is never taken from this machine's speed in a test): the planner splits the
    four agents 2 + 2 (equal costs), both workers serve turns, every agent finishes both turns, and the GPU
    worker is named as such. Ray offers the GPU's heap as its KV resource and the host's memory as `kv_bytes`;
    each worker's agents hold their KV in its own. The swarm runs a tiny model: the default model on the device
    is covered by tests/test_vulkan_engine.py, and lavapipe takes seconds per decode step of it."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cal = str(CALIBRATION)
    raw = _config([{"name": "cpu", "calibration_file": cal},
                   {"name": "gpu", "backend": "vulkan", "device": vulkan_engine, "calibration_file": cal}],
                  model={"path": str(tiny_model("llama"))})  # fmt: skip
    cfg = load_config(raw)
    plan, inp = plan_config(cfg)
    planned = {w.worker: w.agents for w in plan.workers}
    assert planned == {"cpu": 2, "gpu": 2}, planned  # the premise of the checks below
    heap = _device_heap(vulkan_engine)
    seen: dict[str, Any] = {}  # the first tick's Ray resources and KV bundles, while every agent is placed

    def on_tick(run: Any) -> None:
        if not seen:
            seen["resources"] = scheduler.cluster_resources()
            seen["placement"] = scheduler.placement(cfg.name)

    out = tmp_path / "run"
    summary = launch(cfg, out_dir=out, live=False, timeout_s=900, echo=lambda m: None, on_tick=on_tick)
    assert {n: a["turns"] for n, a in summary["agents"].items()} == {f"a-{i}": 2 for i in range(4)}
    assert all(a["finish"] == "done" for a in summary["agents"].values())
    devices = {w["worker"]: (w["device"], w["backend"]) for w in summary["initial_plan"]["workers"]}
    assert devices == {"cpu": ("local", "cpu"), "gpu": (f"vulkan:{vulkan_engine}", "vulkan")}
    # The KV resources: the device heap for the GPU (not the host's memory), the host's for the CPU worker.
    res = seen["resources"]
    assert res[f"kv_bytes:vulkan:{vulkan_engine}"] == heap != res[KV_RESOURCE]
    assert 0 < res[KV_RESOURCE] <= _mem_total()  # MemAvailable at launch
    held: dict[str, set[str]] = {}  # {worker: the resources its agents' KV bundles hold}
    for g in seen["placement"]["placement_groups"]:
        if " kv" in g["name"]:
            held.setdefault(g["worker"], set()).update(b["kv_resource"] for b in g["bundles"])
    assert held == {"cpu": {KV_RESOURCE}, "gpu": {f"kv_bytes:vulkan:{vulkan_engine}"}}, held
    served: dict[str, int] = {}  # {worker: turns it ran}
    for i in range(4):
        lines = (out / "agents" / f"a-{i}.jsonl").read_text().splitlines()
        replies = [rec for rec in map(json.loads, lines) if rec["role"] == "assistant"]
        assert len(replies) == 2 and all(0 < rep["tokens"] == len(rep["token_ids"]) for rep in replies)
        for rep in replies:
            served[rep["worker"]] = served.get(rep["worker"], 0) + 1
    # NOTE: how many turns each worker runs is the runtime's choice (an agent that finishes frees room and the
    # rest may be replanned where they run faster), so only "both served turns" is fixed.
    assert set(served) == {"cpu", "gpu"} and sum(served.values()) == 8, served
