"""The models this page offers and how it loads them. No gradio here."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

from decoders import InvalidInput, load_model
from decoders.core.costs import calibrate_in_background
from decoders.core.models import (
    EMBEDDED_ID,
    TINY_ID,
    TINY_SEEDS,
    TUNED_ID,
    ModelBundle,
    hub_reachable,
)
from decoders.engine import price_runs
from decoders.trained.exit_tuned import delta_path

EMBEDDED_LABEL = f"{EMBEDDED_ID} (embedded, offline)"
TUNED_LABEL = f"{TUNED_ID} (tuned for early exit: LayerSkip, offline)"
# Target models that share the embedded model's tokenizer (so it can draft for them later).
CURATED_MODELS = (
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
)
ALLOW_ANY_MODEL = os.environ.get("DECODING_LAB_ALLOW_ANY_MODEL", "0") == "1"


@functools.cache
def model_choices() -> list[tuple[str, str]]:
    """(label, id) pairs for the model picker: the embedded model always; hub models where a network is."""
    default = os.environ.get("DECODING_LAB_MODEL") or EMBEDDED_ID
    choices = [(EMBEDDED_LABEL, EMBEDDED_ID), ("tiny-random (seeded 4-layer test model)", TINY_ID)]
    if delta_path(EMBEDDED_ID).is_file():  # offline too: the embedded model plus a shipped delta
        choices.insert(1, (TUNED_LABEL, TUNED_ID))
    if default not in (EMBEDDED_ID, TINY_ID, TUNED_ID):
        choices.insert(0, (default, default))
    if os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "") and hub_reachable(timeout=2.0):
        choices += [(m, m) for m in CURATED_MODELS]
    choices.sort(key=lambda c: c[1] != default)  # the default first
    return choices


def resolve_model(model: str | None) -> str:
    ids = [v for _, v in model_choices()]
    if not model:
        return ids[0]
    labels = {label: v for label, v in model_choices()}
    model = labels.get(model, model)
    if model in ids or ALLOW_ANY_MODEL:
        return model
    raise InvalidInput(f"model {model!r} is not offered here; choose one of: {', '.join(ids)}")


def check_draft(params: Mapping[str, Any]) -> None:
    """A public page loads only what it offers: `auto`, `self`, `self:k`, the shipped `eagle` and
    `block` heads, or an offered or built-in model as draft, and the shipped Medusa heads; other ids,
    `eagle:<file>`, `eagle3:<path>` and `heads=<path or hub id>` need
    DECODING_LAB_ALLOW_ANY_MODEL=1."""
    heads = str(params.get("heads", "") or "").strip()
    if heads and not ALLOW_ANY_MODEL:
        raise InvalidInput(
            f"heads {heads!r}: this page runs the Medusa heads it ships only (leave heads empty)"
        )
    draft = str(params.get("draft", "auto")).strip()
    offered = ("auto", "self", "eagle", "block", *TINY_SEEDS)
    if ALLOW_ANY_MODEL or draft in offered or draft.startswith("self:"):
        return
    if draft not in {v for _, v in model_choices()}:
        raise InvalidInput(
            f"draft {draft!r} is not offered here; use auto, self, self:k, eagle, block, or one of the models"
        )


def get_bundle(model: str | None) -> ModelBundle:
    """The model, loaded once per process; its price table is read (or, the first time on this
    machine, measured with its drafters' prices) when it first loads, in the background, not
    inside a visitor's run."""
    bundle = load_model(resolve_model(model))
    calibrate_in_background(bundle, drafters=price_runs)
    return bundle


def vocab_size(bundle: ModelBundle) -> int:
    """Token ids the model can read or write: its embedding rows (>= the tokenizer's length)."""
    return int(bundle.model.config.vocab_size)


def token_texts(bundle: ModelBundle, ids: Iterable[int]) -> dict[int, str]:
    return {i: bundle.token_text(i) for i in set(ids)}
