"""Kangaroo (Liu et al. 2024): self-speculative decoding with a double early exit.

The model's first ℓ layers are the shallow sub-network; a small adapter (one attention layer and
two norms, its own KV cache) turns their layer-ℓ state into a draft token through the target's own
LM head. Drafting exits early twice: at layer ℓ for every draft token, and from the draft loop as
soon as the adapter's top-1 confidence falls below η. Verification runs only layers ℓ..L, on the
layer-ℓ states the drafts already computed: the shallow layers never run twice.

    repeat:
        x = last committed token
        drafting: feed x, then each draft token, through layers 1..ℓ (the target's own KV cache),
                  the adapter (its own cache) and the LM head: d_j = argmax (or a draw) of q_j;
                  stop after the first d_j whose top-1 probability is below η (it is kept), at γ
                  tokens, at an end token, or where the budget ends
        runners-up (siblings = s > 0, our extension): beside each d_j, the next s tokens of q_j
                  as leaves: a small tree that costs s inputs per draft token and no draft forward
        p = layers ℓ+1..L([h_ℓ(x), h_ℓ(d_1) .. h_ℓ(d_{n-1}), h_ℓ(d_n), h_ℓ(runners-up)])
                  # ONE forward; only d_n and the runners-up run layers 1..ℓ there first, the
                  # others reuse the states drafting computed; a tree mask when there are leaves
        keep the longest prefix the target agrees with (greedy) / the rejection rule with q
                  (sampling; with runners-up the drafts are q's top tokens, kept as point masses
                  by the multi-draft residual rule); a path may end on a runner-up
        roll both caches back to what was committed

Why runners-up: on the tuning prompts the adapter's top-1 is the target's token 56% of the time
on code (34% on chat), and where it is not, its second choice is in 26% of cases (16%). The draft
forward already computed that choice; verifying it costs one more input of a forward that is
memory-bound on a CPU (a few percent of a one-token forward), where the step would otherwise end.

The adapter (decoders/trained/kangaroo.py) is trained by `python -m decoders.train kangaroo` and
ships per exit layer as `assets/kangaroo/<model>-l<ℓ>.safetensors`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from decoders.core import exit_drafting
from decoders.core.base import DecodeConfig, Method, TourStop
from decoders.core.events import Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.trained import kangaroo as adapters

MAX_SIBLINGS = 4  # beyond the 4th choice the adapter is almost never right (tuning prompts)

PARAMS = (
    Param(
        "exit_layer",
        str,
        "auto",
        "ℓ: drafts exit after layer ℓ. 'auto' = the layer the training sweep chose for this "
        "model; or a layer number with a trained adapter",
    ),
    Param(
        "eta",
        float,
        0.6,
        "η: the draft ends with the first token whose top-1 probability is below η",
        0.0,
        1.0,
    ),
    Param("gamma", int, 6, "γ: most draft tokens per step", 1, 16),
    Param(
        "siblings",
        int,
        1,
        "runners-up: at each drafted position, also verify the adapter's next most likely "
        "tokens, as leaves of a small tree (they cost an input each, no draft forward); "
        "0 = the paper's chain",
        0,
        MAX_SIBLINGS,
    ),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    adapters.load_adapter(bundle, adapters.resolve_exit_layer(bundle, params["exit_layer"]))


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    exit_layer = adapters.resolve_exit_layer(bundle, p["exit_layer"])  # ℓ
    head = adapters.AdapterHead(bundle, adapters.load_adapter(bundle, exit_layer), exit_layer)
    yield from exit_drafting.decode(bundle, prompt_ids, cfg, exit_layer, head)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="self",
        place=1,
        title="The model drafts for itself: Kangaroo",
        narration=(
            "A separate drafter is one more model to train and load. Kangaroo drafts with the "
            "target's own first layers plus a small trained adapter: a shallow sub-network that "
            "shares the big model's embeddings and head. It keeps drafting while its confidence "
            "stays above a threshold η, then the full model verifies. The deep layers that a "
            "draft skipped are computed once, for all the drafted tokens, in the verify pass."
        ),
        look=("each draft token's confidence against η, and where drafting stopped."),
        head_drafted=True,
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    family_best=True,  # Compare's "each family at its best"
    name="kangaroo",
    family="self-drafting",
    rank=2,
    title="Kangaroo (self-speculative, double early exit + adapter)",
    decode=decode,
    params=PARAMS,
    # Liu et al. 2024: η = 0.6, γ = 6 (their code's threshold and steps), a chain (no
    # runners-up); ℓ from the sweep
    presets={"paper": {"eta": 0.6, "gamma": 6, "siblings": 0}},
    check=check,
    summary="The first ℓ layers and a small trained adapter draft; the remaining layers verify.",
    relaxable=True,
    # the confidences, then where in the model each step ran
    views=(
        "kangaroo_confidence",
        "kangaroo_layers",
    ),
    events=("Draft", "DraftStop", "Verify"),
    compare={
        # The paper's chain against ours: the adapter's runners-up beside each draft token,
        # verified in the same pass for an input each.
        "Kangaroo: the paper's chain vs runners-up": (
            "kangaroo:siblings=0",
            "kangaroo",
            "kangaroo:siblings=2",
        ),
    },
)
