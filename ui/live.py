"""A run as the page keeps it (Trace), streamed while it decodes (run_live) in a worker thread
(in_background), with its lossless badge; and a run cut short by Stop. No gradio here, so the same
functions serve the page, the API endpoints and the tests."""

from __future__ import annotations

import functools
import json
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from decoders import METHODS, InvalidInput, compare_tokens, prepare
from decoders.core import quality
from decoders.core.costs import price_table
from decoders.core.events import Commit, Done, Event, token_ids
from decoders.core.models import ModelBundle
from decoders.core.prices import recorded_prices
from decoders.core.stats import compute_stats
from decoders.core.tracefile import trace_from_json, trace_to_dict
from decoders.engine import (
    Run,
    check_request,
    get_method,
    run_events,
    with_near_tie,
)

from .links import check_budget
from .models import check_draft, get_bundle, token_texts, vocab_size


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


def sampling_info(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The badge of a sampled run: nothing to compare token by token; what it keeps instead."""
    if method == "autoregressive":
        note = "sampling run: the reference itself, sampled (nothing to compare token by token)"
    elif method in METHODS and METHODS[method].claims_lossless(params):
        note = "sampling run: lossless in distribution, not token by token"
    else:
        note = "sampling run of a lossy method: not checked, and not the target's distribution"
    return {"status": "n/a", "note": note}


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
        return sampling_info(method, params)
    if method == "autoregressive":
        return {"status": "reference"}
    reference, rate = reference_run(bundle, tuple(prompt_ids), max_new_tokens)
    _reference_rates[(tuple(prompt_ids), max_new_tokens)] = rate
    if not get_method(method).claims_lossless(params):
        return lossy_info(bundle, prompt_ids, reference, tokens)
    return greedy_check(bundle, prompt_ids, reference, tokens)


def greedy_check(
    bundle: ModelBundle, prompt_ids: list[int], reference: Sequence[int], tokens: list[int]
) -> dict[str, Any]:
    """A lossless method's badge: identical, identical up to a float near-tie (the first
    difference falls where greedy's top two logits are closer than the dtype's noise: counted
    apart from a real difference), or differs."""
    check = with_near_tie(
        bundle, prompt_ids, reference, compare_tokens(reference, tokens, bundle.exact)
    )
    status = "identical" if check.identical else "near_tie" if check.near_tie else "differs"
    info: dict[str, Any] = {
        "status": status,
        "first_divergence": check.first_divergence,
        "compared": check.compared,
    }
    if check.near_tie:
        info["gap"] = check.gap
        info["note"] = check.describe()
    if not bundle.exact:
        info["caveat"] = (
            f"{bundle.dtype} on {bundle.device}: near-ties can flip between batch shapes"
        )
    return info


def lossy_info(
    bundle: ModelBundle, prompt_ids: list[int], reference: tuple[int, ...], tokens: list[int]
) -> dict[str, Any]:
    """A lossy method's badge: never "identical", always how close it came (decoders/core/quality.py):
    agreement, the first difference, ROUGE-L, and NLL beside greedy's own."""
    q = quality.compare(reference, tokens)
    return {
        "status": "lossy",
        **q.as_dict(),
        **quality.under_target(bundle, prompt_ids, tokens),
        "nll_greedy": quality.nll(bundle, prompt_ids, reference),
    }


def cached_reference(
    bundle: ModelBundle, prompt_ids: tuple[int, ...], max_new_tokens: int
) -> tuple[int, ...]:
    # Immutable: one cached reference is handed to every concurrent run that asks for it.
    return reference_run(bundle, prompt_ids, max_new_tokens)[0]


@functools.lru_cache(maxsize=64)
def reference_run(
    bundle: ModelBundle, prompt_ids: tuple[int, ...], max_new_tokens: int
) -> tuple[tuple[int, ...], float]:
    """Autoregressive greedy on this prompt, decoded once (the lossless check's reference): its
    tokens, and its tokens/s, what a run of the prompt is measured against."""
    from decoders.engine import generate

    run = generate(bundle, list(prompt_ids), "autoregressive", max_new_tokens, record=False)
    return tuple(run.token_ids), float(run.stats["tokens_per_s"])


def measured_speedup(trace: Trace) -> dict[str, Any] | None:
    """A finished run's clock against the autoregressive run of its prompt that its greedy check
    decoded (None until there is one)."""
    meta = trace.meta
    key = (tuple(meta.get("prompt_ids") or ()), meta.get("max_new_tokens"))
    rate = _reference_rates.get(key)
    tps = (meta.get("stats") or {}).get("tokens_per_s")
    if not rate or not tps:
        return None
    return {"speedup": round(float(tps) / rate, 2)}


_reference_rates: dict[tuple, float] = {}  # (prompt ids, budget) -> the reference's tokens/s


@dataclass
class Live:
    """One streamed update: the trace so far, whether the run has finished, and its phase:
    "decoding" while tokens arrive, "checking" while the greedy reference runs, "done"."""

    trace: Trace
    done: bool
    elapsed_s: float
    phase: str = "decoding"


def run_meta(bundle: ModelBundle, run: Run, prompt: str) -> dict[str, Any]:
    """What a trace records about its run before the first event: enough to replay it."""
    return {
        "model": bundle.model_id,
        "method": run.method.name,
        "params": dict(run.cfg.params),
        "prompt": prompt,
        "prompt_ids": run.prompt_ids,
        "max_new_tokens": run.cfg.max_new_tokens,
        "n_layers": bundle.n_layers,
        "vocab_size": vocab_size(bundle),
        # what its work is priced by (the same table every run of this model here reads)
        "prices": price_table(bundle).to_dict(),
    }


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
    max_new_tokens = check_budget(max_new_tokens)
    check_request(prompt, method, max_new_tokens, params)  # before loading a model
    check_draft(params)
    bundle = get_bundle(model)
    run = prepare(bundle, prompt, method, max_new_tokens, params=params)
    trace = Trace(run_meta(bundle, run, prompt), texts=token_texts(bundle, run.prompt_ids))
    start = time.perf_counter()
    for batch in in_background(run_events(run), every_s):
        for event in batch:
            trace.events.append(event)
            for t in token_ids(event):  # every token a view may name, not only the commits
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
        # Say so before the greedy reference runs: it can take as long as the run itself.
        yield Live(trace, False, time.perf_counter() - start, phase="checking")
        trace.meta["lossless"] = lossless_info(
            bundle, method, run.cfg.params, run.prompt_ids, max_new_tokens, tokens
        )
    yield Live(trace, True, time.perf_counter() - start, phase="done")


_END = object()
T = TypeVar("T")


def in_background(
    events: Iterator[T],
    every_s: float = 0.0,
    heartbeat_s: float | None = None,
    name: str = "decode",
) -> Iterator[list[T]]:
    """Decode in a worker thread and hand over whatever has arrived, in batches.

    The page redraws at its own pace while decoding never waits for it (a slow browser cannot
    slow the model down). Closing this generator (Stop, a dropped connection) stops the worker at
    its next event, so no run outlives its viewer. After the first batch (the first token should
    show at once), batches are at least `every_s` apart: a consumer that wakes for every event would
    take the GIL from the decoding thread dozens of times per token. With `heartbeat_s`, an empty
    batch comes whenever that long passes with nothing new (a long prefill, the greedy check): the
    consumer is never stuck waiting, so a Stop reaches it at once.
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

    threading.Thread(target=work, daemon=True, name=name).start()
    try:
        last = None
        while True:
            if last is not None:
                time.sleep(max(0.0, last + every_s - time.perf_counter()))
            try:
                batch = [inbox.get(timeout=heartbeat_s)]
            except queue.Empty:
                yield []
                continue
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


def stopped(trace: Trace, elapsed_s: float | None = None) -> Trace:
    """A run cut short by Stop, kept so it can be stepped through and exported: its events so far
    and a Done("cancelled") with the statistics of what did happen. A run stopped while its
    greedy check ran keeps its own Done, with the check marked as not done."""
    events = list(trace.events)  # a snapshot: the run may still be appending
    done = next((e for e in events if isinstance(e, Done)), None)
    body = [e for e in events if not isinstance(e, Done)]
    if done is None:
        done = Done(
            "cancelled",
            compute_stats(body, elapsed_s, recorded_prices(trace.meta), trace.meta.get("method")),
        )
    tokens = [t for e in body if isinstance(e, Commit) for t in e.tokens]
    meta = {
        **trace.meta,
        "token_ids": tokens,
        "stats": done.stats,
        "finish_reason": done.finish_reason,
        "lossless": trace.meta.get("lossless")
        or {"status": "not checked", "note": "stopped: not checked against greedy"},
    }
    return Trace(meta, [*body, done], dict(trace.texts))
