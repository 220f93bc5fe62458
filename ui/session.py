"""What the app holds per session, and the engine calls behind its buttons. No gradio here, so the
same functions serve the page, the API endpoints and the tests."""

from __future__ import annotations

import functools
import json
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from decoders import METHODS, InvalidInput, compare_tokens, load_model, prepare
from decoders.engine import check_request, greedy_reference, run_events
from decoders.events import (
    Commit,
    Done,
    Draft,
    Event,
    Prefill,
    TopK,
    trace_from_json,
    trace_to_dict,
)
from decoders.models import EMBEDDED_ID, TINY_ID, TINY_SEEDS, ModelBundle, hub_reachable

EMBEDDED_LABEL = f"{EMBEDDED_ID} (embedded, offline)"
# Target models that share the embedded model's tokenizer (so it can draft for them later).
CURATED_MODELS = (
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
)
UI_MAX_NEW_TOKENS = int(os.environ.get("DECODING_LAB_UI_MAX_NEW_TOKENS", "512"))
ALLOW_ANY_MODEL = os.environ.get("DECODING_LAB_ALLOW_ANY_MODEL", "0") == "1"


@functools.cache
def model_choices() -> list[tuple[str, str]]:
    """(label, id) pairs for the model picker: the embedded model always; hub models where a network is."""
    default = os.environ.get("DECODING_LAB_MODEL") or EMBEDDED_ID
    choices = [(EMBEDDED_LABEL, EMBEDDED_ID), ("tiny-random (seeded 4-layer test model)", TINY_ID)]
    if default not in (EMBEDDED_ID, TINY_ID):
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
    """A public page loads only what it offers: `self`, `self:k`, the shipped `eagle` head, or an
    offered or built-in model as draft; other ids and `eagle:<file>` need
    DECODING_LAB_ALLOW_ANY_MODEL=1."""
    draft = str(params.get("draft", "self")).strip()
    if ALLOW_ANY_MODEL or draft in ("self", "eagle", *TINY_SEEDS) or draft.startswith("self:"):
        return
    if draft not in {v for _, v in model_choices()}:
        raise InvalidInput(
            f"draft {draft!r} is not offered here; use self, self:k, eagle, or one of the models"
        )


def get_bundle(model: str | None) -> ModelBundle:
    return load_model(resolve_model(model))


def token_texts(bundle: ModelBundle, ids: Iterable[int]) -> dict[int, str]:
    return {i: bundle.token_text(i) for i in set(ids)}


def ids_in(events: Iterable[Event]) -> set[int]:
    out: set[int] = set()
    for e in events:
        if isinstance(e, Commit | Draft | TopK):
            out.update(e.tokens)
        elif isinstance(e, Prefill):
            out.update(e.prompt_ids)
    return out


@dataclass
class Trace:
    """A run as the UI keeps it: metadata, events, token texts (so replay needs no model)."""

    meta: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    texts: dict[int, str] = field(default_factory=dict)

    @property
    def last_step(self) -> int:
        return max((e.step for e in self.events if isinstance(e, Commit)), default=0)

    @property
    def stats(self) -> dict[str, Any]:
        done = next((e for e in reversed(self.events) if isinstance(e, Done)), None)
        return done.stats if done else {}

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.events if isinstance(e, Commit) for t in e.tokens]

    def text(self) -> str:
        return "".join(self.texts.get(t, "") for t in self.token_ids)

    def to_json(self) -> str:
        meta = {**self.meta, "token_text": {str(k): v for k, v in sorted(self.texts.items())}}
        return json.dumps(trace_to_dict(meta, self.events))

    @classmethod
    def from_json(cls, text: str | bytes) -> Trace:
        meta, events = trace_from_json(text)
        raw = meta.pop("token_text", None) or {}
        if not isinstance(raw, dict):
            raise InvalidInput("trace field 'token_text' must be an object")
        texts = {int(k): str(v) for k, v in raw.items() if str(k).lstrip("-").isdigit()}
        if not any(isinstance(e, Commit) for e in events):
            raise InvalidInput("the trace has no committed tokens to replay")
        return cls(meta, events, texts)


def lossless_info(
    bundle: ModelBundle,
    method: str,
    params: Mapping[str, Any],
    prompt_ids: list[int],
    max_new_tokens: int,
    tokens: list[int],
) -> dict[str, Any]:
    """The badge's content: compare with autoregressive greedy, honestly labelled."""
    if params.get("temperature", 0.0) > 0:
        return {
            "status": "n/a",
            "note": "sampling run: lossless in distribution, not token by token",
        }
    if method == "autoregressive":
        return {"status": "reference"}
    reference = _cached_reference(bundle, tuple(prompt_ids), max_new_tokens)
    check = compare_tokens(reference, tokens, bundle.exact)
    info: dict[str, Any] = {
        "status": "identical" if check.identical else "differs",
        "first_divergence": check.first_divergence,
        "compared": check.compared,
    }
    if not bundle.exact:
        info["caveat"] = (
            f"{bundle.dtype} on {bundle.device}: near-ties can flip between batch shapes"
        )
    return info


@functools.lru_cache(maxsize=64)
def _cached_reference(
    bundle: ModelBundle, prompt_ids: tuple[int, ...], max_new_tokens: int
) -> list[int]:
    return greedy_reference(bundle, prompt_ids, max_new_tokens)


@dataclass
class Live:
    """One streamed update: the trace so far, and whether the run has finished."""

    trace: Trace
    done: bool
    elapsed_s: float


def run_live(
    model: str | None,
    prompt: str,
    method: str,
    max_new_tokens: int,
    params: Mapping[str, Any],
    check_lossless: bool = True,
    every_s: float = 0.0,
) -> Iterator[Live]:
    """Validate, then yield the growing trace as commits arrive (at most one update per `every_s`
    after the first), and once more when done."""
    if isinstance(max_new_tokens, float) and max_new_tokens.is_integer():
        max_new_tokens = int(max_new_tokens)
    if isinstance(max_new_tokens, int) and max_new_tokens > UI_MAX_NEW_TOKENS:
        raise InvalidInput(f"max_new_tokens is capped at {UI_MAX_NEW_TOKENS} here")
    check_request(prompt, method, max_new_tokens, params)  # before loading a model
    check_draft(params)
    bundle = get_bundle(model)
    run = prepare(bundle, prompt, method, max_new_tokens, params=params)
    meta = {
        "model": bundle.model_id,
        "method": method,
        "params": dict(run.cfg.params),
        "prompt": prompt,
        "prompt_ids": run.prompt_ids,
        "max_new_tokens": max_new_tokens,
        "n_layers": bundle.n_layers,
    }
    trace = Trace(meta, texts=token_texts(bundle, run.prompt_ids))
    start = time.perf_counter()
    for batch in in_background(run_events(run), every_s):
        for event in batch:
            trace.events.append(event)
            if isinstance(event, Commit | TopK | Draft):
                for t in event.tokens:
                    if t not in trace.texts:
                        trace.texts[t] = bundle.token_text(t)
        if any(isinstance(e, Commit) for e in batch):
            yield Live(trace, False, time.perf_counter() - start)
    tokens = trace.token_ids
    trace.meta.update(
        token_ids=tokens,
        text=bundle.decode(tokens),
        stats=trace.stats,
        finish_reason=trace.events[-1].finish_reason,
    )
    if check_lossless:
        trace.meta["lossless"] = lossless_info(
            bundle, method, run.cfg.params, run.prompt_ids, max_new_tokens, tokens
        )
    yield Live(trace, True, time.perf_counter() - start)


_END = object()


def in_background(events: Iterator[Event], every_s: float = 0.0) -> Iterator[list[Event]]:
    """Decode in a worker thread and hand over whatever has arrived, in batches.

    The page redraws at its own pace while decoding never waits for it (a slow browser cannot
    slow the model down). Closing this generator (Stop, a dropped connection) stops the worker at
    its next event, so no run outlives its viewer. After the first batch (the first token should
    show at once), batches are at least `every_s` apart: a consumer that wakes for every event would
    take the GIL from the decoding thread dozens of times per token.
    """
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()

    def work() -> None:
        try:
            for event in events:
                inbox.put(event)
                if stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            inbox.put(exc)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # runs the decoder's own clean-up
            inbox.put(_END)

    threading.Thread(target=work, daemon=True, name="decode").start()
    try:
        last = None
        while True:
            if last is not None:
                time.sleep(max(0.0, last + every_s - time.perf_counter()))
            batch = [inbox.get()]
            last = time.perf_counter()
            while not inbox.empty():
                batch.append(inbox.get_nowait())
            for item in batch:
                if isinstance(item, BaseException):
                    raise item
            done = batch[-1] is _END
            events_only = [e for e in batch if e is not _END]
            if events_only:
                yield events_only
            if done:
                return
    finally:
        stop.set()


def run_to_end(
    model: str | None,
    prompt: str,
    method: str,
    max_new_tokens: int,
    params: Mapping[str, Any],
    check_lossless: bool = True,
) -> Trace:
    *_, last = run_live(model, prompt, method, max_new_tokens, params, check_lossless)
    return last.trace


def compare_methods(
    model: str | None,
    prompt: str,
    methods: list[str],
    max_new_tokens: int,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> Iterator[tuple[list[dict], dict[str, Trace]]]:
    """Run each method on the same prompt (greedy; autoregressive first, as the speed and
    lossless reference), yielding the growing table after each method."""
    if not methods:
        raise InvalidInput("choose at least one method to compare")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise InvalidInput(f"unknown method {unknown[0]!r}; valid: {', '.join(METHODS)}")
    order = ["autoregressive"] + [m for m in dict.fromkeys(methods) if m != "autoregressive"]
    traces: dict[str, Trace] = {}
    rows: list[dict[str, Any]] = []
    for method in order:
        p = {
            k: v
            for k, v in (params or {}).get(method, {}).items()
            if k not in ("temperature", "top_p")
        }
        trace = run_to_end(model, prompt, method, max_new_tokens, p, check_lossless=False)
        traces[method] = trace
        reference = traces["autoregressive"].token_ids
        check = compare_tokens(reference, trace.token_ids)
        s = trace.stats
        base = traces["autoregressive"].stats["tokens_per_s"] or 1.0
        rows.append(
            {
                "method": method,
                "tokens_per_s": s["tokens_per_s"],
                "speedup": round(s["tokens_per_s"] / base, 3),
                "tokens_per_target_forward": s["tokens_per_target_forward"],
                "mean_acceptance_length": s["mean_acceptance_length"],
                "new_tokens": s["new_tokens"],
                "lossless": "reference"
                if method == "autoregressive"
                else (
                    "✓ identical" if check.identical else f"✗ differs at {check.first_divergence}"
                ),
            }
        )
        yield [r for r in rows if r["method"] in methods or r["method"] == "autoregressive"], traces
