"""HASH EE (Sun et al. 2022, "A Simple Hash-Based Early Exiting Approach For Language Understanding
and Generation"): no confidence, no learning of when to exit. Each token id is hashed to a fixed
exit layer, and frequent tokens exit early. Lossy: an exited token is never checked.

    the hash (once, from the training corpus's token counts shipped with the exit adapters):
        candidate layers = the exits at ≥ min_depth · L, then L (the full model)
        sort token ids by frequency, most frequent first; cut them into as many buckets of equal
        total frequency as there are candidates; bucket b exits at the b-th candidate
        (a token never seen on the corpus gets the full model)
    per output token (input x = the last token):
        run layers 1 .. hash(x); the next token is argmax of that exit's logits (hash(x) = L: the
        full model's LM head)
        the skipped layers' keys and values for x: the exited state copied upward (state
        propagation, as HASH EE copies states for later tokens to attend to), or computed for real

With min_depth = 1 every token runs the full model: autoregressive greedy token for token.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import Event, LayerExit
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start
from decoders.trained.exits import (
    FILLS,
    ExitAdapters,
    commit_exit,
    exit_forward,
    exit_logits,
    load_exits,
)

PARAMS = (
    # Default from a sweep on assets/tuning_prompts.jsonl (CPU, 64 tokens, the shipped adapters):
    # only the deepest exits keep some of greedy's tokens; lower min_depth trades them for speed.
    Param(
        "min_depth",
        float,
        0.9,
        "the shallowest exit a bucket may use, as a share of the layers (1 = no early exit)",
        0.0,
        1.0,
    ),
    Param(
        "fill",
        str,
        "propagate",
        "the skipped layers' keys and values: copy the exited state upward, or compute them",
        choices=FILLS,
    ),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    exits = load_exits(bundle)
    if not float(exits.token_counts.sum()):
        raise InvalidParameter(
            f"hash_ee: the exit adapters for {bundle.model_id} carry no token counts to hash; "
            f"retrain them with `python -m decoders.train exits --model {bundle.model_id}`"
        )


_hashes: dict[tuple[int, int, int], torch.Tensor] = {}
_lock = threading.Lock()


def candidates(exits: ExitAdapters, n_layers: int, min_depth: float) -> tuple[int, ...]:
    lowest = math.ceil(min_depth * n_layers - 1e-9)
    return (*(ell for ell in exits.exit_layers if lowest <= ell < n_layers), n_layers)


def hash_layers(exits: ExitAdapters, n_layers: int, min_depth: float) -> torch.Tensor:
    """[vocab] the exit layer of every token id: equal-frequency buckets, frequent tokens first."""
    layers = candidates(exits, n_layers, min_depth)
    key = (id(exits), n_layers, layers[0])
    with _lock:
        if key not in _hashes:
            counts = exits.token_counts.float().cpu()
            order = torch.argsort(counts, descending=True, stable=True)
            before = torch.cumsum(counts[order], 0) - counts[order]  # mass of the tokens ahead
            bucket = (before / counts.sum().clamp_min(1.0) * len(layers)).long()
            bucket = bucket.clamp(max=len(layers) - 1)
            table = torch.full_like(counts, n_layers, dtype=torch.long)
            seen = counts[order] > 0
            table[order[seen]] = torch.tensor(layers)[bucket[seen]]
            _hashes[key] = table
        return _hashes[key]


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    exits = load_exits(bundle)
    n_layers = bundle.n_layers
    table = hash_layers(exits, n_layers, p["min_depth"])
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    yield from start(bundle, cache, prompt_ids, cfg.sampler(), budget)  # prefill, first token

    step = 0
    while not budget.done:
        step += 1
        t = len(budget.tokens)
        x = budget.tokens[-1]
        chosen = int(table[x])

        def stop(i: int, ell: int, h: torch.Tensor, below: torch.Tensor, chosen: int = chosen):
            return exit_logits(bundle, exits, i, h)[0] if ell == chosen else None

        logits, depth, event = exit_forward(
            bundle, exits, cache, x, len(prompt_ids) + t - 1, stop, fill=p["fill"], step=step
        )
        yield event
        yield LayerExit(step, t, depth, n_layers, (), (), 0.0, "hash")
        yield commit_exit(step, logits, depth, n_layers, budget)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="lossy",
        place=3,
        title="Doing less per token: HASH EE",
        narration=(
            "HASH EE decides each token's depth before running it, from a hash of the input "
            "token: no confidence to compute, no learned router. Tokens of the same kind always "
            "leave at the same layer. Cheap and predictable, and lossy: the exit is chosen "
            "without asking whether the model is sure. The heatmap shows the depth the hash gave "
            "each token; the badge, how much of the output still agrees with greedy."
        ),
        look=("which layer each token's hash sent it to."),
        rule="shallowest_exit",
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="hash_ee",
    family="early exit",
    rank=3,
    title="HASH EE (lossy: hash-based early exit)",
    decode=decode,
    params=PARAMS,
    # Sun et al. 2022: every layer may be an exit; here every trained exit may be one
    presets={"paper": {"min_depth": 0.0}},
    lossless=False,
    sampling=False,
    check=check,
    summary="Each token id exits at a fixed layer from a frequency hash (frequent tokens early). Lossy.",
    # where each token left, then the hash for the tokens on screen
    views=(
        "exit_heatmap",
        "hash_layers",
    ),
    events=("LayerExit",),
)
