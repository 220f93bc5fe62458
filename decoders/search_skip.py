"""Search the sublayers Draft & Verify skips, with Bayesian optimisation (as in the paper).

    python -m decoders.search_skip --model embedded --trials 60

Each trial proposes a skip set (one yes/no per attention block and per MLP block; optuna's TPE
sampler), decodes the training prompts greedily with `self_speculative`, and scores the set by its
modelled cost per generated token, the paper's objective (time per verified token). Decoding is
memory-bound, so a forward costs what it reads: a draft forward costs the share of weights it keeps,
a verification forward 1 + VERIFY_PER_TOKEN per extra token (measured: 8 tokens cost ~1.35x one
token on the packed CPU kernels). A cost model instead of the stopwatch makes trials comparable on a
noisy machine; the benchmark measures time.

Cost alone degenerates: on a small model no set pays for itself, and the cheapest way to lose is a
draft so bad that it never clears θ. With the old stop rule (the token below θ was dropped) every
step then paid one wasted draft forward and committed one target token (cost 1 + kept per token),
and skipping MORE blocks made that waste cheaper, so the search rewarded the worst draft (the set it
shipped drafted 0 tokens in 64). The decoder now keeps that token, as the authors' code does, and
the objective is constrained: a set must draft on at least `min_draft_share` of the steps and have
`min_acceptance` of its drafted tokens accepted. Feasible sets score their modelled speedup (> 0);
infeasible ones score minus their shortfall (< 0), so any set whose drafts are used beats any set
whose drafts are not, and TPE is still pulled towards feasibility.

The training prompts (`assets/search_prompts.jsonl`) are written for this search and are not
benchmark prompts. The best set is written to `assets/skip_sets/<model>.json` with its score and
the command that reproduces it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decoders.bench import load_prompts
from decoders.core.events import Draft, Forward, Verify
from decoders.core.models import ModelBundle, load_model
from decoders.core.runtime import SkipSet
from decoders.engine import generate
from decoders.trained.skip_sets import format_skip, skip_set_path

VERIFY_PER_TOKEN = 0.05
MIN_DRAFT_SHARE = 0.6  # "most steps draft": share of steps with at least one draft token
MIN_ACCEPTANCE = 0.5  # share of drafted tokens the target accepts
SKIP_CUT = 0.85  # a block is skipped when its trial value exceeds this
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
    bundle: ModelBundle,
    skip: SkipSet,
    prompts: Sequence[Any],
    max_new_tokens: int,
    **params: Any,
) -> dict[str, float]:
    """Modelled speedup over autoregressive (which costs 1 per token) on the prompts, and how the
    draft behaved: the share of steps that drafted, tokens drafted per step, acceptance."""
    cost = tokens = forwards = 0.0
    steps = drafting = drafted = accepted = 0
    kept = skip.kept_fraction(bundle)
    for prompt in prompts:
        res = generate(
            bundle,
            prompt.text,
            "self_speculative",
            max_new_tokens,
            chat=prompt.chat,
            skip=format_skip(skip),
            **params,
        )
        # The first token comes from the prefill, as for autoregressive: count the rest.
        cost += modelled_cost(res.events, kept)
        tokens += len(res.token_ids) - 1
        forwards += res.stats["target_forwards"] - 1
        steps += len({e.step for e in res.events if isinstance(e, Forward) and e.step > 0})
        for e in res.events:
            if isinstance(e, Draft):
                drafting += 1
                drafted += len(e.tokens)
            elif isinstance(e, Verify):
                accepted += len(e.accepted)
    return {
        "modelled_speedup": round(tokens / cost, 4) if cost else 1.0,
        "tokens_per_target_forward": round(tokens / forwards, 4) if forwards else 1.0,
        "draft_share": round(drafting / steps, 4) if steps else 0.0,
        "drafts_per_step": round(drafted / steps, 4) if steps else 0.0,
        "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "kept_fraction": round(kept, 4),
    }


def shortfall(
    result: dict[str, float],
    min_draft_share: float = MIN_DRAFT_SHARE,
    min_acceptance: float = MIN_ACCEPTANCE,
) -> float:
    """How far a set is from the constraints (0 = feasible). A set that never drafts misses both."""
    return max(0.0, min_draft_share - result["draft_share"]) + max(
        0.0, min_acceptance - result["draft_acceptance_rate"]
    )


def objective_value(
    result: dict[str, float],
    min_draft_share: float = MIN_DRAFT_SHARE,
    min_acceptance: float = MIN_ACCEPTANCE,
) -> float:
    """The constrained objective: the modelled speedup (> 0) when the set drafts on enough steps
    and enough of its drafts are accepted, otherwise minus the shortfall (< 0)."""
    missing = shortfall(result, min_draft_share, min_acceptance)
    return -missing if missing > 0 else result["modelled_speedup"]


def search(
    bundle: ModelBundle,
    prompts: Sequence[Any],
    trials: int,
    max_new_tokens: int,
    seed: int,
    log=print,
    *,
    min_draft_share: float = MIN_DRAFT_SHARE,
    min_acceptance: float = MIN_ACCEPTANCE,
    timeout: float | None = None,
    **params: Any,
) -> tuple[SkipSet, dict[str, float]]:
    """Maximise the constrained objective over skip sets; returns the best set and its result
    (with `feasible`, `objective` and the number of `trials` run). `params` go to the decoder."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n = bundle.n_layers

    def objective(trial: optuna.Trial) -> float:
        # As in the authors' search: one number in [0, 1] per block, skipped above a cut. A high
        # cut makes the random start propose light sets (a few blocks), whose drafts get used.
        skip = SkipSet(
            frozenset(i for i in range(n) if trial.suggest_float(f"attn_{i}", 0, 1) > SKIP_CUT),
            frozenset(i for i in range(n) if trial.suggest_float(f"mlp_{i}", 0, 1) > SKIP_CUT),
        )
        if not skip:
            return -(min_draft_share + min_acceptance)  # skipping nothing: no draft at all
        result = score(bundle, skip, prompts, max_new_tokens, **params)
        value = objective_value(result, min_draft_share, min_acceptance)
        trial.set_user_attr("result", result)
        log(
            f"trial {trial.number:3d}: {value:+.3f}  {result['modelled_speedup']:.3f}x  "
            f"drafts on {result['draft_share']:.0%} of steps, {result['drafts_per_step']:.2f}/step,"
            f" {result['draft_acceptance_rate']:.0%} accepted  kept {result['kept_fraction']:.2f}  "
            f"{format_skip(skip)}"
        )
        return value

    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=6)
    )
    # Start from the paper's observation that the later layers' blocks are the ones to skip:
    # their attention blocks (cheap to keep, so the draft stays close), then heavier variants.
    later = [i for i in range(n) if i >= n // 2]
    odd = [i for i in later if i % 2 == 1]
    for attn, mlp in ((odd, []), (later, []), (odd[-4:], odd[-4:]), (later, odd[-4:])):
        study.enqueue_trial(
            {f"attn_{i}": float(i in attn) for i in range(n)}
            | {f"mlp_{i}": float(i in mlp) for i in range(n)}
        )
    study.optimize(objective, n_trials=trials, timeout=timeout)
    best = study.best_trial
    skip = SkipSet(
        frozenset(i for i in range(n) if best.params[f"attn_{i}"] > SKIP_CUT),
        frozenset(i for i in range(n) if best.params[f"mlp_{i}"] > SKIP_CUT),
    )
    result = dict(best.user_attrs.get("result", {"modelled_speedup": 1.0}))
    result["objective"] = round(best.value, 4)
    result["feasible"] = best.value > 0
    result["trials"] = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    return skip, result


def spread(items: Sequence[Any], limit: int | None) -> list[Any]:
    """`limit` items evenly spread over the list (the prompts file lists code first, then chat)."""
    if not limit or limit >= len(items):
        return list(items)
    return [items[i * len(items) // limit] for i in range(limit)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m decoders.search_skip", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument(
        "--limit", type=int, default=6, help="training prompts per trial (spread over the file)"
    )
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--min-draft-share", type=float, default=MIN_DRAFT_SHARE)
    parser.add_argument("--min-acceptance", type=float, default=MIN_ACCEPTANCE)
    parser.add_argument("--threshold", type=float, default=None, help="θ (default: the method's)")
    parser.add_argument("--max-draft", type=int, default=None, help="default: the method's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default: assets/skip_sets/<model>.json")
    args = parser.parse_args(argv)

    bundle = load_model(args.model)
    prompts = spread(load_prompts(args.prompts), args.limit)
    params = {
        k: v
        for k, v in (("threshold", args.threshold), ("max_draft", args.max_draft))
        if v is not None
    }
    began = time.monotonic()
    skip, result = search(
        bundle,
        prompts,
        args.trials,
        args.max_new_tokens,
        args.seed,
        min_draft_share=args.min_draft_share,
        min_acceptance=args.min_acceptance,
        timeout=args.timeout,
        **params,
    )
    minutes = (time.monotonic() - began) / 60
    if not result["feasible"]:
        print(
            f"no set met the constraints (drafts on >= {args.min_draft_share:.0%} of steps, "
            f">= {args.min_acceptance:.0%} accepted) in {result['trials']} trials; closest: "
            f"{format_skip(skip)} {result}. Nothing written: run more trials or relax them."
        )
        return 1
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
        "objective": (
            "modelled speedup over autoregressive, subject to drafting on >= "
            f"{args.min_draft_share:.0%} of steps with >= {args.min_acceptance:.0%} of drafts "
            "accepted (see decoders/search_skip.py)"
        ),
        "trials": result["trials"],
        "minutes": round(minutes, 1),
        "prompts": [p.id for p in prompts],
        "max_new_tokens": args.max_new_tokens,
        "decoder_params": params,
        "seed": args.seed,
        "command": command.strip(),
        "date": datetime.date.today().isoformat(),
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"best: {format_skip(skip)}  {result}  ({minutes:.1f} min)\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
