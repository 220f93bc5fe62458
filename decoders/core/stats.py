"""Metrics folded from the event stream, with the serving engines' definitions (see docs/ARCHITECTURE.md).

- tokens per target forward = new tokens / target forward passes (prefill, target, verify and sync passes; FREE's shallow passes are
  counted as layers, not as forwards: its sync pass completes them)
- mean acceptance length = 1 + accepted drafts / verify steps
- acceptance rate per draft position j = steps that accepted a draft at depth j / steps that drafted one
- acceptance histogram[j] = verify steps that accepted exactly j drafts
- layers per token = target decoder layers run per input after the prefill (target, verify and
  FREE's shallow and sync passes: Σ layers × inputs), per token after the first, as a share of the model's depth (the
  prefill's): 1 for autoregressive decoding, below 1 where tokens exit early (a draft's own
  layers are not counted, nor CALM's oracle passes)
- input cost, draft cost = what a sized draft (token_tree's size=cost, speculative's
  schedule=cost) priced one more verified input and one draft forward at, in one-token target
  forwards (the Priced event; None when the run sized nothing)
- tokens per second = new tokens / (wall time - the prefill's); time to first token (`ttft_s`) =
  the prefill's time, reported on its own
- exit depth (early exit) = where tokens were written from, as a share of the depth (LayerExit
  events), whatever their skipped layers cost afterwards
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from decoders.core.events import Commit, Draft, Event, Forward, LayerExit, Priced, Verify
from decoders.core.tree import depths

TARGET_KINDS = ("prefill", "target", "verify", "sync")


class StatsAccumulator:
    def __init__(self) -> None:
        self.new_tokens = 0
        self.forwards: Counter[str] = Counter()
        self.ms: defaultdict[str, float] = defaultdict(float)
        self.draft_depth: dict[int, int] = {}  # step -> deepest draft level proposed
        self.drafted = 0
        self.verify_steps = 0
        self.accepted = 0
        self.histogram: Counter[int] = Counter()
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
            if event.kind == "prefill":
                self.depth = max(self.depth, event.layers)
            elif event.kind in ("target", "verify", "shallow", "sync"):
                self.layer_inputs += event.layers * event.n_input_tokens
        elif isinstance(event, Commit):
            self.new_tokens += len(event.tokens)
            self.origins.update(event.origins)
        elif isinstance(event, Draft):
            self.drafted += len(event.tokens)
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
            for j in range(self.draft_depth.get(event.step, n)):
                self.proposed_at[j] += 1
                self.accepted_at[j] += j < n

    def result(self, wall_s: float | None = None) -> dict[str, Any]:
        target_forwards = sum(self.forwards[k] for k in TARGET_KINDS)
        model_ms = sum(self.ms.values())
        wall = wall_s if wall_s is not None else model_ms / 1000.0
        prefill_s = self.ms["prefill"] / 1000.0
        depth = max(self.proposed_at, default=-1) + 1
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": target_forwards,
            "draft_forwards": self.forwards["draft"],
            "tokens_per_target_forward": _ratio(self.new_tokens, target_forwards),
            "verify_steps": self.verify_steps,
            "drafted_tokens": self.drafted,
            "accepted_drafts": self.accepted,
            "mean_acceptance_length": (
                round(1 + self.accepted / self.verify_steps, 4) if self.verify_steps else None
            ),
            "acceptance_rate": _ratio(self.accepted, self.drafted) if self.drafted else None,
            "acceptance_by_position": [
                _ratio(self.accepted_at[j], self.proposed_at[j]) for j in range(depth)
            ],
            "acceptance_histogram": [
                self.histogram[j] for j in range(max(self.histogram, default=-1) + 1)
            ],
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
            "wall_s": round(wall, 4),
            # The prompt's forward (the first token's wait) apart: a long prompt's prefill said
            # nothing about how fast a method writes.
            "ttft_s": round(prefill_s, 4),
            "tokens_per_s": _ratio(self.new_tokens, wall - prefill_s if wall > prefill_s else wall),
            "time_ms": {k: round(v, 2) for k, v in self.ms.items()},
            "model_ms": round(model_ms, 2),
        }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b else 0.0


def compute_stats(events: Iterable[Event], wall_s: float | None = None) -> dict[str, Any]:
    acc = StatsAccumulator()
    for e in events:
        acc.add(e)
    return acc.result(wall_s)
