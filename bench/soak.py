"""Soak: minutes of jobs, cancels and a worker kill per minute against a local swarm.

A server runs in a child process (local Ray, two workers); client threads keep
submitting jobs (to the swarm's agents, and one-off agents), stream them to
the end, and cancel some mid-stream; once a minute a worker process is killed
with SIGKILL, the workers in turn, and once both back to back. With
`--kill-server` one of those kills (the middle one) is the server itself,
SIGKILLed and started again on the same run directory: clients reconnect and
resume their streams from the offset they had.

Every job must end completed, cancelled by us, or refused or failed with a
reason: `lost` (an accepted job with no terminal state, or a stream with a gap
or a repeat) must be 0, and the swarm must never be `failed`. Reported:
counts, kills, latency percentiles, and the resident memory of every process
at start and end.

    .venv/bin/python bench/soak.py --minutes 10 --json results/soak.json [--kill-server]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import grpc  # noqa: E402

from swarm.client import SwarmClient  # noqa: E402

TOKEN = "soak"
CONFIG = """
name: soak
agents:
  - name: chat
    count: 8
    context: 1024
    system_prompt: You are a helpful assistant. Answer briefly.
    max_new_tokens: 32
workers:
  - name: w1
    kind: virtual
    device: x86-host
  - name: w2
    kind: virtual
    device: x86-host
policy:
  formats: [q8_0]
engine:
  threads: 1
"""
PROMPTS = ["Name a color.", "Tell me a fact about the sea.", "Count to five.", "What is a cache?", "Say hello."]
STREAM_RETRIES = 40  # reconnects of one stream (backed off to 5 s each): outlasts a server restart
RESTART_WAIT_S = 180.0  # a restarted server must answer health checks within this


def run_server(out: Path, port: int) -> None:
    """The child: a server on `port` recording in `out`; writes the live workers' pids to placement.json."""
    from swarm import scheduler
    from swarm.server import serve

    conn = scheduler.connect(None, kv_bytes=8 * 10**9)
    srv = serve(conn=conn, port=port, token=TOKEN, out_root=out, echo=lambda m: None)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print("ready", flush=True)
    while not done.wait(1.0):
        run = srv.hub.swarms.get("soak")
        if run is None or run.state != "running":
            continue
        try:
            states = run.sched.states()  # each live worker's own report, its pid with it
        except RuntimeError:  # the swarm loop changed its workers meanwhile: next second
            continue
        pids = {w: st["pid"] for w, st in states.items() if isinstance(st, dict)}
        tmp = out / "placement.json.tmp"
        tmp.write_text(json.dumps(pids))
        tmp.replace(out / "placement.json")
    srv.stop()
    scheduler.disconnect(conn)


class ServerProcess:
    """The server child: started, SIGKILLed and started again on the same port and run directory."""

    def __init__(self, out: Path) -> None:
        self.out = out
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = open(out / "server.log", "ab")  # noqa: SIM115 - open for the child's life

    def start(self) -> None:
        (self.out / "placement.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.out), str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + RESTART_WAIT_S
        with SwarmClient(f"127.0.0.1:{self.port}", token=TOKEN) as c:
            while True:
                try:
                    if c.health() == "SERVING":
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the server did not come up (see {self.out / 'server.log'})")
                time.sleep(0.5)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def workers(self) -> dict[str, int]:
        """Worker name -> pid, as Ray showed them within the last second or so."""
        try:
            data = json.loads((self.out / "placement.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(name): int(pid) for name, pid in data.items()}


def rss_by_role(server_pid: int) -> dict[str, int]:
    """Resident bytes summed per role over the server's process tree (its Ray and engine workers descend from
    it; other programs on the machine are not counted): the server (the swarm driver), engine workers, Ray."""
    parent: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                parent[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue

    def ours(pid: int) -> bool:
        for _ in range(64):  # depth bound: the tree is a few levels deep
            if pid == server_pid:
                return True
            if pid not in parent or pid <= 1:
                return False
            pid = parent[pid]
        return False

    out: Counter[str] = Counter()
    for pid in parent:
        if not ours(pid):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            rss = next(int(ln.split()[1]) * 1024 for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if ln.startswith("VmRSS:"))  # fmt: skip
        except (OSError, StopIteration):
            continue
        if pid == server_pid:
            out["driver+server"] += rss
        elif "MeteredEngineWorker" in cmd:
            out["engine workers"] += rss
            out["engine worker processes"] += 1
            out["largest engine worker"] = max(out["largest engine worker"], rss)
        else:
            out["ray"] += rss
    return dict(out)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    ap.add_argument("--cancel-rate", type=float, default=0.1)
    ap.add_argument("--kill-server", action="store_true", help="the middle kill is the server's (restarted)")
    ap.add_argument("--out", default=None, help="the server's run directory (default: a new one under /tmp)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--serve", nargs=2, metavar=("OUT", "PORT"), help=argparse.SUPPRESS)  # the server child
    args = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack (a stuck soak)
    if args.serve:
        run_server(Path(args.serve[0]), int(args.serve[1]))
        return

    out = Path(args.out or f"/tmp/kvswarm-soak-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    out.mkdir(parents=True, exist_ok=False)  # a fresh run directory: nothing resumed from an earlier soak
    srv = ServerProcess(out)
    srv.start()
    outcomes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    latency: list[float] = []
    lost: list[str] = []
    kills: list[dict[str, object]] = []
    states_seen: Counter[str] = Counter()
    lock = threading.Lock()
    t_start = time.monotonic()
    stop_at = t_start + args.minutes * 60
    n_kills = int(args.minutes * 60 // args.kill_every)
    server_kill = n_kills // 2 if args.kill_server else -1
    double_kill = 2 if server_kill != 2 else 3  # this kill takes both workers, back to back
    unfinished: list[str] = []
    budgets: dict[str, int] = {}
    try:
        with SwarmClient(f"127.0.0.1:{srv.port}", token=TOKEN) as c:
            c.launch(CONFIG)
            time.sleep(2)
            assert srv.proc is not None
            rss_start = rss_by_role(srv.proc.pid)

            def client(k: int) -> None:
                rng = random.Random(k)
                while time.monotonic() < stop_at:
                    t0 = time.monotonic()
                    target = {"new_agent": True} if rng.random() < 0.1 else {"agent": f"chat-{rng.randrange(8)}"}
                    try:
                        job = c.submit("soak", messages=[("user", rng.choice(PROMPTS))], max_tokens=rng.randint(8, 48),
                                       **target)[0]  # fmt: skip
                    except grpc.RpcError as e:  # not accepted: refused, or the server is down (not a loss)
                        with lock:
                            outcomes["refused"] += 1
                            reasons[f"{e.code().name}: {(e.details() or '')[:60]}"] += 1
                        time.sleep(0.2)
                        continue
                    cancel_after = rng.randint(1, 6) if rng.random() < args.cancel_rate else None
                    got, expect, final = 0, 0, None
                    try:
                        for ev in c.stream(job.id, timeout=600, retries=STREAM_RETRIES):
                            if ev.offset != expect:
                                raise AssertionError(f"gap or repeat at {ev.offset} (expected {expect})")
                            expect += len(ev.token_ids)
                            got += len(ev.token_ids)
                            if cancel_after is not None and got >= cancel_after:
                                cancel_after = None
                                try:
                                    c.cancel(job.id)
                                except grpc.RpcError as e:  # the server is restarting: the job just runs on
                                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                                        raise
                            if ev.done:
                                final = ev.job
                    except Exception as e:  # noqa: BLE001 - a broken stream is a lost job
                        with lock:
                            lost.append(f"{job.id}: {type(e).__name__}: {e}")
                        continue
                    with lock:
                        if final is None:
                            lost.append(f"{job.id}: the stream ended without the job ending")
                        else:
                            outcomes[final.state] += 1
                            reasons[final.finish_reason] += 1
                            if final.state == "done":
                                latency.append(time.monotonic() - t0)

            threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.clients)]
            for t in threads:
                t.start()
            next_kill, k = t_start + args.kill_every, 0
            while time.monotonic() < stop_at:
                time.sleep(1)
                try:
                    for info in c.swarms():
                        states_seen[info.state] += 1
                except grpc.RpcError:
                    states_seen["(server down)"] += 1
                if time.monotonic() < next_kill:
                    continue
                next_kill += args.kill_every
                at = round(time.monotonic() - t_start, 1)
                if k == server_kill:
                    srv.kill()
                    kills.append({"t_s": at, "killed": "server"})
                    t0 = time.monotonic()
                    srv.start()
                    kills[-1]["restart_s"] = round(time.monotonic() - t0, 1)
                else:
                    pids = srv.workers()
                    names = sorted(pids) if k == double_kill else sorted(pids)[k % max(len(pids), 1) :][:1]
                    for name in names:  # the workers in turn; at double_kill both, back to back
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pids[name], signal.SIGKILL)
                        kills.append({"t_s": at, "killed": name, "pid": pids[name]})
                k += 1
                with lock:
                    print(f"[{time.strftime('%H:%M:%S')}] killed {[x['killed'] for x in kills if x['t_s'] == at]}; "
                          f"so far {dict(outcomes)}, lost {len(lost)}", flush=True)  # fmt: skip
            for t in threads:
                t.join(timeout=900)
            rss_end = rss_by_role(srv.proc.pid)
            budgets = {w.worker: w.kv_bytes_budget for w in c.placement("soak").workers}
            unfinished = [j.id for st in ("queued", "running") for j in c.jobs("soak", state=st, limit=1000)]
            final_state = next((i.state for i in c.swarms() if i.name == "soak"), "(gone)")
    finally:
        srv.stop()
    failed = states_seen.get("failed", 0) > 0 or final_state != "running"
    result = {
        "minutes": args.minutes, "clients": args.clients, "kill_server": args.kill_server, "kills": kills,
        "outcomes": dict(outcomes), "reasons": dict(reasons.most_common(20)), "lost": lost,
        "unfinished_on_server": unfinished, "swarm_states_seen": dict(states_seen), "swarm_state_end": final_state,
        "latency_p50_s": pct(latency, 50), "latency_p99_s": pct(latency, 99),
        "rss_start": rss_start, "rss_end": rss_end, "kv_budgets_end": budgets, "date": time.strftime("%Y-%m-%d"),
        "python": sys.version.split()[0], "run_dir": str(out),
    }  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "lost"}, indent=2))
    print(f"lost: {len(lost)}" + (f" (first: {lost[0]})" if lost else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(1 if lost or unfinished or failed else 0)


if __name__ == "__main__":
    main()
