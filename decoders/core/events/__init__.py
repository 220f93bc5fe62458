"""Typed trace events: what a decoder did, step by step.

Events are frozen dataclasses holding plain token ids and numbers (never tensors), so a trace is
cheap to keep, safe to share between threads, and round-trips through JSON. A decoder yields them;
`generate()` folds them into stats; the UI draws them. `SCHEMA_VERSION` changes whenever a field's
meaning changes (tracefile.py: a trace of an older version is migrated on reading, or refused
with a clear message). Each event checks its own fields when read from a file (`Event.check`).
"""

from __future__ import annotations

from decoders.core.events.common import *  # noqa: F403
from decoders.core.events.common import (  # noqa: F401  (the package's names)
    EVENT_TYPES,
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
from decoders.core.events.methods import (  # noqa: F401  (each registers itself)
    AttentionMask,
    BlockFill,
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


def token_ids(event: Event) -> list[int]:
    """Every token id an event names: what a view may need the text of (the window's guesses,
    the pool's n-grams, the mask's inputs, not only the drafts and commits). Each event type
    says its own (`Event.token_ids`)."""
    return event.token_ids()
