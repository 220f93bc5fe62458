"""The benchmark's contestants and its measuring loop: every contestant on every prompt, in an
order rotated per prompt, each row summarised against our autoregressive (decoders/bench.py runs it).

A contestant is one of our method specs (decoders/specs.py) or a transformers peer
(`hf_greedy`, `hf_prompt_lookup[:n]`, `hf_early_exit[:layer]`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from decoders.bench_prompts import Prompt
from decoders.core import quality
from decoders.core.errors import InvalidInput
from decoders.core.models import ModelBundle
from decoders.core.params import validate_params
from decoders.core.stats import pooled_acceptance
from decoders.engine import generate, get_method
from decoders.specs import parse_method

# --- contestants -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    tokens: list[int]
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Contestant:
    label: str
    run: Callable[[list[int], int], Outcome]
    ours: bool = True
    outcomes: list[Outcome] = field(default_factory=list)
    lossy: bool = False  # no claim to match greedy: scored for quality (decoders/core/quality.py)


def our_method(bundle: ModelBundle, spec: str, record: bool = True) -> Contestant:
    """One of our method specs as a contestant; `record=False` runs it with the trace off."""
    name, raw = parse_method(spec)
    method = get_method(name)
    params = validate_params(method.schema, raw, name)

    def run(prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        res = generate(bundle, prompt_ids, name, max_new_tokens, record=record, **params)
        return Outcome(res.token_ids, res.stats["wall_s"], res.stats)

    return Contestant(
        spec + ("" if record else " [trace off]"), run, lossy=not method.claims_lossless(params)
    )


def hf_peer(bundle: ModelBundle, spec: str) -> Contestant:
    """transformers' own generate(): greedy, prompt lookup, or assisted generation with early exit."""
    name, _, arg = spec.partition(":")
    options: dict[str, Any] = {
        "hf_greedy": {},
        "hf_prompt_lookup": {"prompt_lookup_num_tokens": int(arg or 10)},
        "hf_early_exit": {"assistant_early_exit": int(arg or 16)},
    }.get(name)
    if options is None:
        raise InvalidInput(
            f"unknown peer {spec!r}; valid: hf_greedy, hf_prompt_lookup[:n], hf_early_exit[:layer]"
        )
    label = {
        "hf_greedy": "transformers greedy",
        "hf_prompt_lookup": "transformers prompt lookup",
        "hf_early_exit": "transformers early exit",
    }[name]
    label += f" ({next(iter(options.values()))})" if options else ""

    def run(prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        ids = torch.tensor([prompt_ids], device=bundle.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = bundle.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=bundle.tokenizer.eos_token_id,
                eos_token_id=sorted(bundle.eos_ids),
                **options,
            )
        if bundle.device.type == "cuda":
            torch.cuda.synchronize(bundle.device)
        wall = time.perf_counter() - start
        return Outcome(out[0, len(prompt_ids) :].tolist(), wall)

    return Contestant(label, run, ours=False)


# --- the run ---------------------------------------------------------------------------------------


def run_benchmark(
    bundle: ModelBundle,
    prompts: Sequence[Prompt],
    contestants: list[Contestant],
    max_new_tokens: int,
    reference: Contestant,
    warmup: bool = True,
    log: Callable[[str], None] = lambda s: None,
    repeat: int = 1,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Every contestant on every prompt, in an order rotated per prompt. With `repeat` > 1 the
    whole set runs that many times (each run rotated one further, so the orders differ), and
    each row also gets its speedup in each run: the spread between runs says how much a ratio
    can be trusted on a noisy machine. `deadline` (a perf_counter time): no prompt starts after
    it, and the result covers the prompts that ran (`cut` counts the others)."""
    n_set = len(prompts)
    prompts = list(prompts) * repeat
    encoded = [bundle.encode(p.text, p.chat) for p in prompts]
    if warmup:
        for c in contestants:
            c.run(encoded[0], min(8, max_new_tokens))
    references: list[list[int]] = []
    cut = 0
    for i, ids in enumerate(encoded):
        if deadline is not None and time.perf_counter() > deadline and i:
            cut = len(encoded) - i
            log(f"deadline: {cut} of {len(encoded)} prompts not run")
            prompts, encoded = prompts[:i], encoded[:i]
            n_set = min(n_set, i)
            break
        shift = (i + i // n_set) % len(contestants)  # each run shifts: no prompt keeps its order
        order = contestants[shift:] + contestants[:shift]
        for c in order:
            c.outcomes.append(c.run(ids, max_new_tokens))
        references.append(reference.outcomes[-1].tokens)
        log(
            f"[{i + 1}/{len(prompts)}] {prompts[i].id}: "
            + ", ".join(
                f"{c.label} {len(c.outcomes[-1].tokens) / c.outcomes[-1].wall_s:.1f} tok/s"
                for c in contestants
            )
        )
    base = summarize(reference, references)
    rows = [
        summarize(c, references, base["tokens_per_s"], base["per_prompt_tps"]) for c in contestants
    ]
    if repeat > 1:
        for row, c in zip(rows, contestants, strict=True):
            row["speedup_runs"] = [
                round(
                    _rate(c.outcomes[a : a + n_set]) / _rate(reference.outcomes[a : a + n_set]), 3
                )
                for a in range(0, len(prompts), n_set)
            ]
    if any(c.lossy for c in contestants):
        for row, c in zip(rows, contestants, strict=True):
            if c.lossy or c is reference:
                row["quality"] = score_quality(bundle, encoded, references, c)
    groups = list(dict.fromkeys(p.group for p in prompts if p.group))
    if len(groups) > 1:
        for row, c in zip(rows, contestants, strict=True):
            row["group_speedup"] = {
                g: round(_tps(c, prompts, g) / _tps(reference, prompts, g), 3) for g in groups
            }
    return {
        "rows": rows,
        "prompts": [p.id for p in prompts[:n_set]],
        "groups": groups,
        "repeat": repeat,
        **({"cut": cut} if cut else {}),
    }


def score_quality(
    bundle: ModelBundle, encoded: list[list[int]], references: list[list[int]], c: Contestant
) -> dict[str, float]:
    """Means over the prompts of each output's agreement with greedy, ROUGE-L, NLL and
    self-consistency (decoders/core/quality.py)."""
    scores: dict[str, list[float]] = {}
    for ids, ref, o in zip(encoded, references, c.outcomes, strict=True):
        q = quality.compare(ref, o.tokens)
        each = {"agreement": q.agreement, "rouge_l": q.rouge_l}
        each |= quality.under_target(bundle, ids, o.tokens)
        for k, v in each.items():
            scores.setdefault(k, []).append(v)
    return {k: round(sum(v) / len(v), 4) for k, v in scores.items()}


def _rate(runs: Sequence[Outcome]) -> float:
    """Aggregate tokens/s over some runs."""
    wall = sum(o.wall_s for o in runs)
    return sum(len(o.tokens) for o in runs) / wall if wall else 0.0


def _tps(c: Contestant, prompts: Sequence[Prompt], group: str) -> float:
    """Aggregate tokens/s of one contestant over one task group's prompts."""
    return _rate([o for o, p in zip(c.outcomes, prompts, strict=True) if p.group == group])


def summarize(
    c: Contestant,
    references: list[list[int]],
    base_tps: float | None = None,
    base_per_prompt: list[float] | None = None,
) -> dict[str, Any]:
    """One contestant's row: its tokens/s, lossless count and readings, and with `base_tps`
    its speedup over the reference (aggregate and per-prompt geometric mean)."""
    tokens = sum(len(o.tokens) for o in c.outcomes)
    wall = sum(o.wall_s for o in c.outcomes)
    per_prompt = [len(o.tokens) / o.wall_s if o.wall_s else 0.0 for o in c.outcomes]
    row: dict[str, Any] = {
        "contestant": c.label,
        "ours": c.ours,
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 3) if wall else 0.0,
        "per_prompt_tps": [round(x, 3) for x in per_prompt],
        "lossless": sum(o.tokens == r for o, r in zip(c.outcomes, references, strict=True)),
        "n": len(c.outcomes),
        "lossy": c.lossy,
    }
    if base_tps:
        row["speedup"] = round(row["tokens_per_s"] / base_tps, 3)
        ratios = [a / b for a, b in zip(per_prompt, base_per_prompt or [], strict=True) if a and b]
        row["speedup_geomean"] = (
            round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3) if ratios else None
        )
    if c.ours:
        row |= pooled_acceptance(o.stats for o in c.outcomes)  # the prompts as one run
        weighed = [
            (o.stats["layers_per_token"], len(o.tokens) - 1)
            for o in c.outcomes
            if o.stats.get("layers_per_token") is not None
        ]
        n = sum(w for _, w in weighed)
        row["layers_per_token"] = round(sum(v * w for v, w in weighed) / n, 4) if n else None
        exits = [o.stats.get("exit_depth") for o in c.outcomes]
        exits = [(v, len(o.tokens) - 1) for v, o in zip(exits, c.outcomes, strict=True) if v]
        n = sum(w for _, w in exits)
        row["exit_depth"] = round(sum(v * w for v, w in exits) / n, 4) if n else None
    return row
