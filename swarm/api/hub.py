"""The hub: every swarm one server runs, on one Ray connection, recorded in one store.

It launches, finds and stops swarms, finds jobs (running or archived), and after a
restart relaunches the swarms a previous server left running (`recover`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm import scheduler
from swarm.config import SwarmConfig, load_config, show
from swarm.errors import AlreadyExists, InvalidArgument, NotFound
from swarm.jobs import Job
from swarm.launch import SwarmRun
from swarm.planning import plan_inputs
from swarm.store import Store
from worker.models import served_models


@dataclass
class Hub:
    """Every swarm this server runs, on one Ray connection, recorded in one store."""

    conn: scheduler.Connection
    out_root: Path
    store: Store
    echo: Callable[[str], None] = print
    calibrate: Callable[[Path, str, int], dict[str, Any]] | None = None
    swarms: dict[str, SwarmRun] = field(default_factory=dict)
    archive: dict[str, Job] = field(default_factory=dict)  # jobs of swarms no longer running
    idempotency: dict[str, list[str]] = field(default_factory=dict)  # key -> job ids
    lock: threading.RLock = field(default_factory=threading.RLock)
    models_dir: Path | None = None  # GGUF files a client may name (by path under it), besides the default model
    on_swarm_state: Callable[[SwarmRun], None] | None = None  # a swarm's health may have changed

    def served_model(self, cfg: SwarmConfig, data: dict[str, Any]) -> SwarmConfig:
        """A client's config with model.path made the served file it names; INVALID_ARGUMENT for any other path.

        The refusal reads the same whether or not the path exists: only the served list is looked at.
        `data` (what is recorded) gets the file's path too, so a restarted server resumes the same model.
        """
        for i, w in enumerate(cfg.workers):
            if w.calibration_file:  # a server path: a client may not make the server read one
                raise InvalidArgument(
                    f"workers[{i}].calibration_file",
                    "is not accepted over the API; calibrate on the server (calibration: quick or full) or plan "
                    "with calibration: catalog",
                )
        if cfg.model.geometry is not None:
            return cfg
        served = served_models(self.models_dir)
        path = served.get(cfg.model.path)
        if path is None and cfg.model.path in {str(p) for p in served.values()}:
            path = Path(cfg.model.path)
        if path is None:
            names = ", ".join(list(served)[:16]) or "none (the default model is not installed)"
            where = "the *.gguf files under --models-dir, by their path under it" if self.models_dir else \
                "start the server with --models-dir to offer more"  # fmt: skip
            raise InvalidArgument("model.path", f"{show(cfg.model.path)} is not a model this server offers; use one "
                                  f"of: {names} ({where})")  # fmt: skip
        model = {**(data.get("model") or {}), "path": str(path)}
        data["model"] = model
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(path)))

    def recover(self) -> list[str]:
        """Relaunches the swarms a previous server left running, with their agents and jobs; their names."""
        back = []
        for rec in self.store.swarms():
            jobs = self.store.jobs(rec["name"])
            for j in jobs:
                if j["idempotency_key"]:
                    self.idempotency.setdefault(j["idempotency_key"], []).append(j["id"])
            if rec["state"] not in ("starting", "running"):
                for j in jobs:
                    self.archive[j["id"]] = Job.restore(j)
                continue
            try:
                cfg = load_config(rec["config"])
                run = self._make(cfg)
                run.restore(self.store.agents(cfg.name), jobs)
                self.swarms[cfg.name] = run
                run.start()
                back.append(cfg.name)
            except Exception as e:  # noqa: BLE001 - the swarm is reported failed, its jobs too
                why = f"could not resume after a restart: {type(e).__name__}: {e}"
                self.store.set_swarm_state(rec["name"], "failed", why)
                for j in jobs:
                    job = Job.restore(j)
                    if not job.done:
                        job.finish("failed", "error", why)
                        self.store.commit(self.store.job_statements({job.id: (job.state, job.result())}, {}))
                    self.archive[job.id] = job
                self.swarms.pop(rec["name"], None)
        return back

    def _make(self, cfg: SwarmConfig) -> SwarmRun:
        inputs = plan_inputs(cfg, calibrate=self.calibrate)
        out = self.out_root / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run = SwarmRun(cfg, inputs, scheduler.Scheduler(cfg.name, self.conn), out, echo=self.echo, live=False,
                       serve=True, store=self.store)  # fmt: skip
        run.on_state = lambda r: self.on_swarm_state(r) if self.on_swarm_state else None
        return run

    def launch(self, cfg: SwarmConfig, data: dict[str, Any]) -> SwarmRun:
        with self.lock:
            old = self.swarms.get(cfg.name)
            if old is not None and old.state in ("starting", "running"):
                raise AlreadyExists(f"swarm {cfg.name!r} is already running; stop it first or pick another name")
            run = self._make(cfg)
            self.swarms[cfg.name] = run
        try:
            self.store.forget_swarm(cfg.name)
            self.store.put_swarm(cfg.name, data, "running", run.started)
            run.start()
        except BaseException as e:
            run.sched.shutdown()
            self.store.set_swarm_state(cfg.name, "failed", f"{type(e).__name__}: {e}")
            with self.lock:
                self.swarms.pop(cfg.name, None)
            raise
        return run

    def swarm(self, name: str) -> SwarmRun:
        run = self.swarms.get(name)
        if run is None:
            raise NotFound(f"no swarm {show(name)} (running: {', '.join(list(self.swarms)[:16]) or 'none'})")
        return run

    def stop(self, name: str) -> SwarmRun:
        run = self.swarm(name)
        if run.state in ("stopped", "failed"):
            return run
        run.stop()
        run.sched.shutdown()
        self.store.set_swarm_state(name, run.state, run.error)
        return run

    def job(self, job_id: str) -> tuple[SwarmRun | None, Job]:
        for run in list(self.swarms.values()):
            job = run.jobs.get(job_id)
            if job is not None:
                return run, job
        if job_id in self.archive:
            return None, self.archive[job_id]
        raise NotFound(f"no job {show(job_id)}")

    def shutdown(self) -> None:
        """A clean stop: swarms stop, their jobs end as cancelled (recorded)."""
        for name in list(self.swarms):
            run = self.swarms[name]
            if run.state in ("starting", "running"):
                run.stop("the server shut down")
                self.store.set_swarm_state(name, "stopped", "the server shut down")
            run.sched.shutdown()
        self.store.close()

    def crash(self) -> None:
        """Drills: stops every swarm loop and worker as a killed server process would, recording nothing."""
        for run in self.swarms.values():
            run._stop.set()
            if run._thread is not None:
                run._thread.join(timeout=60)
            run.sched.shutdown()
        self.store.close()
