"""Decoding Lab's engine: load a model, run a decoding method, get tokens plus a full trace.

from decoders import load_model, generate, METHODS
bundle = load_model()                       # embedded SmolLM2-135M-Instruct, offline
res = generate(bundle, "Write a haiku", method="autoregressive", max_new_tokens=64)
res.token_ids, res.text, res.events, res.stats
"""

from .engine import (
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
from .errors import (
    DecodingLabError,
    InvalidInput,
    InvalidParameter,
    ModelLoadError,
    TraceError,
    UnknownMethod,
)
from .models import EMBEDDED_ID, TINY_ID, ModelBundle, load_model
from .registry import METHODS

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
