"""Trace files: events to and from JSON, the schema version and the migrations of older ones, and
the context an imported trace's events check themselves against (TraceCheck)."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Union

from decoders.core.errors import TraceError
from decoders.core.events import (
    EVENT_TYPES,
    Event,
    Forward,
    whole,
)

SCHEMA_VERSION = 2  # 2: Forward's split and shallow (version 1 traces are migrated on reading)
TRACE_FORMAT = "decoding-lab-trace"


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
    except UnicodeDecodeError:
        raise TraceError(
            "not a trace file: it is not text (an image or another binary file?)"
        ) from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"not a trace file: it is not JSON ({exc})") from None
    except RecursionError:  # e.g. 100,000 nested brackets: valid JSON, never a trace
        raise TraceError("not a Decoding Lab trace: JSON nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError(f'not a Decoding Lab trace (missing "format": "{TRACE_FORMAT}")')
    version = data.get("version")
    if version not in MIGRATIONS and version != SCHEMA_VERSION:
        raise TraceError(
            f"trace schema version {version!r} is not supported (this build reads "
            f"{', '.join(map(str, [*MIGRATIONS, SCHEMA_VERSION]))})"
        )
    events = events_from_json(data.get("events"))
    meta = {k: v for k, v in data.items() if k not in ("format", "version", "events")}
    while version != SCHEMA_VERSION:  # older formats, brought up to this one, step by step
        meta, events, version = *MIGRATIONS[version](meta, events), version + 1
    return meta, events


def _split_passes_from_layers(meta: dict, events: list[Event]) -> tuple[dict, list[Event]]:
    """Version 1 -> 2: Kangaroo's and LayerSkip's passes did not say where they were split. A
    draft pass that ran the shallow layers ran ℓ of them plus the exit head (layers = ℓ + 1); the
    verify pass ran layers 1..ℓ, when it ran all L layers, for the inputs no draft pass fed."""
    if meta.get("method") not in ("kangaroo", "layerskip"):
        return meta, events
    forwards = [e for e in events if isinstance(e, Forward)]
    ell = next(
        (e.layers - 1 for e in forwards if e.kind == "draft" and e.step > 0 and e.layers >= 2), 0
    )
    depth = next((e.layers for e in forwards if e.kind == "prefill"), 0)
    fed: dict[int, int] = {}
    for e in forwards:
        if e.kind == "draft":
            fed[e.step] = fed.get(e.step, 0) + e.n_input_tokens
    out: list[Event] = []
    for e in events:
        if isinstance(e, Forward) and ell and e.kind == "draft" and e.layers >= 2:
            e = replace(e, split=ell, shallow=e.n_input_tokens)  # (an adapter-only pass: not split)
        elif isinstance(e, Forward) and ell and e.kind in ("verify", "target"):
            ran_shallow = e.layers > depth - ell
            shallow = max(1, e.n_input_tokens - fed.get(e.step, 0)) if ran_shallow else 0
            e = replace(e, split=ell, shallow=min(shallow, e.n_input_tokens))
        out.append(e)
    return meta, out


# version -> how a trace of that version becomes one of the next
MIGRATIONS = {1: _split_passes_from_layers}


def check_token_ids(ids: Any, vocab: int, where: str) -> None:
    """Token ids, each inside the vocabulary; the first that is not is named with its position."""
    if not isinstance(ids, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise TraceError(f"trace field '{where}' must hold token ids (whole numbers)")
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise TraceError(
                f"trace field '{where}' holds token id {t} at position {i}, outside the model's "
                f"vocabulary (0..{vocab - 1})"
            )


@dataclass
class TraceCheck:
    """What checking a trace's events needs to know: the trace's bounds (`vocab`, `n_layers`,
    the prompt, the budget) and what the events before the one checked established (which steps
    committed how much, drafted, exited). Events check themselves against it (`Event.check`);
    a broken rule raises TraceError naming the event and the field."""

    vocab: int
    n_layers: int
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    n_events: int
    layers_given: bool = False  # the trace names its model's layer count
    last_commit: int = -1
    n_committed: int = 0
    committed_before: dict[int, int] = field(default_factory=dict)  # step -> tokens before it
    drafted: dict[int, list[int]] = field(default_factory=dict)  # step -> its draft's parents
    exited: set[int] = field(default_factory=set)  # steps with a LayerExit
    caught: set[int] = field(default_factory=set)  # steps with a CatchUp
    left_early: set[int] = field(default_factory=set)  # output positions that left early

    @staticmethod
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise TraceError(message)

    def tokens(self, ids: Any, where: str) -> None:
        check_token_ids(ids, self.vocab, where)

    def probs(self, probs: Sequence[float], where: str) -> None:
        self.need(all(0.0 <= p <= 1.0 for p in probs), f"{where}: probabilities must be in [0, 1]")

    def position(self, position: int, step: int, where: str) -> None:
        """An output position an event names: the tokens the earlier steps committed."""
        before = self.committed_before[step]
        self.need(
            position == before,
            f"{where}: position must be the {before} tokens committed before step {step}, "
            f"got {position!r}",
        )

    def step(self, event: Event, where: str) -> None:
        """The order every stepped event keeps: steps rise one at a time, from 0."""
        step = getattr(event, "step", None)
        if step is None:
            return
        self.need(
            whole(step, 0, self.n_events), f"{where}: step {step} is outside 0..{self.n_events}"
        )
        self.need(
            step <= self.last_commit + 1,
            f"{where}: step {step} comes before step {self.last_commit + 1}",
        )
        self.committed_before.setdefault(step, self.n_committed)
