"""LayerSkip self-speculative decoding (Elhoushi et al. 2024): on a model tuned to be read early
(layer dropout + an early-exit loss, decoders/trained/exit_tuned.py), the first E layers and the model's
own final norm and LM head draft; the remaining layers verify, reusing the first E layers' KV cache
and the drafts' layer-E states (the paper's "exit query cache"), so no layer runs twice.

    repeat:
        x = last committed token
        draft:  feed x, then each draft token, through layers 1..E and the shared exit head
                (final norm, LM head: its draft-vocabulary rows): d_j = argmax q_j; stop after
                the first d_j whose top-1 probability is below η, at γ tokens, at an end token
        verify: layers E+1..L on [h_E(x), h_E(d_1) .. h_E(d_{n-1})], and d_n through all of
                them: ONE forward; keep the longest agreeing prefix + the target's own token
        runners-up (siblings > 0, Kangaroo's extension here): q_j's next tokens beside each d_j

It is Kangaroo's loop (decoders/core/exit_drafting.py) with no adapter: the tuning taught the layers
themselves to speak early, so the exit head is the one the last layer uses. On a model that was
not tuned (the embedded one) it is still exact, and rarely right: SmolLM2's layer 8 agrees with
its last ~5 % of the time. Lossless against the tuned model's own greedy output.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from decoders.core import exit_drafting, packing
from decoders.core.base import DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import Event
from decoders.core.models import ModelBundle, tuned_base
from decoders.core.params import Param
from decoders.core.runtime import head_logits, require_layers
from decoders.trained import exit_tuned
from decoders.trained.artifacts import full_logits, read_card, vocab_head

PARAMS = (
    Param(
        "exit_layer",
        str,
        "auto",
        "E: drafts leave after layer E through the model's own final norm and LM head. 'auto' = "
        "the layer chosen for the tuned model (its card), else a quarter of the layers",
    ),
    Param(
        "eta",
        float,
        0.4,
        "η: the draft ends with the first token whose top-1 probability is below η "
        "(0 = always γ tokens, the paper's fixed draft)",
        0.0,
        1.0,
    ),
    Param("gamma", int, 8, "γ: most draft tokens per step", 1, 16),
    Param(
        "siblings",
        int,
        1,
        "runners-up: at each drafted position also verify the next most likely tokens, as "
        "leaves of a small tree (an input each, no draft forward); 0 = the paper's chain",
        0,
        4,
    ),
    Param(
        "vocab",
        str,
        "draft",
        "the draft head's rows: 'draft' = the tuned model's draft vocabulary (its most frequent "
        "tokens; cheaper), 'full' = the whole LM head",
        choices=("draft", "full"),
    ),
)


def delta_base(bundle: ModelBundle) -> str | None:
    """The built-in base whose LayerSkip delta `bundle` is (or was tuned from), else None."""
    return tuned_base(bundle.model_id)


def resolve_exit_layer(bundle: ModelBundle, text: str) -> int:
    """`auto` -> the card's chosen E for the tuned model, else L/4; a number -> that layer."""
    text = str(text).strip().lower()
    n = bundle.n_layers
    if text == "auto":
        base = delta_base(bundle)
        chosen = read_card(exit_tuned.delta_path(base)).get("exit_layer") if base else None
        return int(chosen) if chosen else max(1, round(n / 4))
    if not text.isdigit() or not 1 <= int(text) < n:
        raise InvalidParameter(
            f"exit_layer {text!r}: write 'auto' or a layer number in 1..{n - 1} "
            f"(this model has {n} layers)"
        )
    return int(text)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    require_layers(bundle, "layerskip (drafting with the first layers alone)")
    resolve_exit_layer(bundle, params["exit_layer"])


class SharedHead:
    """LayerSkip's exit head (exit_drafting.ExitHead): the model's own final norm and LM head,
    on the draft vocabulary's rows where the tuned model ships one. Stateless."""

    def __init__(self, bundle: ModelBundle, exit_layer: int, vocab: str) -> None:
        self.bundle = bundle
        self.norm = bundle.model.model.norm
        self.label = f"layerskip: exit at layer {exit_layer}"
        self.rows = draft_rows(bundle) if vocab == "draft" else None

    def prefill(self, states: torch.Tensor) -> None:
        return None

    def head(self, position: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.logits

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        feats = self.norm(h)
        if self.rows is None:
            return head_logits(self.bundle, feats)  # the model's own head, its softcap too
        vocab, rows = self.rows
        return full_logits(self.bundle, vocab, rows(feats.to(self.bundle.drafting_dtype)))

    def settle(self, in_cache: int, n_draft: int, path, states: torch.Tensor) -> None:
        return None


_rows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def draft_rows(bundle: ModelBundle) -> tuple[torch.Tensor, torch.nn.Module] | None:
    """The draft vocabulary shipped in the tuned model's delta and the LM head cut to it (in the
    drafting dtype, packed on the CPU), made once per loaded model; None where the model ships
    no delta (then drafts score the whole head)."""
    base = delta_base(bundle)
    if base is None:
        return None
    with _lock:
        if bundle.model not in _rows:
            vocab = exit_tuned.load_delta(base)["vocab"].long().to(bundle.device)
            rows = vocab_head(bundle, vocab, bundle.drafting_dtype)
            holder = torch.nn.Sequential(rows)
            if bundle.packed:
                packing.pack_linears(holder)
            _rows[bundle.model] = (vocab, holder[0])
        return _rows[bundle.model]


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    exit_layer = resolve_exit_layer(bundle, p["exit_layer"])  # E
    head = SharedHead(bundle, exit_layer, p["vocab"])
    yield from exit_drafting.decode(bundle, prompt_ids, cfg, exit_layer, head)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="self",
        place=3,
        title="The model drafts for itself: LayerSkip",
        narration=(
            "LayerSkip exits early: the first layers of the target, read out through its own LM "
            "head, draft; the remaining layers verify, reusing the draft's early layers instead "
            "of recomputing them. It works best on a model trained so that its early layers "
            "already predict well; on this untuned model the early exit guesses less often, which "
            "the confidence view shows."
        ),
        look=("the exit's confidence per draft token, and how many the full model kept."),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="layerskip",
    family="self-drafting",
    rank=3,
    title="LayerSkip (self-speculation on a model tuned for early exit)",
    decode=decode,
    params=PARAMS,
    # Elhoushi et al. 2024 (their repository's example: exit after 8 of Llama2's 32 layers,
    # i.e. a quarter, and 6 speculated tokens, no confidence stop, the whole LM head)
    presets={
        "paper": {
            "exit_layer": "auto",
            "eta": 0.0,
            "gamma": 6,
            "siblings": 0,
            "vocab": "full",
        }
    },
    check=check,
    summary="On a model tuned to be read early, its first E layers and its own LM head draft; the rest of the layers verify, reusing what drafting computed.",
    relaxable=True,
    views=(
        "layerskip_confidence",
        "layerskip_layers",
    ),
    events=("Draft", "DraftStop", "Verify"),
)
