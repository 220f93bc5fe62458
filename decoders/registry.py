"""METHODS: every decoding method by name, with its parameter schema. New methods register here."""

from __future__ import annotations

from . import (
    autoregressive,
    drafters,
    jacobi,
    lookahead,
    prompt_lookup,
    self_speculative,
    speculative,
    token_tree,
)
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
        Method(
            name="speculative",
            title="Speculative decoding (draft model or self:k early exit)",
            decode=speculative.decode,
            params=speculative.PARAMS,
            check=drafters.check_draft,
            summary="A cheap drafter proposes γ tokens; the target accepts a prefix in one forward.",
        ),
        Method(
            name="token_tree",
            title="Token tree (static Medusa-style or dynamic EAGLE-2-style)",
            decode=token_tree.decode,
            params=token_tree.PARAMS,
            check=token_tree.check,
            summary="Drafts a tree of alternatives; one forward with a tree mask verifies every branch.",
        ),
        Method(
            name="self_speculative",
            title="Draft & Verify (self-speculative, skipped layers)",
            decode=self_speculative.decode,
            params=self_speculative.PARAMS,
            check=self_speculative.check,
            summary="The model drafts for itself with searched attention/MLP sublayers skipped.",
        ),
        Method(
            name="jacobi",
            title="Jacobi decoding (parallel fixed-point iteration)",
            decode=jacobi.decode,
            params=jacobi.PARAMS,
            sampling=False,
            summary="Refines a block of guessed tokens in parallel; commits the converged prefix.",
        ),
        Method(
            name="lookahead",
            title="Lookahead decoding (Jacobi window + n-gram verification)",
            decode=lookahead.decode,
            params=lookahead.PARAMS,
            summary="Jacobi trajectories fill an n-gram pool; matching n-grams are verified in the same forward.",
        ),
    )
}
