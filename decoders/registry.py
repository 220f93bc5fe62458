"""METHODS: every decoding method by name, with its parameter schema. New methods register here."""

from __future__ import annotations

from . import autoregressive, prompt_lookup
from .base import Method

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            name="autoregressive",
            title="Autoregressive (baseline)",
            decode=autoregressive.decode,
            summary="One target forward per token: the reference every other method must match.",
        ),
        Method(
            name="prompt_lookup",
            title="Prompt lookup (n-gram copy drafts)",
            decode=prompt_lookup.decode,
            params=prompt_lookup.PARAMS,
            summary="Drafts by copying what followed the last matching n-gram; one forward verifies.",
        ),
    )
}
