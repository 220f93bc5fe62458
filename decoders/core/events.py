"""Typed trace events: what a decoder did, step by step.

Events are frozen dataclasses holding plain token ids and numbers (never tensors), so a trace is
cheap to keep, safe to share between threads, and round-trips through JSON. A decoder yields them;
`generate()` folds them into stats; the UI draws them. `SCHEMA_VERSION` changes whenever a field's
meaning changes, so a saved trace from an older version is refused with a clear message.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar, Literal, Union

from decoders.core.errors import TraceError

SCHEMA_VERSION = 1
TRACE_FORMAT = "decoding-lab-trace"

# "shallow": FREE's pass through the layers below its exit (every token); "sync": its synchronized
# pass (held-back tokens and the current one through the deep layers); "oracle": CALM's oracle
# peeking at the full model's token (an analysis pass, not counted as computed)
ForwardKind = Literal["prefill", "target", "draft", "verify", "shallow", "sync", "oracle"]
# Where a committed token came from (the colour language in docs/ARCHITECTURE.md keys on these).
# "mask": filled by a mask and never verified (a lossy method's token); "exit": predicted at an early
# exit, never verified by the full model (lossy); "relaxed": a draft that relaxed verification
# accepted where the exact rule would have rejected it (lossy).
Origin = Literal["target", "draft", "correction", "bonus", "mask", "exit", "relaxed"]


@dataclass(frozen=True)
class Event:
    type: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class Prefill(Event):
    """The prompt, as token ids actually fed to the model."""

    type: ClassVar[str] = "Prefill"
    prompt_ids: tuple[int, ...]


@dataclass(frozen=True)
class Forward(Event):
    """One model forward pass. `kind` says whose pass it was (ForwardKind); prefill, target,
    verify and sync (FREE's catch-up) are target passes, which stats counts as such."""

    type: ClassVar[str] = "Forward"
    step: int
    kind: str  # ForwardKind
    n_input_tokens: int
    layers: int
    wall_ms: float


@dataclass(frozen=True)
class Draft(Event):
    """Draft tokens as a tree: parents[i] is the index of node i's parent, -1 = the root (last commit)."""

    type: ClassVar[str] = "Draft"
    step: int
    source: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    probs: tuple[float, ...]


@dataclass(frozen=True)
class Verify(Event):
    """Indices of accepted draft nodes, and the token the target supplied after them.
    `target_probs[i]`: the target's probability of draft node i's token given its ancestors
    (what the verifier weighed it with); empty in traces from before it was recorded.
    `relaxed`: the accepted nodes that only relaxed verification (SpecDec's top-β, tolerance τ)
    accepted: the exact rule would have rejected them."""

    type: ClassVar[str] = "Verify"
    step: int
    accepted: tuple[int, ...]
    correction: int | None
    rule: str
    target_probs: tuple[float, ...] = ()
    relaxed: tuple[int, ...] = ()


@dataclass(frozen=True)
class JacobiIteration(Event):
    """The block of guesses one Jacobi iteration fed: `tokens[i]` is the guess for output position
    `start + i` (`start` = tokens committed before this iteration; -1 in older traces);
    `changed[i]`: whether that guess differs from the previous iteration's for the same position."""

    type: ClassVar[str] = "JacobiIteration"
    step: int
    iteration: int
    tokens: tuple[int, ...]
    changed: tuple[bool, ...]
    start: int = -1


@dataclass(frozen=True)
class NgramPool(Event):
    """The n-gram pool after a lookahead step: `added` = n-grams the window yielded this step;
    `hits` = candidates found for the last committed token (what the verify branch checked);
    `size` = n-grams held; `top` = the most used n-grams with their hit counts so far;
    `n` = the n-gram size N (0 in older traces)."""

    type: ClassVar[str] = "NgramPool"
    step: int
    added: tuple[tuple[int, ...], ...]
    hits: int
    size: int = 0
    top: tuple[tuple[int, ...], ...] = ()  # each: (hit count, *n-gram tokens)
    n: int = 0


@dataclass(frozen=True)
class LookaheadWindow(Event):
    """Lookahead's 2D window at one step: `levels[j][i]` is the token at Jacobi level j (0 = the
    oldest), window position i; `outputs[i]` is the target's new guess on top of column i."""

    type: ClassVar[str] = "LookaheadWindow"
    step: int
    levels: tuple[tuple[int, ...], ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class AttentionMask(Event):
    """The attention pattern of one forward among its new inputs (the cached context is visible
    to all): `visible[i]` lists the input indices input i attends to; `labels[i]` names its branch
    and slot, e.g. "x", "look L1·3", "verify n2·d1"; `input_ids[i]` is input i's token and
    `branches[i]` its group ("x", "lookahead", "verify"); both empty in older traces."""

    type: ClassVar[str] = "AttentionMask"
    step: int
    labels: tuple[str, ...]
    visible: tuple[tuple[int, ...], ...]
    input_ids: tuple[int, ...] = ()
    branches: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopK(Event):
    """The target's most likely next tokens at one position (what the choice was made from)."""

    type: ClassVar[str] = "TopK"
    step: int
    position: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]


@dataclass(frozen=True)
class Commit(Event):
    """Tokens appended to the output this step; `probs[i]`: the probability of token i under
    whatever wrote it: the target for its own and verified tokens; the exit's distribution for a
    token that left early (CALM, HASH EE) and the shallow exit's confidence for one FREE held
    back; the mask row's confidence for Mask-Predict's unverified tokens."""

    type: ClassVar[str] = "Commit"
    step: int
    tokens: tuple[int, ...]
    origins: tuple[str, ...]  # Origin per token
    probs: tuple[float, ...]


@dataclass(frozen=True)
class DraftStop(Event):
    """Why a confidence-gated draft (Draft & Verify, Kangaroo, speculative's stop) stopped at one
    step. `confidences[i]`: what each paper's rule weighs against `threshold` (θ, η) for draft
    token i: the draft's top probability (Draft & Verify, Kangaroo) or the drafted token's own
    (speculative's stop, EAGLE-2's confidence); the same under greedy drafting;
    `reason`: "confidence" (the last token fell below θ), "max_draft", "eos" (the draft proposed an
    end token), "budget" (max_new_tokens left no room) or "cost" (the next token's path
    probability did not pay for its input: speculative's schedule=cost; it was not kept);
    `rate`: the smoothed acceptance rate θ's update has seen before this step."""

    type: ClassVar[str] = "DraftStop"
    step: int
    threshold: float
    confidences: tuple[float, ...]
    reason: str
    rate: float = 0.0


@dataclass(frozen=True)
class CopySource(Event):
    """Where a copied draft came from (prompt lookup): the context as the model sees it (the prompt
    ids, chat template included, then the output so far; `context_len` tokens at this step) ends
    with an n-gram that also occurs at `start`; the draft copies what followed that occurrence,
    context[start + n : start + n + len(draft)]."""

    type: ClassVar[str] = "CopySource"
    step: int
    start: int
    n: int
    context_len: int


@dataclass(frozen=True)
class HeadProposals(Event):
    """What the Medusa heads guessed at one step (medusa, blockwise): `heads[i]` = head i + 1's
    top tokens, best first, with `probs[i]` their probabilities under the head. Head i + 1 guesses
    output position `position + i` (`position` = tokens committed before this step; head 1
    guesses the token right after the root, the last committed one)."""

    type: ClassVar[str] = "HeadProposals"
    step: int
    position: int
    heads: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class MaskGroups(Event):
    """SPACE's relay at one step: `candidates` = the guesses verified this step (c_1 .. c_m);
    `groups[g]` = the top token of each of the k masks in group g (after x for g = 0, after c_g
    otherwise), `probs[g]` their probabilities; `handed` = the group after the last accepted input,
    whose guesses `guesses` (drawn from it when sampling) the next step verifies. `position` =
    output tokens committed before this step. Step 0 is the prefill's single group."""

    type: ClassVar[str] = "MaskGroups"
    step: int
    position: int
    candidates: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]
    handed: int
    guesses: tuple[int, ...] = ()


@dataclass(frozen=True)
class MaskPredictStep(Event):
    """One Mask-Predict iteration on a block: `tokens[j]` = the block's current fill of output
    position `position` + j and `probs[j]` its confidence when it was predicted; `updated` = the
    positions predicted in this iteration (the masked ones), `remasked` = those masked again for
    the next iteration (empty on a block's last)."""

    type: ClassVar[str] = "MaskPredictStep"
    step: int
    position: int
    iteration: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    updated: tuple[int, ...]
    remasked: tuple[int, ...]


@dataclass(frozen=True)
class LayerExit(Event):
    """Where one token left the model (CALM, FREE, HASH EE): the token at output index `position`
    came from the exit after `layer` of the model's `n_layers` decoder layers (`layer ==
    n_layers`: no early exit, the full model's LM head). On the way up, exits `layers[i]` were
    offered with `confidences[i]` weighed against `threshold` (CALM and FREE, rule "confidence":
    exit at the first confidence above it); HASH EE (rule "hash") offers none: the input token's
    hash chose `layer`."""

    type: ClassVar[str] = "LayerExit"
    step: int
    position: int
    layer: int
    n_layers: int
    layers: tuple[int, ...]
    confidences: tuple[float, ...]
    threshold: float
    rule: str


@dataclass(frozen=True)
class CatchUp(Event):
    """FREE's synchronized parallel pass at a step: the held-back tokens at output indices
    `positions` (they left at the shallow exit) ran the deep layers in one forward together with
    this step's token, which filled their deep keys and values. `agreed[i]`: whether the deep
    model would have written the same token as the shallow exit did; `threshold`: the shallow
    exit's threshold after this step's samples (the Beta-mixture estimate when adaptive)."""

    type: ClassVar[str] = "CatchUp"
    step: int
    positions: tuple[int, ...]
    agreed: tuple[bool, ...]
    threshold: float


@dataclass(frozen=True)
class Done(Event):
    """End of a run: why it stopped ("eos" | "length" | "cancelled") and the metrics."""

    type: ClassVar[str] = "Done"
    finish_reason: str
    stats: dict[str, Any]


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
        HeadProposals,
        MaskGroups,
        MaskPredictStep,
        LayerExit,
        CatchUp,
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
    if isinstance(event, Verify):
        return [] if event.correction is None else [event.correction]
    if isinstance(event, LookaheadWindow):
        return [t for level in event.levels for t in level] + list(event.outputs)
    if isinstance(event, NgramPool):  # a `top` entry is (hit count, *n-gram)
        return [t for gram in event.added for t in gram] + [t for e in event.top for t in e[1:]]
    if isinstance(event, AttentionMask):
        return list(event.input_ids)
    if isinstance(event, HeadProposals):
        return [t for row in event.heads for t in row]
    if isinstance(event, MaskGroups):
        return [*event.candidates, *(t for row in event.groups for t in row), *event.guesses]
    return []


# --- JSON -----------------------------------------------------------------------------------------


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check `value` (from JSON) against a field's type hint and turn lists back into tuples."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        return _coerce(value, next(o for o in options if o is not type(None)), where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise TraceError(f"{where}: expected a list, got {type(value).__name__}")
        (item_hint, _) = typing.get_args(hint)
        return tuple(_coerce(v, item_hint, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise TraceError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TraceError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TraceError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TraceError(f"{where}: expected an object, got {type(value).__name__}")
        return value
    raise TypeError(f"unsupported field type {hint!r}")  # a programming error, not bad input


def event_from_dict(data: Any) -> Event:
    if not isinstance(data, dict):
        raise TraceError(f"an event must be an object, got {type(data).__name__}")
    name = data.get("type")
    cls = EVENT_TYPES.get(name)  # type: ignore[arg-type]
    if cls is None:
        raise TraceError(f"unknown event type {name!r}; known: {', '.join(EVENT_TYPES)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is not MISSING:  # added after schema 1 shipped: old traces omit it
                continue
            raise TraceError(f"{name} event is missing field {f.name!r}")
        kwargs[f.name] = _coerce(data[f.name], hints[f.name], f"{name}.{f.name}")
    return cls(**kwargs)


def events_to_json(events: list[Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events]


def events_from_json(items: Any) -> list[Event]:
    if not isinstance(items, list):
        raise TraceError("'events' must be a list")
    return [event_from_dict(item) for item in items]


# --- Trace files ----------------------------------------------------------------------------------

MAX_TRACE_BYTES = 32 * 1024 * 1024


def trace_to_dict(meta: dict[str, Any], events: list[Event]) -> dict[str, Any]:
    """A self-contained, versioned trace: run metadata plus every event."""
    return {
        "format": TRACE_FORMAT,
        "version": SCHEMA_VERSION,
        **meta,
        "events": events_to_json(events),
    }


def trace_from_json(
    text: str | bytes, max_bytes: int = MAX_TRACE_BYTES
) -> tuple[dict, list[Event]]:
    """Parse and validate a trace file. Returns (metadata, events); raises TraceError on any flaw."""
    if len(text) > max_bytes:
        raise TraceError(f"trace is {len(text)} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"not valid JSON: {exc}") from None
    except RecursionError:  # e.g. 100,000 nested brackets: valid JSON, never a trace
        raise TraceError("not a Decoding Lab trace: JSON nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError(f'not a Decoding Lab trace (missing "format": "{TRACE_FORMAT}")')
    if data.get("version") != SCHEMA_VERSION:
        raise TraceError(
            f"trace schema version {data.get('version')!r} is not supported (this build reads {SCHEMA_VERSION})"
        )
    events = events_from_json(data.get("events"))
    meta = {k: v for k, v in data.items() if k not in ("format", "version", "events")}
    return meta, events
