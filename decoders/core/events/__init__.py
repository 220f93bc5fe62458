"""Typed trace events: what a decoder did, step by step.

Events are frozen dataclasses holding plain token ids and numbers (never tensors), so a trace is
cheap to keep, safe to share between threads, and round-trips through JSON. A decoder yields them;
`generate()` folds them into stats; the UI draws them. `SCHEMA_VERSION` changes whenever a field's
meaning changes (tracefile.py: a trace of an older version is migrated on reading, or refused
with a clear message). Each event checks its own fields when read from a file (`Event.check`).
"""

from __future__ import annotations

from decoders.core.events.common import *  # noqa: F403
from decoders.core.events.common import (
    Commit,
    Done,
    Draft,
    DraftStop,
    Event,
    Forward,
    Prefill,
    Priced,
    TopK,
    Verify,
)
from decoders.core.events.methods import (
    AttentionMask,
    CatchUp,
    CopySource,
    HeadProposals,
    JacobiIteration,
    LayerExit,
    LookaheadWindow,
    MaskGroups,
    MaskPredictStep,
    NgramPool,
    Recycled,
    StoreMatch,
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Prefill,
        Forward,
        Draft,
        Verify,
        JacobiIteration,
        NgramPool,
        LookaheadWindow,
        AttentionMask,
        TopK,
        Commit,
        DraftStop,
        CopySource,
        StoreMatch,
        Recycled,
        HeadProposals,
        MaskGroups,
        MaskPredictStep,
        LayerExit,
        CatchUp,
        Priced,
        Done,
    )
}


def token_ids(event: Event) -> list[int]:
    """Every token id an event names: what a view may need the text of (the window's guesses,
    the pool's n-grams, the mask's inputs, not only the drafts and commits)."""
    if isinstance(event, Prefill):
        return list(event.prompt_ids)
    if isinstance(event, Draft | Commit | TopK | JacobiIteration | MaskPredictStep):
        return list(event.tokens)
    if isinstance(
        event, Verify
    ):  # the target's token, and its own where the relaxed rule took another
        return ([] if event.correction is None else [event.correction]) + list(event.preferred)
    if isinstance(event, LookaheadWindow):
        return [t for level in event.levels for t in level] + list(event.outputs)
    if isinstance(event, NgramPool):  # a `top` entry is (hit count, *n-gram)
        return [t for gram in event.added for t in gram] + [t for e in event.top for t in e[1:]]
    if isinstance(event, AttentionMask):
        return list(event.input_ids)
    if isinstance(event, Recycled):
        return [t for row in event.rows for t in row]
    if isinstance(event, HeadProposals):
        return [t for row in event.heads for t in row]
    if isinstance(event, MaskGroups):
        return [*event.candidates, *(t for row in event.groups for t in row), *event.guesses]
    return []
