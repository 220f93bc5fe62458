"""FREE (Bae et al. 2023, "Fast and Robust Early-Exiting Framework for Autoregressive Language
Models with Synchronized Parallel Decoding"): one shallow exit and the full model. A token that is
sure at the shallow exit is written from there and *held back*; the next token that needs the deep
layers takes every held-back token through them with it, in one parallel pass, which fills their
deep keys and values for real (no state copying). Lossy: a shallow token is never replaced.

    prefill: the prompt through every layer; the first token from the full model
    per output token (input x = the last token):
        h = layers 1..ℓ(x)                                   the shallow part, always
        c = max probability of the exit at ℓ
        if c > λ: the token = argmax at the exit; hold x back (its layers ℓ+1..L are owed)
        else:     layers ℓ+1..L([h(held_1) .. h(held_m), h])  ONE synchronized pass: the held-back
                  tokens' deep keys and values, and x's token from the full model
                  every held-back token now has a deep prediction: was its shallow token the
                  deep model's? (the samples λ adapts from)
    adaptive λ: a Beta distribution per class (the shallow token agreed with the deep one, or not)
        fitted to the confidences seen so far, mixed by the classes' shares; λ = the lowest
        confidence above which P(agree | c) stays ≥ ζ (the paper's Beta-mixture estimate), never
        below 0.5; after 32 held-back tokens the next one takes the deep path anyway

With λ = 1 no token exits and FREE is autoregressive greedy token for token.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import CatchUp, Commit, Event, LayerExit
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import forward_from, forward_shallow, new_cache
from decoders.core.steps import start
from decoders.trained.exits import commit_exit, exit_logits, load_exits

PARAMS = (
    Param(
        "exit_layer",
        str,
        "auto",
        "ℓ: the shallow exit. 'auto' = the trained exit nearest 0.8 L (24 of 30 on the embedded "
        "model); 'shallow' = the one nearest L/5, the paper's proportion; or a layer number "
        "with a trained exit",
    ),
    Param(
        "threshold",
        float,
        0.9,
        "λ: a token leaves at the shallow exit when its top probability is above λ (the "
        "starting value when adaptive); λ = 1 never exits (autoregressive greedy)",
        0.0,
        1.0,
    ),
    # Default from a sweep on assets/tuning_prompts.jsonl (CPU, 64 tokens, the shipped exits): a
    # fixed λ = 0.9 at the exit at 24 kept 65 % of greedy's tokens; the Beta-mixture estimate
    # (ζ = 0.9 or 0.95) lowered λ and kept 52 %, at the same speed.
    Param(
        "adaptive",
        bool,
        False,
        "re-estimate λ after every catch-up from the Beta mixture of agreeing and disagreeing "
        "confidences seen so far (the paper's rule)",
    ),
    Param(
        "zeta",
        float,
        0.9,
        "ζ: the adaptive λ is where P(the shallow token is the deep one | confidence) reaches ζ",
        0.5,
        0.999,
    ),
)

MIN_SAMPLES = 4  # of each class before the Beta mixture replaces the starting λ
FLOOR = 0.5  # the adaptive λ never goes below: at λ ≈ 0 every token exits, no deep pass ever
# brings new samples and λ could not recover
MAX_HELD = 32  # a token after this many held-back ones takes the deep path anyway


def resolve_exit_layer(bundle: ModelBundle, text: str) -> int:
    """'auto' -> the exit nearest 0.8 L; 'shallow' -> nearest L / 5; a number -> that exit."""
    layers = load_exits(bundle).exit_layers
    text = str(text).strip().lower()
    shipped = ", ".join(map(str, layers))
    if text in ("auto", "shallow"):
        goal = (0.8 if text == "auto" else 0.2) * bundle.n_layers
        return min(layers, key=lambda ell: (abs(ell - goal), ell))
    if not text.isdigit():
        raise InvalidParameter(
            f"exit_layer {text!r}: write 'auto', 'shallow' or a layer number (exits ship at "
            f"layers {shipped})"
        )
    if int(text) not in layers:
        raise InvalidParameter(
            f"free: no trained exit at layer {text} for {bundle.model_id} (exits ship at layers "
            f"{shipped})"
        )
    return int(text)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    resolve_exit_layer(bundle, params["exit_layer"])


def _beta_fit(values: list[float]) -> torch.distributions.Beta:
    """A Beta distribution by the method of moments."""
    x = torch.tensor(values, dtype=torch.float64).clamp(1e-3, 1 - 1e-3)
    mean, var = float(x.mean()), max(float(x.var()) if len(values) > 1 else 0.0, 1e-4)
    common = max(mean * (1 - mean) / var - 1, 1e-2)
    return torch.distributions.Beta(
        torch.tensor(max(mean * common, 1e-2)), torch.tensor(max((1 - mean) * common, 1e-2))
    )


def bmm_threshold(samples: list[tuple[float, bool]], zeta: float, start: float) -> float:
    """The lowest confidence above which P(agree | c) ≥ ζ everywhere, from a two-component Beta
    mixture of the samples (confidence, agreed); `start` until each class has MIN_SAMPLES."""
    agree = [c for c, ok in samples if ok]
    disagree = [c for c, ok in samples if not ok]
    if len(agree) < MIN_SAMPLES or len(disagree) < MIN_SAMPLES:
        return start
    prior = len(agree) / len(samples)
    grid = torch.linspace(0.0025, 0.9975, 400, dtype=torch.float64)
    on = prior * _beta_fit(agree).log_prob(grid).exp()
    off = (1 - prior) * _beta_fit(disagree).log_prob(grid).exp()
    posterior = on / (on + off).clamp_min(1e-300)
    below = (posterior < zeta).nonzero().flatten()
    if len(below) == 0:
        return 0.0
    last = int(below[-1])
    return 1.0 if last == len(grid) - 1 else round(float(grid[last + 1]), 4)


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    exits = load_exits(bundle)
    ell, threshold = resolve_exit_layer(bundle, p["exit_layer"]), p["threshold"]
    i = exits.exit_layers.index(ell)
    n_layers = bundle.n_layers
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    yield from start(bundle, cache, prompt_ids, cfg.sampler(), budget)  # prefill, first token

    held: list[tuple[int, torch.Tensor, int, float]] = []  # (output index, h_ℓ, token, confidence)
    samples: list[tuple[float, bool]] = []
    step = 0
    while not budget.done:
        step += 1
        t = len(budget.tokens)  # the output index this step writes
        shallow = forward_shallow(
            bundle,
            cache,
            [budget.tokens[-1]],
            ell,
            step=step,
            kind="shallow",
            positions=[len(prompt_ids) + t - 1],
        )
        yield shallow.event  # ℓ decoder layers (the exit's head is not a decoder layer)
        logits, _ = exit_logits(bundle, exits, i, shallow.hidden[ell])
        probs = torch.softmax(logits[-1].float(), -1)
        conf = round(float(probs.max()), 6)
        guess = int(probs.argmax())
        if conf > threshold and len(held) < MAX_HELD:
            held.append((t, shallow.hidden[ell], guess, conf))
            yield LayerExit(
                step, t, ell, n_layers, (ell,), (conf,), round(threshold, 6), "confidence"
            )
            taken = budget.take([guess])
            yield Commit(step, tuple(taken), ("exit",) * len(taken), (conf,) * len(taken))
            continue
        # Synchronized parallel decoding: the held-back tokens and x through layers ℓ+1..L.
        states = torch.cat([h for _, h, _, _ in held] + [shallow.hidden[ell]])
        deep = forward_from(bundle, cache, states, ell, step=step, kind="sync")
        yield deep.event
        agreed = [g == int(deep.logits[j].argmax()) for j, (_, _, g, _) in enumerate(held)]
        token = int(deep.logits[-1].argmax())
        samples += [(c, ok) for (_, _, _, c), ok in zip(held, agreed, strict=True)]
        samples.append((conf, guess == token))
        used = threshold
        if p["adaptive"]:
            threshold = max(FLOOR, bmm_threshold(samples, p["zeta"], p["threshold"]))
        yield LayerExit(step, t, n_layers, n_layers, (ell,), (conf,), round(used, 6), "confidence")
        if held:
            yield CatchUp(step, tuple(x for x, _, _, _ in held), tuple(agreed), round(threshold, 6))
        held = []
        yield commit_exit(step, deep.logits[-1], n_layers, n_layers, budget)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="lossy",
        place=2,
        title="Doing less per token: FREE's shallow-deep module",
        narration=(
            "FREE has one fixed early exit. A confident token leaves there; the deep layers for "
            "the tokens that left early are caught up later in parallel, in a synchronized pass "
            "with the next deep token, so their keys and values exist when later tokens attend to "
            "them. Less compute per token, paid for by tokens the full model never chose."
        ),
        look=(
            "the tokens that left at the shallow exit (◆ on its row) and the confidence each "
            "reached; the deep layers they skipped run later, caught up in one pass."
        ),
        rule="shallowest_exit",
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    family_best=True,  # Compare's "each family at its best"
    name="free",
    family="early exit",
    rank=2,
    title="FREE (lossy: shallow exit + synchronized catch-up)",
    decode=decode,
    params=PARAMS,
    # Bae et al. 2023: a shallow model of about a fifth of the layers, λ from the
    # Beta-mixture estimate
    presets={"paper": {"exit_layer": "shallow", "adaptive": True}},
    lossless=False,
    sampling=False,
    check=check,
    summary="Confident tokens leave at one shallow exit and are held back; the next deep token takes them through the deep layers in one parallel pass. Lossy.",
    # where each token left, then the held-back tokens and their synchronized passes
    views=(
        "exit_heatmap",
        "catch_ups",
    ),
    events=("CatchUp", "LayerExit"),
)
