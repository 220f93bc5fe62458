"""Search the sublayers Draft & Verify skips, with Bayesian optimisation (as in the paper).

    python -m decoders.search_skip --model embedded --trials 60

Each trial proposes a skip set (one yes/no per attention block and per MLP block; optuna's TPE
sampler), decodes the training prompts greedily with `self_speculative`, and scores the set by its
modelled cost per generated token. Decoding is memory-bound, so a forward costs what it reads: a
draft forward costs the share of weights it keeps, a verification forward 1 + VERIFY_PER_TOKEN per
extra token (measured: 8 tokens cost ~1.35x one token on the packed CPU kernels). A cost model
instead of the stopwatch makes trials comparable on a noisy machine; the benchmark measures time.

The training prompts (`assets/search_prompts.jsonl`) are written for this search and are not
benchmark prompts. The best set is written to `assets/skip_sets/<model>.json` with its score and
the command that reproduces it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench import load_prompts
from .engine import generate
from .events import Forward
from .models import ModelBundle, load_model
from .runtime import SkipSet
from .self_speculative import format_skip, skip_set_path

VERIFY_PER_TOKEN = 0.05
DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "search_prompts.jsonl"


def modelled_cost(events: Sequence[Any], kept_fraction: float) -> float:
    """Cost of a run in units of one full one-token forward (prefill excluded: same for all)."""
    cost = 0.0
    for e in events:
        if isinstance(e, Forward) and e.kind == "draft":
            cost += kept_fraction
        elif isinstance(e, Forward) and e.kind in ("target", "verify"):
            cost += 1.0 + VERIFY_PER_TOKEN * (e.n_input_tokens - 1)
    return cost


def score(
    bundle: ModelBundle, skip: SkipSet, prompts: Sequence[Any], max_new_tokens: int
) -> dict[str, float]:
    """Modelled speedup over autoregressive (which costs 1 per token) on the prompts."""
    cost = tokens = forwards = 0.0
    accepted: list[float] = []
    kept = skip.kept_fraction(bundle)
    for prompt in prompts:
        res = generate(
            bundle,
            prompt.text,
            "self_speculative",
            max_new_tokens,
            chat=prompt.chat,
            skip=format_skip(skip),
        )
        # The first token comes from the prefill, as for autoregressive: count the rest.
        cost += modelled_cost(res.events, kept)
        tokens += len(res.token_ids) - 1
        forwards += res.stats["target_forwards"] - 1
        if res.stats.get("mean_acceptance_length"):
            accepted.append(res.stats["mean_acceptance_length"])
    return {
        "modelled_speedup": round(tokens / cost, 4) if cost else 1.0,
        "tokens_per_target_forward": round(tokens / forwards, 4) if forwards else 1.0,
        "mean_acceptance_length": round(sum(accepted) / len(accepted), 4) if accepted else 1.0,
        "kept_fraction": round(kept, 4),
    }


def search(
    bundle: ModelBundle,
    prompts: Sequence[Any],
    trials: int,
    max_new_tokens: int,
    seed: int,
    log=print,
) -> tuple[SkipSet, dict[str, float]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n = bundle.n_layers

    def objective(trial: optuna.Trial) -> float:
        skip = SkipSet(
            frozenset(i for i in range(n) if trial.suggest_int(f"attn_{i}", 0, 1)),
            frozenset(i for i in range(n) if trial.suggest_int(f"mlp_{i}", 0, 1)),
        )
        if not skip:
            return 1.0  # skipping nothing: the draft is the target, no faster than autoregressive
        result = score(bundle, skip, prompts, max_new_tokens)
        trial.set_user_attr("result", result)
        log(f"trial {trial.number:3d}: {result['modelled_speedup']:.3f}x  {format_skip(skip)}")
        return result["modelled_speedup"]

    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=10)
    )
    # Start from the paper's observation that skipping the later layers' blocks is cheapest.
    study.enqueue_trial(
        {f"{k}_{i}": int(i >= n // 2 and i % 2 == 1) for i in range(n) for k in ("attn", "mlp")}
    )
    study.optimize(objective, n_trials=trials)
    best = study.best_trial
    skip = SkipSet(
        frozenset(i for i in range(n) if best.params[f"attn_{i}"]),
        frozenset(i for i in range(n) if best.params[f"mlp_{i}"]),
    )
    return skip, best.user_attrs.get("result", {"modelled_speedup": best.value})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m decoders.search_skip", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--limit", type=int, default=6, help="training prompts per trial")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default: assets/skip_sets/<model>.json")
    args = parser.parse_args(argv)

    bundle = load_model(args.model)
    prompts = load_prompts(args.prompts, limit=args.limit)
    skip, result = search(bundle, prompts, args.trials, args.max_new_tokens, args.seed)
    out = Path(args.out) if args.out else skip_set_path(bundle.model_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m decoders.search_skip " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    record = {
        "model": bundle.model_id,
        "attn": sorted(skip.attn),
        "mlp": sorted(skip.mlp),
        "score": result,
        "objective": "modelled speedup over autoregressive (see decoders/search_skip.py)",
        "trials": args.trials,
        "prompts": Path(args.prompts).name,
        "limit": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "command": command.strip(),
        "date": datetime.date.today().isoformat(),
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"best: {format_skip(skip)}  {result}\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
