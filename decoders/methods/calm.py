"""CALM (Schuster et al. 2022, "Confident Adaptive Language Modeling"): each token leaves the model
at the first exit confident enough, so easy tokens run fewer layers. Lossy: an exited token is
never checked by the full model.

    prefill: the prompt through every layer; the first token from the full model
    per output token t (input x = the last token, at its position):
        λ_t = 0.9 λ + 0.1 λ · exp(−τ t / N)             the threshold decays over the output
        run layers 1, 2, ... ; at each exit ℓ ≥ min_depth · L (trained adapters, decoders/trained/exits.py):
            c = confidence at ℓ:
                softmax     top-1 − top-2 probability of the exit's distribution (softmax response)
                saturation  cos(h_ℓ, h_{ℓ−1}): the state has stopped moving
                classifier  the trained early-exit classifier's P(this exit's top-1 is final)
                oracle      1 if this exit's top-1 is the full model's token, else 0: the paper's
                            oracle (it peeks: the full model runs first, a pass not counted as
                            computed). With fill = compute it is greedy, and where it leaves
                            bounds every confidence measure on these exits; λ and τ only decide
                            whether λ_t < 1 (then it exits): λ = 1 with τ = 0 switches it off
            if c > λ_t: the token is argmax of the exit's logits; stop climbing
        no exit taken: the full model's LM head, as autoregressive decoding
        the skipped layers' keys and values for x: state propagation (h_ℓ through each skipped
        layer's k/v projections) or, as an option, the true computation

With λ = 1 and τ = 0 no confidence passes, and CALM is autoregressive greedy token for token (with
τ > 0, λ_t falls below λ after the first token). The decay is the issue's form, 0.9λ + 0.1λ·e^…,
so that λ_t never exceeds λ; the paper writes 0.9λ + 0.1·e^….
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import Event, LayerExit
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import crop_cache, forward, new_cache
from decoders.core.steps import start
from decoders.trained.exits import (
    FILLS,
    ExitAdapters,
    commit_exit,
    exit_forward,
    exit_logits,
    load_exits,
)

CONFIDENCES = ("softmax", "saturation", "classifier", "oracle")

PARAMS = (
    # Defaults from a sweep on assets/tuning_prompts.jsonl (CPU, 64 tokens, the shipped adapters):
    # softmax λ = 0.99 without decay kept 70 % of greedy's tokens at 0.96 of the layers; the
    # paper's decay (τ = 4) lowers λ_t late in the output and kept 39 %.
    Param(
        "threshold",
        float,
        0.99,
        "λ: a token exits where its confidence passes λ_t = 0.9λ + 0.1λ·exp(−τt/N); "
        "λ = 1 and τ = 0 never exit (autoregressive greedy)",
        0.0,
        1.0,
    ),
    Param("tau", float, 0.0, "τ: how fast λ_t decays over the output (0 = constant λ)", 0.0, 20.0),
    Param(
        "min_depth",
        float,
        0.6,
        "exits are offered only after this share of the layers (the shallow exits are rarely right)",
        0.0,
        1.0,
    ),
    Param(
        "confidence",
        str,
        "softmax",
        "the confidence measure: softmax (top-1 − top-2 probability), saturation (cosine of "
        "consecutive hidden states), classifier (the trained early-exit classifier) or oracle "
        "(the paper's oracle: the first exit that gives the full model's token; it peeks, so the "
        "full model runs first: an analysis, not a speed-up)",
        choices=CONFIDENCES,
    ),
    Param(
        "fill",
        str,
        "propagate",
        "the skipped layers' keys and values: propagate the exited state (CALM) or compute them "
        "for real (no saving; shows what propagation changes)",
        choices=FILLS,
    ),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    load_exits(bundle)


def threshold_at(lam: float, tau: float, t: int, n: int) -> float:
    """CALM's decaying threshold for output token t of at most n."""
    return 0.9 * lam + 0.1 * lam * math.exp(-tau * t / max(n, 1))


def first_exit(n_layers: int, min_depth: float) -> int:
    """The shallowest layer an exit may be offered at."""
    return max(1, math.ceil(min_depth * n_layers - 1e-9))


@dataclass
class Gate:
    """CALM's exit decision for one token at a time (`reset` per token): the confidence at each
    exit offered on the way up, weighed against the token's threshold."""

    bundle: ModelBundle
    exits: ExitAdapters
    measure: str
    lowest: int
    threshold: float = 1.0
    final: int | None = None  # the oracle's answer key: the full model's token
    offered: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def reset(self, threshold: float) -> None:
        self.threshold, self.offered, self.scores, self.final = threshold, [], [], None

    def __call__(self, i: int, ell: int, h: torch.Tensor, below: torch.Tensor):
        if ell < self.lowest:
            return None
        logits = None
        if self.measure == "saturation":  # free: no head runs unless the token exits
            c = float(torch.nn.functional.cosine_similarity(h.float(), below.float(), dim=-1))
        else:
            logits, feats = exit_logits(self.bundle, self.exits, i, h)
            if self.measure == "oracle":
                c = float(int(logits[-1].argmax()) == self.final)
            elif self.measure == "softmax":
                top2 = torch.softmax(logits[-1], -1).topk(2).values
                c = float(top2[0] - top2[1])
            else:
                c = float(torch.sigmoid(self.exits.confidence_logit(i, feats[-1]).float()))
        c = min(max(c, 0.0), 1.0)
        self.offered.append(ell)
        self.scores.append(round(c, 6))
        if c <= self.threshold:
            return None
        return logits if logits is not None else exit_logits(self.bundle, self.exits, i, h)[0]


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    exits = load_exits(bundle)
    lam, tau, measure, fill = p["threshold"], p["tau"], p["confidence"], p["fill"]
    n_layers = bundle.n_layers
    lowest = first_exit(n_layers, p["min_depth"])
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    yield from start(bundle, cache, prompt_ids, cfg.sampler(), budget)  # prefill, first token

    gate = Gate(bundle, exits, measure, lowest)
    step = 0
    while not budget.done:
        step += 1
        t = len(budget.tokens)  # the output index of the token this step predicts
        gate.reset(threshold_at(lam, tau, t, cfg.max_new_tokens))
        position = len(prompt_ids) + t - 1  # = the cache's length
        if measure == "oracle":
            # The answer key: the full model's token on this very cache (propagated states
            # included), then the pass is cropped away. Its layers are not counted as computed.
            peek = forward(
                bundle, cache, [budget.tokens[-1]], step=step, kind="oracle", positions=[position]
            )
            crop_cache(cache, position)
            gate.final = int(peek.logits[-1].argmax())
            yield peek.event
        logits, depth, event = exit_forward(
            bundle,
            exits,
            cache,
            budget.tokens[-1],
            position,
            gate,
            fill=fill,
            step=step,
        )
        yield event
        yield LayerExit(
            step,
            t,
            depth,
            n_layers,
            tuple(gate.offered),
            tuple(gate.scores),
            round(gate.threshold, 6),
            "confidence",
        )
        yield commit_exit(step, logits, depth, n_layers, budget)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="lossy",
        place=1,
        title="Doing less per token: CALM's early exit",
        narration=(
            "Instead of writing more tokens per forward, spend fewer layers per token. CALM reads "
            "the model out after each layer and stops as soon as it is confident enough, skipping "
            "the deep layers for easy tokens. That is a trade: a token from an early exit was "
            "never checked by the full model, so the output can differ from greedy. The heatmap "
            "shows where each token left."
        ),
        look=("the shallowest exit in the heatmap, and how much the output agrees with greedy."),
        rule="shallowest_exit",
        ask=(
            "Each column is a token, each row an exit; a token leaves at the first exit where the "
            "model is confident enough (dark blue). Which column's token left the model earliest, "
            "and at which exit?"
        ),
        conceal=("left the model",),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="calm",
    family="early exit",
    rank=1,
    title="CALM (lossy: confident adaptive early exit)",
    decode=decode,
    params=PARAMS,
    # Schuster et al. 2022: softmax response with the decaying threshold (τ = 4), exits
    # offered from the first layer on
    presets={"paper": {"tau": 4.0, "min_depth": 0.0}},
    lossless=False,
    sampling=False,
    check=check,
    summary="Each token leaves at the first trained exit whose confidence passes a threshold; skipped layers get propagated states. Lossy.",
    # where each token left, then this step's confidence at each exit against λ_t
    views=(
        "exit_heatmap",
        "exit_confidence",
    ),
    events=("LayerExit",),
    compare={
        # Doing less per token instead of more tokens per forward: CALM's confidence threshold
        # and fill (the true computation shows what state propagation changes) against FREE's
        # and HASH EE's.
        "early exit: CALM, FREE and HASH EE": (
            "calm",
            "calm:threshold=0.9",
            "calm:confidence=saturation:threshold=0.995",
            "calm:fill=compute",
            "free",
            "free:threshold=0.6",
            "hash_ee",
            "hash_ee:min_depth=0.6",
        ),
        # CALM's oracle peeks at the full model and leaves at the first exit that agrees. With
        # the true cache it is greedy, and its exit depth bounds every confidence measure on
        # these exits; with propagation even these decisions drift (the stand-in keys and values).
        "CALM's oracle: what perfect exit decisions would give": (
            "calm",
            "calm:confidence=oracle",
            "calm:confidence=oracle:min_depth=0",
            "calm:confidence=oracle:min_depth=0:fill=compute",
        ),
    },
)
