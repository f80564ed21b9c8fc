"""`swarm generate` and `swarm calibrate`: the commands that run the engine on this host.

Their imports of the engine stay inside the functions, so `swarm --help` works without it.
"""

from __future__ import annotations

import argparse
import json
import sys

BACKEND_CHOICES = ("cpu", "vulkan")  # worker.devices.BACKENDS (that module loads the engine; --help must not)


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """--backend and --device of the commands that run the engine here."""
    p.add_argument("--backend", default="cpu", choices=BACKEND_CHOICES, help="where the engine runs (default: cpu)")
    p.add_argument(
        "--device", type=int, default=0, help="with --backend vulkan: the Vulkan device (`swarm devices` lists them)"
    )


def _check_backend(args: argparse.Namespace) -> str | None:
    """None, or the error line for a backend or device this host lacks (what to install, or the devices)."""
    from worker.devices import check_backend
    from worker.errors import DeviceError

    try:
        check_backend(args.backend, args.device)
    except DeviceError as e:
        return f"swarm {args.command}: --backend {args.backend} --device {args.device}: {e}"
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    # Imported here so `swarm --help` works without the compiled engine.
    from worker.devices import backend_kwargs
    from worker.engine import Engine
    from worker.sampling import Sampling

    problem = _check_backend(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    on = backend_kwargs(args.backend, args.device)
    engine = Engine(args.model, kv_k=args.kv_k, kv_v=args.kv_v, threads=args.threads, **on)
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
                    "backend": args.backend if args.backend == "cpu" else f"{args.backend}:{args.device}",
                    "decode_tokens_per_s": round(result.decode_tokens_per_s, 2),
                }
            )
        )
    else:
        sys.stdout.write("\n")
        print(
            f"[{len(result.prompt_ids)} prompt tokens, {len(result.token_ids)} generated, "
            f"prefill {result.prefill_s * 1000:.0f} ms, decode {result.decode_tokens_per_s:.1f} tokens/s, "
            f"KV {args.kv_k}/{args.kv_v}, {_where(args, engine.isa)}, finish: {result.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _where(args: argparse.Namespace, isa: str) -> str:
    """The CPU's kernel level, or the Vulkan device the engine ran on."""
    if args.backend == "cpu":
        return isa
    from worker.devices import vulkan_device

    return vulkan_device(args.device).label


def cmd_calibrate(args: argparse.Namespace) -> int:
    import dataclasses

    from swarm.gguf_header import read_geometry
    from swarm.planner import Calibration
    from worker.calibrate import CalibrationOptions, calibrate
    from worker.formats import parse_pair
    from worker.models import resolve_model

    path = resolve_model(args.model)
    problem = _check_backend(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    opts = CalibrationOptions.quick(args.threads) if args.quick else CalibrationOptions(threads=args.threads)
    opts = dataclasses.replace(opts, backend=args.backend, device=args.device)
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
    steps = []
    for b in sizes:
        lo, hi = cal.weight_time_interval(b)
        steps.append(f"batch {b} {w[b - 1] * 1e3:.2f} ms ({lo * 1e3:.2f}-{hi * 1e3:.2f})")
    rows.append("decode step at tiny context (weight stream): " + ", ".join(steps))
    rows.append("medians of the repeats; intervals: the repeats' interquartile range")
    if not cal.reliable:
        rows.append("UNRELIABLE (plans for this host use its measured bandwidth instead):")
        rows.extend(f"  {p}" for p in cal.problems)
    return "\n".join(rows)
