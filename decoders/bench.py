"""Benchmark: every chosen method and the transformers peers, side by side in one run.

    python -m decoders.bench                                  # HumanEval, first 20, 128 new tokens
    python -m decoders.bench --dataset spec_bench --category translation --limit 10
    python -m decoders.bench --dataset spec_bench --per-group 3     # 3 from each task group
    python -m decoders.bench --dataset prompts.txt --methods autoregressive --peers hf_greedy

These machines are noisy, so speed is reported as ratios measured in the same run: each prompt
runs every contestant, in an order rotated per prompt, after a warm-up. Speedup is a contestant's
aggregate tokens/s divided by our autoregressive's. Lossless counts compare token ids with our
autoregressive greedy output on the same prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

# The benchmark's parts, re-exported: the names other modules and the tests import from here.
from decoders.bench_prompts import (
    BENCHMARKS_ENV,
    DEFAULT_SPEC_BENCH,
    GROUP_NAMES,
    MT_BENCH,
    ROOT,
    Prompt,
    humaneval_path,
    load_prompts,
    spec_bench_path,
    task_group,
)
from decoders.bench_report import (
    RECORDED,
    markdown_table,
    quality_figure,
    quality_points,
    record_summary,
    write_outputs,
)
from decoders.bench_run import (
    Contestant,
    Outcome,
    hf_peer,
    our_method,
    run_benchmark,
    score_quality,
    summarize,
)
from decoders.core.costs import price_table
from decoders.core.errors import DecodingLabError, InvalidInput
from decoders.core.models import ModelBundle, load_model
from decoders.engine import calibrate, get_method
from decoders.specs import parse_method, split_specs

__all__ = [
    "BENCHMARKS_ENV",
    "DEFAULT_SPEC_BENCH",
    "GROUP_NAMES",
    "MT_BENCH",
    "RECORDED",
    "ROOT",
    "Contestant",
    "Outcome",
    "Prompt",
    "hf_peer",
    "humaneval_path",
    "load_prompts",
    "main",
    "markdown_table",
    "our_method",
    "parse_method",
    "quality_figure",
    "quality_points",
    "record_summary",
    "run_benchmark",
    "score_quality",
    "spec_bench_path",
    "summarize",
    "task_group",
    "write_outputs",
]


def _parser(method_names: list[str]) -> argparse.ArgumentParser:
    """The command line; `--methods` defaults to every method in `method_names`."""
    ap = argparse.ArgumentParser(
        prog="python -m decoders.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--dataset", default="humaneval", help="humaneval | spec_bench | path (.jsonl or .txt)"
    )
    ap.add_argument(
        "--category", default=None, help="Spec-Bench category filter (e.g. translation)"
    )
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument(
        "--per-group",
        type=int,
        default=None,
        help="Spec-Bench: the first N questions of each of its six task groups (overrides --limit)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="model id (default: the embedded SmolLM2-135M)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda when there is one)")
    ap.add_argument(
        "--dtype",
        default=None,
        help="float32 | float16 | bfloat16 (default: float32 on CPU, else float16)",
    )
    ap.add_argument(
        "--methods",
        default=",".join(method_names),
        help="comma-separated method specs, NAME[:KEY=VALUE...] (default: all)",
    )
    ap.add_argument(
        "--peers",
        default="hf_greedy,hf_prompt_lookup:10,hf_early_exit:16",
        help="transformers peers: hf_greedy, hf_prompt_lookup[:n], hf_early_exit[:layer]; '' for none",
    )
    ap.add_argument(
        "--no-overhead", action="store_true", help="skip the tracing-overhead contestant"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the prompts this many times over and report each run's speedup beside the whole's",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0 = torch's default; the app decodes on 1, and its price table "
        "is the 1-thread one)",
    )
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument(
        "--deadline",
        type=float,
        default=0,
        help="seconds: start no prompt after this (a lent GPU's call must end); the table covers "
        "the prompts that ran; 0 = none",
    )
    ap.add_argument("--out", default=None, help="output folder (default runs/bench-<time>)")
    ap.add_argument(
        "--record",
        default=None,
        metavar="NAME",
        help="also write the summary the explainers quote to assets/bench/NAME.json "
        "(decoders/core/facts.py reads it)",
    )
    return ap


def _contestants(
    args: argparse.Namespace,
) -> tuple[ModelBundle, list[Prompt], list[Contestant], Contestant]:
    """The model, the prompts, every contestant and the autoregressive reference among them."""
    if args.limit < 1 or args.max_new_tokens < 1 or args.repeat < 1:
        raise InvalidInput("--limit, --max-new-tokens and --repeat must be positive")
    prompts = load_prompts(args.dataset, args.category, args.limit, args.per_group)
    specs = split_specs(args.methods)
    for spec in specs:
        get_method(parse_method(spec)[0])
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generate()'s advisory warnings would drown the table
    bundle = load_model(args.model, device=args.device, dtype=args.dtype)
    if bundle.device.type == "cuda":  # float32 stays float32: no TF32 in the matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    contestants = [our_method(bundle, s) for s in specs]
    reference = next((c for c in contestants if c.label == "autoregressive"), None)
    if reference is None:
        reference = our_method(bundle, "autoregressive")
        contestants.insert(0, reference)
    if not args.no_overhead:
        contestants.append(our_method(bundle, "autoregressive", record=False))
    contestants += [hf_peer(bundle, s) for s in split_specs(args.peers)]
    return bundle, prompts, contestants, reference


def _meta(args: argparse.Namespace, bundle: ModelBundle, result: dict) -> dict:
    """What the run was: the model, the device, the data, the versions and the measured prices."""
    return {
        "model": bundle.model_id,
        "device": str(bundle.device)
        if bundle.device.type == "cpu"
        else torch.cuda.get_device_name(bundle.device),
        "dtype": str(bundle.dtype).replace("torch.", ""),
        "draft_dtype": str(bundle.drafting_dtype).replace("torch.", ""),
        "dataset": args.dataset,
        "category": args.category,
        "n_prompts": len(result["prompts"]),
        "per_group": args.per_group,
        "repeat": args.repeat,
        "max_new_tokens": args.max_new_tokens,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        # sdpa_gqa (decoders/core/attention.py) or what DECODING_LAB_GQA=0 left: runs compare
        "attention": getattr(bundle.model.config, "_attn_implementation", None),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        # The price table every tree was sized by and every run's work priced by
        "prices": price_table(bundle).to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print its table and write its outputs; 2 on bad input."""
    from decoders import METHODS

    args = _parser(list(METHODS)).parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    try:
        bundle, prompts, contestants, reference = _contestants(args)
    except DecodingLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The stored price table, or measured now before the first prompt (meta.prices): every
    # contestant's trees are sized by it and its work priced by it.
    calibrate(bundle)

    result = run_benchmark(
        bundle,
        prompts,
        contestants,
        args.max_new_tokens,
        reference,
        warmup=not args.no_warmup,
        log=lambda s: print(s, file=sys.stderr, flush=True),
        repeat=args.repeat,
        deadline=started + args.deadline if args.deadline else None,
    )
    rows = {r["contestant"]: r for r in result["rows"]}
    if "autoregressive [trace off]" in rows:
        result["trace_overhead"] = round(
            1
            - rows["autoregressive"]["tokens_per_s"]
            / rows["autoregressive [trace off]"]["tokens_per_s"],
            4,
        )
    meta = _meta(args, bundle, result)
    table = markdown_table(result, meta)
    print(table)
    out = Path(args.out) if args.out else ROOT / "runs" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    write_outputs(out, result, meta, table)
    print(f"\nwrote {out}/results.json, table.md, speedup.html", file=sys.stderr)
    if args.record:
        path = ROOT / "assets" / "bench" / f"{args.record}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = record_summary(result, meta, argv if argv is not None else sys.argv[1:])
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
