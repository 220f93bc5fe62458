"""Metrics folded from the event stream, with the serving engines' definitions (see docs/ARCHITECTURE.md).

- tokens per target forward = new tokens / target forward passes (prefill, target, verify and sync passes; FREE's shallow passes are
  counted as layers, not as forwards: its sync pass completes them)
- `mean_acceptance_length` = 1 + accepted drafts / verify steps: the tokens a verify step writes,
  the target's own (correction or bonus) included (vLLM's; EAGLE's τ)
- `draft_acceptance_rate` = accepted drafts / drafted tokens (vLLM's): a tree drafts many nodes
  and accepts one path, so a long acceptance can come with a low rate
- `acceptance_per_position[i]` = verify steps that accepted at least i + 1 drafts / verify steps
  (vLLM's per-position acceptance); `acceptance_by_position[j]` = the same count / the steps
  whose draft reached depth j (how often depth j holds when it is tried)
- `acceptance_histogram[j]` = verify steps that accepted exactly j drafts;
  `acceptance_histogram_by_draft_length[n]` = the same over the steps that drafted n tokens
- `draft_sources[source]` = drafted, accepted and draft ms per draft source (the drafter named
  by the Draft event; a tree's copied branch as "copied"), as llama.cpp reports per source
- layers per token = target decoder layers run per input after the prefill (target, verify and
  FREE's shallow and sync passes: Σ layers × inputs), per token after the first, as a share of the model's depth (the
  prefill's): 1 for autoregressive decoding, below 1 where tokens exit early (a draft's own
  layers are not counted, nor CALM's oracle passes)
- `draft_forwards_per_step` = draft forwards / verify steps (an EAGLE chain pays one per drafted
  token, a block drafter one per step); `draft_work_per_step` = those forwards priced by the
  price table, in one-token target forwards, per verify step (what drafting costs a step here)
- input cost, draft cost = what a sized draft (token_tree's size=cost, speculative's
  schedule=cost) priced one more verified input and one draft forward at, in one-token target
  forwards (the Priced event; None when the run sized nothing)
- tokens per second = new tokens / (wall time - the prefill's); time to first token (`ttft_s`) =
  the prefill's time, reported on its own
- exit depth (early exit) = where tokens were written from, as a share of the depth (LayerExit
  events), whatever their skipped layers cost afterwards
- `work` = the run's forwards after the prefill priced by the price table (costs.PriceTable), in
  one-token target forwards (a target forward by its inputs and layers, a trained drafter's by
  its measured price), times the method's measured forward factor, plus its measured time
  between forwards per step; autoregressive decoding's is one such step per token after the
  first, so `modelled_speedup` = its work for as many tokens / the run's: deterministic for a
  model, method, parameters, prompt and table (what verdicts are decided on)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from decoders.core.events import Commit, Draft, Event, Forward, LayerExit, Priced, Verify
from decoders.core.prices import REFERENCE, PriceTable, drafter_key
from decoders.core.tree import depths

TARGET_KINDS = ("prefill", "target", "verify", "sync")
# The readings that measure time, not decoding: the only ones two runs of the same work may differ
# in (a draft source's `draft_ms` too).
TIMING_KEYS = frozenset({"wall_s", "ttft_s", "tokens_per_s", "time_ms", "model_ms"})


def untimed(stats: dict[str, Any]) -> dict[str, Any]:
    """A run's stats without their clock: what the same settings must reproduce exactly."""
    out = {k: v for k, v in stats.items() if k not in TIMING_KEYS}
    if "draft_sources" in out:
        out["draft_sources"] = {
            name: {k: v for k, v in row.items() if k != "draft_ms"}
            for name, row in out["draft_sources"].items()
        }
    return out


class StatsAccumulator:
    def __init__(self, prices: PriceTable | None = None, method: str | None = None) -> None:
        self.prices, self.method = prices, method
        self.work = 0.0  # priced forwards after the prefill, in one-token target forwards
        self.draft_work = 0.0  # the draft forwards' share of it
        self.steps = 0  # steps after the prefill's (each commits once)
        self.unpriced: list[Forward] = []  # this step's draft forwards, until its Draft names them
        self.new_tokens = 0
        self.forwards: Counter[str] = Counter()
        self.ms: defaultdict[str, float] = defaultdict(float)
        self.draft_depth: dict[int, int] = {}  # step -> deepest draft level proposed
        self.drafted = 0
        self.verify_steps = 0
        self.accepted = 0
        self.histogram: Counter[int] = Counter()
        self.by_length: defaultdict[int, Counter[int]] = defaultdict(Counter)
        self.drafts: dict[int, Draft] = {}  # step -> its draft, until its verdict
        self.draft_ms: defaultdict[int, float] = defaultdict(float)  # step -> its draft forwards
        self.sources: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.source_ms: defaultdict[str, float] = defaultdict(float)
        self.proposed_at: Counter[int] = Counter()
        self.accepted_at: Counter[int] = Counter()
        self.origins: Counter[str] = Counter()
        self.depth = 0  # the model's layers (the prefill runs them all)
        self.layer_inputs = 0  # Σ layers × inputs over target and verify passes
        self.exits, self.exit_share = 0, 0.0  # early exit: tokens, Σ (layer left at / depth)
        self.priced: Priced | None = None  # what a sized draft was priced by

    def add(self, event: Event) -> None:
        if isinstance(event, Forward):
            self.forwards[event.kind] += 1
            self.ms[event.kind] += event.wall_ms
            if event.kind == "draft":  # priced once the step's Draft names its drafter
                self.draft_ms[event.step] += event.wall_ms
                self.unpriced.append(event)
            elif event.kind != "prefill":
                self._price(event)
            if event.kind == "prefill":
                self.depth = max(self.depth, event.layers)
            elif event.kind in ("target", "verify", "shallow", "sync"):
                self.layer_inputs += event.layers * event.n_input_tokens
        elif isinstance(event, Commit):
            self.new_tokens += len(event.tokens)
            self.steps += event.step > 0
            self.origins.update(event.origins)
        elif isinstance(event, Draft):
            self.drafted += len(event.tokens)
            self.drafts[event.step] = event
            self._price_drafts(drafter_key(event.source))
            copied = set(event.copied)
            for i in range(len(event.tokens)):
                self.sources[_source(event, i, copied)]["drafted"] += 1
            self.source_ms[_source(event, -1, copied)] += self.draft_ms.pop(event.step, 0.0)
            if event.tokens:
                deepest = max(depths(event.parents)) + 1
                self.draft_depth[event.step] = max(self.draft_depth.get(event.step, 0), deepest)
        elif isinstance(event, Priced):
            self.priced = event
        elif isinstance(event, LayerExit):
            self.exits += 1
            self.exit_share += event.layer / event.n_layers
        elif isinstance(event, Verify):
            n = len(event.accepted)
            self.verify_steps += 1
            self.accepted += n
            self.histogram[n] += 1
            draft = self.drafts.pop(event.step, None)
            if draft is not None:
                self.by_length[len(draft.tokens)][n] += 1
                copied = set(draft.copied)
                for i in event.accepted:
                    self.sources[_source(draft, i, copied)]["accepted"] += 1
            for j in range(self.draft_depth.get(event.step, n)):
                self.proposed_at[j] += 1
                self.accepted_at[j] += j < n

    def _price(self, e: Forward, drafter: str | None = None) -> None:
        if self.prices is None:
            return
        price = self.prices.drafters.get(drafter) if drafter else None
        if price is not None:
            work = price * self.prices.inputs(e.n_input_tokens)
        else:
            work = self.prices.forward(e.n_input_tokens, e.layers, self.depth)
        self.work += work
        if e.kind == "draft":
            self.draft_work += work

    def _price_drafts(self, drafter: str | None) -> None:
        for e in self.unpriced:
            self._price(e, drafter)
        self.unpriced = []

    def _modelled(self) -> dict[str, Any]:
        """The work (priced forwards, times the method's measured forward factor, plus its time
        between forwards per step) and autoregressive decoding's work for as many tokens over
        it, one token a forward at autoregressive's own measured cost a step."""
        if self.prices is None:
            return {"work": None, "modelled_speedup": None}
        factor, between = self.prices.per_step(self.method) if self.method else (1.0, 0.0)
        work = self.work * factor + self.steps * between
        ar_factor, ar_between = self.prices.per_step(REFERENCE) if self.method else (1.0, 0.0)
        reference = (self.new_tokens - 1) * (ar_factor + ar_between)
        return {
            "work": round(work, 3),
            "modelled_speedup": round(reference / work, 4)
            if work > 0 and self.new_tokens > 1
            else None,
            "price_error": self.prices.spread,  # the table's stated error (readings' margin)
        }

    def result(self, wall_s: float | None = None) -> dict[str, Any]:
        self._price_drafts(None)  # draft forwards no Draft named: by their layers
        target_forwards = sum(self.forwards[k] for k in TARGET_KINDS)
        model_ms = sum(self.ms.values())
        wall = wall_s if wall_s is not None else model_ms / 1000.0
        prefill_s = self.ms["prefill"] / 1000.0
        depth = max(self.proposed_at, default=-1) + 1
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": target_forwards,
            "draft_forwards": self.forwards["draft"],
            **acceptance_readings(
                self.new_tokens,
                target_forwards,
                self.accepted,
                self.drafted,
                self.histogram,
                self.sources,
                self.source_ms,
            ),
            "verify_steps": self.verify_steps,
            "draft_work": round(self.draft_work, 4) if self.prices else None,
            **drafting_per_step(
                self.forwards["draft"],
                self.draft_work if self.prices else None,
                self.verify_steps,
            ),
            "drafted_tokens": self.drafted,
            "accepted_drafts": self.accepted,
            "acceptance_by_position": [
                _ratio(self.accepted_at[j], self.proposed_at[j]) for j in range(depth)
            ],
            "acceptance_histogram_by_draft_length": {
                str(n): _histogram(h) for n, h in sorted(self.by_length.items())
            },
            "origins": dict(self.origins),
            "layers_per_token": (
                round(self.layer_inputs / (self.new_tokens - 1) / self.depth, 4)
                if self.depth and self.new_tokens > 1
                else None
            ),
            # Where tokens left (early exit), whatever the skipped layers then cost: below
            # layers_per_token's share when their keys and values are computed for real.
            "exit_depth": round(self.exit_share / self.exits, 4) if self.exits else None,
            # What a sized draft was priced by on this machine (a Priced event; None: not sized)
            "input_cost": self.priced.input_cost if self.priced else None,
            "draft_cost": self.priced.draft_cost if self.priced else None,
            **self._modelled(),
            "wall_s": round(wall, 4),
            # The prompt's forward (the first token's wait) apart: a long prompt's prefill said
            # nothing about how fast a method writes.
            "ttft_s": round(prefill_s, 4),
            "tokens_per_s": _ratio(self.new_tokens, wall - prefill_s if wall > prefill_s else wall),
            "time_ms": {k: round(v, 2) for k, v in self.ms.items()},
            "model_ms": round(model_ms, 2),
        }


def _histogram(counts: Counter[int]) -> list[int]:
    return [counts[j] for j in range(max(counts, default=-1) + 1)]


def _source(draft: Draft, node: int, copied: set[int]) -> str:
    """Who drafted node `node` (-1: the draft's forwards): a tree's copied branch, or the drafter
    the event names (costs.drafter_key)."""
    return "copied" if node in copied else drafter_key(draft.source)


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b else 0.0


def pooled_acceptance(runs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The acceptance readings and the modelled speedup of several runs' stats taken as one run
    (a benchmark's prompts): counts and work summed, then every reading under the same
    definitions as one run's."""
    runs = list(runs)
    total = Counter()
    hist: Counter[int] = Counter()
    sources: defaultdict[str, Counter[str]] = defaultdict(Counter)
    source_ms: defaultdict[str, float] = defaultdict(float)
    for r in runs:
        for k in ("new_tokens", "target_forwards", "verify_steps", "accepted_drafts"):
            total[k] += r.get(k) or 0
        total["draft_forwards"] += r.get("draft_forwards") or 0
        total["drafted_tokens"] += r.get("drafted_tokens") or 0
        hist.update(dict(enumerate(r.get("acceptance_histogram") or [])))
        for name, row in (r.get("draft_sources") or {}).items():
            sources[name].update({"drafted": row["drafted"], "accepted": row["accepted"]})
            source_ms[name] += row["draft_ms"]
    work = [r.get("work") for r in runs]
    drafting = [r.get("draft_work") for r in runs]
    draft_work = sum(drafting) if all(w is not None for w in drafting) else None
    # Autoregressive decoding's work for each run's tokens (its modelled speedup times its work:
    # the reference priced at autoregressive's own measured cost a step), summed, over the work.
    reference = sum((r.get("modelled_speedup") or 0.0) * (r.get("work") or 0.0) for r in runs)
    modelled = (
        round(reference / sum(work), 4) if all(w is not None for w in work) and sum(work) else None
    )
    return (
        {"modelled_speedup": modelled}
        | acceptance_readings(
            total["new_tokens"],
            total["target_forwards"],
            total["accepted_drafts"],
            total["drafted_tokens"],
            hist,
            sources,
            source_ms,
        )
        | {"verify_steps": total["verify_steps"]}
        | drafting_per_step(total["draft_forwards"], draft_work, total["verify_steps"])
    )


def drafting_per_step(
    draft_forwards: int, draft_work: float | None, verify_steps: int
) -> dict[str, float | None]:
    """What drafting cost a verify step: forwards, and their priced work (None: no table)."""
    return {
        "draft_forwards_per_step": _ratio(draft_forwards, verify_steps) if verify_steps else None,
        "draft_work_per_step": (
            round(draft_work / verify_steps, 4) if verify_steps and draft_work is not None else None
        ),
    }


def acceptance_readings(
    new_tokens: int,
    target_forwards: int,
    accepted: int,
    drafted: int,
    histogram: Counter[int],
    sources: Mapping[str, Counter[str]],
    source_ms: Mapping[str, float],
) -> dict[str, Any]:
    """The serving engines' readings from a run's counts (the module's docstring defines them):
    the one place they are computed, for a run and for runs pooled."""
    steps = sum(histogram.values())
    return {
        "tokens_per_target_forward": _ratio(new_tokens, target_forwards),
        "mean_acceptance_length": round(1 + accepted / steps, 4) if steps else None,
        "draft_acceptance_rate": _ratio(accepted, drafted) if drafted else None,
        "acceptance_per_position": [
            _ratio(sum(c for j, c in histogram.items() if j > i), steps)
            for i in range(max((j for j, c in histogram.items() if c), default=0))
        ],
        "acceptance_histogram": _histogram(+histogram),
        "draft_sources": {
            name: {
                "drafted": c["drafted"],
                "accepted": c["accepted"],
                "draft_acceptance_rate": _ratio(c["accepted"], c["drafted"]),
                "draft_ms": round(source_ms.get(name, 0.0), 2),
            }
            for name, c in sorted(sources.items())
        },
    }


def compute_stats(
    events: Iterable[Event],
    wall_s: float | None = None,
    prices: PriceTable | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    acc = StatsAccumulator(prices, method)
    for e in events:
        acc.add(e)
    return acc.result(wall_s)
