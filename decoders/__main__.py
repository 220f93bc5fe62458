"""Command line: python -m decoders --method autoregressive --prompt "..." [--json] [--check-lossless]

    python -m decoders --prices [--remeasure] [--model ID]   # this machine's price table (JSON)

Errors print one line to stderr and exit 2; a failed lossless check exits 1 (a lossy method
makes no claim: --check-lossless prints how close it came and exits 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from decoders.core import quality
from decoders.core.errors import DecodingLabError, InvalidParameter
from decoders.core.models import load_model
from decoders.engine import (
    MAX_NEW_TOKENS_CAP,
    calibrate,
    check_lossless,
    check_request,
    generate,
    greedy_reference,
)
from decoders.registry import METHODS


def parse_param(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise InvalidParameter(f"--param expects NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    methods = "\n".join(
        f"  {m.name:<16} {m.summary}\n"
        + "".join(f"      {p.name}={p.default!r}: {p.help}\n" for p in m.schema)
        for m in METHODS.values()
    )
    parser = argparse.ArgumentParser(
        prog="python -m decoders",
        description="Run one decoding method on a prompt and print its output, stats or full trace.",
        epilog=f"methods and their --param names:\n{methods}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--method", default="autoregressive", help="decoding method (see below)")
    parser.add_argument("--prompt", help="prompt text (required unless --prices)")
    parser.add_argument(
        "--prices",
        action="store_true",
        help="print the model's price table on this machine as JSON (measured and stored the "
        "first time): what every run's drafts are sized by and its work priced by",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="with --prices: measure the table again now and store it for every later run",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, help=f"generation budget, 1..{MAX_NEW_TOKENS_CAP}"
    )
    parser.add_argument(
        "--model", default=None, help="model id or path (default: embedded SmolLM2-135M)"
    )
    parser.add_argument(
        "--device-map",
        default=None,
        help="spread the model over devices with accelerate: 'auto' or a JSON map of module "
        'names to a GPU index, "cpu" or "disk" (offloaded), naming every module (or a parent '
        "of it) (default: $DECODING_LAB_DEVICE_MAP, else one device)",
    )
    parser.add_argument(
        "--max-memory",
        default=None,
        help="with --device-map auto: memory per device, e.g. 0=20GiB,cpu=60GiB",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="method parameter, repeatable",
    )
    chat = parser.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat", dest="chat", action="store_true", default=None, help="apply the chat template"
    )
    chat.add_argument(
        "--raw", dest="chat", action="store_false", help="feed the prompt as plain text"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object with the full trace"
    )
    parser.add_argument(
        "--check-lossless",
        action="store_true",
        help="also run autoregressive greedy and compare token ids",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.prices:
        try:
            bundle = load_model(args.model, device_map=args.device_map, max_memory=args.max_memory)
            table = calibrate(bundle, again=args.remeasure)
        except DecodingLabError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(table.to_dict(), indent=1))
        return 0
    if args.prompt is None:
        parser.error("--prompt is required (or --prices)")
    try:
        params: dict[str, Any] = dict(parse_param(p) for p in args.param)
        # Fail on bad input before the (slow) model load.
        check_request(args.prompt, args.method, args.max_new_tokens, params)
        bundle = load_model(args.model, device_map=args.device_map, max_memory=args.max_memory)
        result = generate(
            bundle, args.prompt, args.method, args.max_new_tokens, chat=args.chat, **params
        )
        check, scores = None, None
        if args.check_lossless and METHODS[args.method].claims_lossless(params):
            check = check_lossless(bundle, result)
        elif args.check_lossless:  # a lossy method makes no claim: say how close it came instead
            reference = greedy_reference(bundle, result.prompt_ids, result.max_new_tokens)
            scores = quality.compare(reference, result.token_ids).as_dict()
            scores |= quality.under_target(bundle, result.prompt_ids, result.token_ids)
    except DecodingLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

    if args.json:
        out = result.trace()
        if check is not None:
            out["lossless"] = {
                "identical": check.identical,
                "first_divergence": check.first_divergence,
                "near_tie": check.near_tie,
            }
        if scores is not None:
            out["quality"] = scores
        print(json.dumps(out))
    else:
        s = result.stats
        print(result.text)
        print(
            f"\n[{result.method}] {s['new_tokens']} tokens in {s['wall_s']:.2f}s "
            f"({s['tokens_per_s']:.1f} tok/s), {s['tokens_per_target_forward']:.2f} tokens/target forward, "
            f"finish: {result.finish_reason}",
            file=sys.stderr,
        )
        if scores is not None:
            print(
                f"lossy method: {100 * scores['agreement']:.0f}% of tokens agree with greedy"
                + (
                    ""
                    if scores["first_difference"] is None
                    else f", first difference at token {scores['first_difference']}"
                )
                + f"; ROUGE-L {scores['rouge_l']:.2f}, NLL {scores['nll']:.2f} nats/token, "
                f"{100 * scores['consistency']:.0f}% the target's own choice",
                file=sys.stderr,
            )
        elif check is not None:
            mark = "✓" if check.identical else "✗"
            print(f"lossless: {mark} {check.describe()}", file=sys.stderr)
    return 0 if check is None or check.identical else 1


if __name__ == "__main__":
    sys.exit(main())
