"""Trace files: checked for meaning, not just form, their lossless badge recomputed rather than
trusted; and the cold page's example trace. No gradio here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from decoders import METHODS
from decoders.core.base import EVERY_RUN
from decoders.core.errors import DecodingLabError, TraceError
from decoders.core.events import MAX_LAYERS, MAX_VOCAB, Commit, Done, whole
from decoders.core.models import loaded
from decoders.core.params import validate_params
from decoders.core.prices import recorded_prices
from decoders.core.stats import compute_stats
from decoders.core.tracefile import TraceCheck, check_token_ids
from decoders.engine import MAX_PROMPT_CHARS

from .links import UI_MAX_NEW_TOKENS
from .live import Trace, cached_reference, greedy_check, lossy_info, sampling_info
from .models import get_bundle, model_choices, vocab_size

# The page's example prompts; the first is the cold page's (and assets/example_trace.json's).
EXAMPLE_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Write a short, friendly email inviting the team to a Friday lunch.",
    "Summarize in two sentences: Speculative decoding lets a small draft model propose several "
    "tokens that a large target model verifies in a single forward pass, so the output is exactly "
    "what the large model would have written, only faster.",
    "Translate to French: The library opens at nine and closes at six.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Explain step by step.",
)
EXAMPLE_TRACE = Path(__file__).resolve().parents[1] / "assets" / "example_trace.json"


# A prompt's tokens: no more than the engine's prompt limit in characters (a token is >= 1 of them).
MAX_PROMPT_IDS = MAX_PROMPT_CHARS


def check_trace_params(params: Mapping[str, Any], method: str) -> dict[str, Any]:
    """The trace's `params` against the method's schema: JSON types as the schema says (so a
    temperature of "0.5" is refused, not parsed), then names, ranges and choices."""
    schema = {p.name: p for p in METHODS[method].schema}
    json_types: dict[type, tuple[type, ...]] = {
        bool: (bool,),
        int: (int,),
        float: (int, float),
        str: (str,),
    }
    for name, value in params.items():
        p = schema.get(name)
        if p is None:
            continue  # validate_params names the unknown parameter with the valid ones
        ok = isinstance(value, json_types.get(p.type, (p.type,))) and (
            p.type is bool or not isinstance(value, bool)
        )
        if not ok:
            raise TraceError(
                f"trace field 'params.{name}' must be a {p.type.__name__}, got {value!r}"
            )
    try:
        return validate_params(METHODS[method].schema, params, method)
    except DecodingLabError as exc:
        raise TraceError(f"trace field 'params': {exc}") from None


def _check_meta(meta: dict[str, Any], vocab: int | None) -> tuple[int, list[int]]:
    """The trace's own fields: method, model, prompt, budget, sizes, parameters and prompt ids;
    returns the vocabulary size that bounds its token ids, and the prompt ids."""
    need = TraceCheck.need
    method = meta.get("method")
    need(
        isinstance(method, str) and method in METHODS,
        f"trace field 'method' must be one of {', '.join(METHODS)}; got {method!r}",
    )
    need(
        isinstance(meta.get("model"), str) and meta["model"],
        "trace field 'model' must be a model id",
    )
    prompt = meta.get("prompt")
    need(
        prompt is None or (isinstance(prompt, str) and len(prompt) <= MAX_PROMPT_CHARS),
        f"trace field 'prompt' must be text of at most {MAX_PROMPT_CHARS} characters",
    )
    need(
        whole(meta.get("max_new_tokens"), 1, UI_MAX_NEW_TOKENS),
        f"trace field 'max_new_tokens' must be a whole number in 1..{UI_MAX_NEW_TOKENS} "
        f"(this page's cap), got {meta.get('max_new_tokens')!r}",
    )
    if "n_layers" in meta:
        need(
            whole(meta["n_layers"], 1, MAX_LAYERS),
            f"trace field 'n_layers' must be a whole number in 1..{MAX_LAYERS}, "
            f"got {meta['n_layers']!r}",
        )
    if "vocab_size" in meta:
        need(
            whole(meta["vocab_size"], 1, MAX_VOCAB),
            f"trace field 'vocab_size' must be a whole number in 1..{MAX_VOCAB}, "
            f"got {meta['vocab_size']!r}",
        )
    need(isinstance(meta.get("params", {}), dict), "trace field 'params' must be an object")
    check_trace_params(meta.get("params", {}), method)
    vocab = vocab or meta.get("vocab_size") or MAX_VOCAB
    prompt_ids = meta.get("prompt_ids")
    check_token_ids(prompt_ids, vocab, "prompt_ids")
    need(bool(prompt_ids), "trace field 'prompt_ids' is empty")
    need(
        len(prompt_ids) <= MAX_PROMPT_IDS,
        f"trace field 'prompt_ids' holds {len(prompt_ids)} tokens; the limit is {MAX_PROMPT_IDS}",
    )
    return vocab, prompt_ids


def check_trace(trace: Trace, vocab: int | None = None) -> Trace:
    """Check an imported trace's fields and the consistency of its events; return it with its
    statistics recomputed from the events and its lossless claim dropped (see `recheck_lossless`).
    `vocab`: the model's vocabulary size when the model is available here; else the file's own
    `vocab_size`, if any, bounds the token ids. Raises TraceError naming the field."""
    meta = dict(trace.meta)
    vocab, prompt_ids = _check_meta(meta, vocab)
    need = TraceCheck.need

    # Each event checks its own fields against what the events before it established.
    events = trace.events
    c = TraceCheck(
        vocab=vocab,
        n_layers=meta.get("n_layers", MAX_LAYERS),
        prompt_ids=tuple(prompt_ids),
        max_new_tokens=meta["max_new_tokens"],
        n_events=len(events),
        layers_given="n_layers" in meta,
    )
    for i, e in enumerate(events):
        where = f"event {i} ({e.type})"
        if isinstance(e, Done):
            need(i == len(events) - 1, f"{where}: Done must be the last event")
            continue
        need(
            e.type in EVERY_RUN or e.type in METHODS[meta["method"]].events,
            f"{where}: {meta['method']} never emits {e.type} events",
        )
        c.step(e, where)
        e.check(c, where)
    last_commit = c.last_commit
    need(last_commit >= 0, "the trace has no committed tokens to replay")
    committed = [t for e in events if isinstance(e, Commit) for t in e.tokens]
    need(
        len(committed) <= meta["max_new_tokens"],
        f"the trace commits {len(committed)} tokens, more than its max_new_tokens "
        f"({meta['max_new_tokens']})",
    )
    if "token_ids" in meta:
        listed = meta["token_ids"]
        first = next(
            (i for i, (a, b) in enumerate(zip(listed, committed, strict=False)) if a != b),
            min(len(listed), len(committed)),
        )
        need(
            listed == committed,
            f"trace field 'token_ids' differs from the committed tokens at position {first} "
            f"({len(listed)} listed, {len(committed)} committed)",
        )

    # Recompute what the views show rather than trust the file: statistics from the events (with
    # the recorded wall time when it is a plausible number) and no lossless claim.
    done = events[-1] if events and isinstance(events[-1], Done) else None
    recorded = done.stats.get("wall_s") if done else None
    wall = recorded if isinstance(recorded, int | float) and 0 < recorded < 1e6 else None
    body = [e for e in events if not isinstance(e, Done)]
    reason = done.finish_reason if done and done.finish_reason in ("eos", "length") else "cancelled"
    stats = compute_stats(body, wall, recorded_prices(meta), str(meta.get("method")))
    meta.pop("lossless", None)
    meta |= {"stats": stats, "finish_reason": reason, "token_ids": committed}
    return Trace(meta, [*body, Done(reason, stats)], dict(trace.texts))


def read_trace(data: str | bytes) -> Trace:
    """Parse a trace file and check it. Token ids are checked against the real vocabulary when
    the trace's model is loaded here already (reading a file never loads a model); otherwise
    against the file's own `vocab_size`, and `recheck_lossless` checks them once it has the model."""
    trace = Trace.from_json(data)
    model = trace.meta.get("model")
    bundle = loaded(model) if isinstance(model, str) and model else None
    return check_trace(trace, vocab_size(bundle) if bundle is not None else None)


def recheck_lossless(trace: Trace) -> dict[str, Any]:
    """The lossless badge of a trace made elsewhere: re-run greedy on its prompt ids with its model
    when that model is offered here; otherwise say plainly that it was not checked."""
    meta = trace.meta
    model = meta["model"]
    params = meta.get("params") or {}
    temperature = params.get("temperature", 0.0)
    if isinstance(temperature, int | float) and temperature > 0:
        return sampling_info(str(meta.get("method")), params)
    if model not in {v for _, v in model_choices()}:
        return {
            "status": "not checked",
            "note": f"not checked: {model} is not available here (the file's own claim is not trusted)",
        }
    if meta["max_new_tokens"] > UI_MAX_NEW_TOKENS:
        return {
            "status": "not checked",
            "note": f"not checked: longer than this page runs ({UI_MAX_NEW_TOKENS} tokens)",
        }
    try:
        bundle = get_bundle(model)
    except DecodingLabError as exc:
        return {"status": "not checked", "note": f"not checked: {exc}"}
    tokens = trace.token_ids
    budget = meta["max_new_tokens"] if meta.get("finish_reason") != "cancelled" else len(tokens)
    vocab = vocab_size(bundle)
    if any(t >= vocab for t in (*meta["prompt_ids"], *tokens)):
        return {
            "status": "not checked",
            "note": f"not checked: token ids beyond {model}'s vocabulary of {vocab}",
        }
    if len(meta["prompt_ids"]) + budget > bundle.context_length:
        return {
            "status": "not checked",
            "note": f"not checked: longer than {model}'s context of {bundle.context_length} tokens",
        }
    if bundle.window and len(meta["prompt_ids"]) + budget > bundle.window:
        return {
            "status": "not checked",
            "note": f"not checked: longer than {model}'s sliding window of {bundle.window} tokens",
        }
    reference = cached_reference(bundle, tuple(meta["prompt_ids"]), budget)
    if meta["method"] in METHODS and not METHODS[meta["method"]].claims_lossless(
        meta.get("params") or {}
    ):
        return {**lossy_info(bundle, meta["prompt_ids"], reference, tokens), "rechecked": True}
    return {**greedy_check(bundle, meta["prompt_ids"], reference, tokens), "rechecked": True}


def load_example() -> Trace | None:
    """The cold page's trace (assets/example_trace.json, made by scripts/make_example_trace.py),
    checked like any import. Replayed with no model, so its lossless badge says what was recorded
    and that it was not re-checked here. None when the file is missing or no longer valid."""
    try:
        raw = EXAMPLE_TRACE.read_bytes()
        recorded = json.loads(raw).get("lossless") or {}
        trace = check_trace(Trace.from_json(raw))
    except (OSError, ValueError, DecodingLabError):
        return None
    claim = (
        f"identical to greedy ({recorded.get('compared')} tokens)"
        if recorded.get("status") == "identical"
        else str(recorded.get("status", "no claim"))
    )
    trace.meta["lossless"] = {
        "status": "not checked",
        "note": f"example: recorded as {claim} when made; not re-checked here",
    }
    return trace
