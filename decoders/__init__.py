"""Decoding Lab's engine: load a model, run a decoding method, get tokens plus a full trace.

from decoders import load_model, generate, METHODS
bundle = load_model()                       # embedded SmolLM2-135M-Instruct, offline
res = generate(bundle, "Write a haiku", method="autoregressive", max_new_tokens=64)
res.token_ids, res.text, res.events, res.stats

The names below load on first use (PEP 562), so `decoders.core.events` and the other pure modules
import without torch: the visualizer draws saved traces with no engine behind it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from decoders.core.errors import (
    DecodingLabError,
    InvalidInput,
    InvalidParameter,
    ModelLoadError,
    TraceError,
    UnknownMethod,
)

if TYPE_CHECKING:
    from decoders.core.models import EMBEDDED_ID, TINY_ID, ModelBundle, load_model
    from decoders.engine import (
        MAX_NEW_TOKENS_CAP,
        GenerationResult,
        LosslessCheck,
        check_lossless,
        compare_tokens,
        generate,
        greedy_reference,
        prepare,
        stream,
    )
    from decoders.registry import METHODS

# Public name -> the submodule that defines it (imported, with torch, when first asked for).
_LAZY = {
    **dict.fromkeys(
        (
            "MAX_NEW_TOKENS_CAP",
            "GenerationResult",
            "LosslessCheck",
            "check_lossless",
            "compare_tokens",
            "generate",
            "greedy_reference",
            "prepare",
            "stream",
        ),
        "engine",
    ),
    **dict.fromkeys(("EMBEDDED_ID", "TINY_ID", "ModelBundle", "load_model"), "core.models"),
    "METHODS": "registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "EMBEDDED_ID",
    "MAX_NEW_TOKENS_CAP",
    "METHODS",
    "TINY_ID",
    "DecodingLabError",
    "GenerationResult",
    "InvalidInput",
    "InvalidParameter",
    "LosslessCheck",
    "ModelBundle",
    "ModelLoadError",
    "TraceError",
    "UnknownMethod",
    "check_lossless",
    "compare_tokens",
    "generate",
    "greedy_reference",
    "load_model",
    "prepare",
    "stream",
]
