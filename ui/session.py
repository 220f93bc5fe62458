"""What the app holds per session, and the engine calls behind its buttons. No gradio here, so the
same functions serve the page, the API endpoints and the tests."""

from __future__ import annotations

import functools
import json
import math
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decoders import METHODS, InvalidInput, compare_tokens, load_model, prepare
from decoders.engine import (
    MAX_PROMPT_CHARS,
    check_request,
    greedy_reference,
    run_events,
)
from decoders.errors import DecodingLabError, TraceError
from decoders.events import (
    AttentionMask,
    Commit,
    CopySource,
    Done,
    Draft,
    DraftStop,
    Event,
    Forward,
    JacobiIteration,
    LookaheadWindow,
    NgramPool,
    Prefill,
    TopK,
    Verify,
    token_ids,
    trace_from_json,
    trace_to_dict,
)
from decoders.models import EMBEDDED_ID, TINY_ID, TINY_SEEDS, ModelBundle, hub_reachable, loaded
from decoders.params import SAMPLING_PARAMS, Param, validate_params
from decoders.stats import compute_stats

EMBEDDED_LABEL = f"{EMBEDDED_ID} (embedded, offline)"
# Target models that share the embedded model's tokenizer (so it can draft for them later).
CURATED_MODELS = (
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
)
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
    """A public page loads only what it offers: `auto`, `self`, `self:k`, the shipped `eagle` head,
    or an offered or built-in model as draft; other ids and `eagle:<file>` need
    DECODING_LAB_ALLOW_ANY_MODEL=1."""
    draft = str(params.get("draft", "auto")).strip()
    offered = ("auto", "self", "eagle", *TINY_SEEDS)
    if ALLOW_ANY_MODEL or draft in offered or draft.startswith("self:"):
        return
    if draft not in {v for _, v in model_choices()}:
        raise InvalidInput(
            f"draft {draft!r} is not offered here; use auto, self, self:k, eagle, or one of the models"
        )


def get_bundle(model: str | None) -> ModelBundle:
    return load_model(resolve_model(model))


def vocab_size(bundle: ModelBundle) -> int:
    """Token ids the model can read or write: its embedding rows (>= the tokenizer's length)."""
    return int(bundle.model.config.vocab_size)


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
) -> tuple[int, ...]:
    # Immutable: one cached reference is handed to every concurrent run that asks for it.
    return tuple(greedy_reference(bundle, prompt_ids, max_new_tokens))


@dataclass
class Live:
    """One streamed update: the trace so far, whether the run has finished, and its phase:
    "decoding" while tokens arrive, "checking" while the greedy reference runs, "done"."""

    trace: Trace
    done: bool
    elapsed_s: float
    phase: str = "decoding"


def check_budget(max_new_tokens: Any, shown: Any = None) -> int:
    """This page's budget rule, one message for the form, links and the API: a whole number in
    1..UI_MAX_NEW_TOKENS (the engine's own cap, MAX_NEW_TOKENS_CAP, is larger)."""
    value = max_new_tokens
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= UI_MAX_NEW_TOKENS:
        raise InvalidInput(
            f"max_new_tokens must be a whole number between 1 and {UI_MAX_NEW_TOKENS} on this page, "
            f"got {max_new_tokens if shown is None else shown!r}"
        )
    return value


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
    meta = {
        "model": bundle.model_id,
        "method": method,
        "params": dict(run.cfg.params),
        "prompt": prompt,
        "prompt_ids": run.prompt_ids,
        "max_new_tokens": max_new_tokens,
        "n_layers": bundle.n_layers,
        "vocab_size": vocab_size(bundle),
    }
    trace = Trace(meta, texts=token_texts(bundle, run.prompt_ids))
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


# --- shared links: URL parameters ------------------------------------------------------------------

# The form's own fields a link may set; any method parameter may follow (`?method=jacobi&block=8`),
# or come as one JSON object (`?params={"block": 8}`), or from a named preset (`?preset=paper`).
LINK_FORM_FIELDS = ("model", "prompt", "method", "max_new_tokens", "preset", "params")
SAMPLING_BY_NAME = {p.name: p for p in SAMPLING_PARAMS}


@dataclass
class Link:
    """What a shared link asks for, checked: the form's fields (model, prompt, method,
    max_new_tokens, temperature, top_p, seed), the chosen method's parameters, and one message
    per bad value, each naming its parameter. Bad values are left out, so the form keeps its own."""

    fields: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def parse_param(p: Param, raw: Any) -> Any:
    """A link's (or a file's) value for one parameter, or InvalidInput naming it. Numbers must be
    finite and within the schema's range; the range in the message is the schema's."""
    if p.type in (int, float) and not isinstance(raw, bool):
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise InvalidInput(f"{p.name} must be a number, got {raw!r}") from None
        if not math.isfinite(number):
            raise InvalidInput(f"{p.name} must be a finite number, got {raw!r}")
        if p.type is int and not number.is_integer():
            raise InvalidInput(f"{p.name} must be a whole number, got {raw!r}")
        if (p.min is not None and number < p.min) or (p.max is not None and number > p.max):
            lo, hi = (_plain(v) for v in (p.min, p.max))
            raise InvalidInput(f"{p.name} must be between {lo} and {hi}, got {raw}")
        raw = int(number) if p.type is int else number
    try:
        return p.parse(raw)
    except DecodingLabError as exc:
        raise InvalidInput(str(exc).replace("parameter ", "", 1)) from None


def _plain(v: float | None) -> str:
    return "—" if v is None else (str(int(v)) if float(v).is_integer() else str(v))


def parse_link(query: Mapping[str, str], default_method: str) -> Link:
    """Check a page link's query parameters; collect a message for every bad one."""
    link = Link()
    q = {k: v for k, v in query.items() if not k.startswith("__") and k != "view"}  # gradio's own

    def attempt(fn: Any) -> Any:
        try:
            return fn()
        except (DecodingLabError, KeyError, ValueError) as exc:
            link.errors.append(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
            return None

    method = default_method
    if "method" in q:
        if q["method"] in METHODS:
            method = link.fields["method"] = q["method"]
        else:
            link.errors.append(
                f"method={q['method']!r} is not a method here; valid: {', '.join(METHODS)}"
            )
    m = METHODS[method]
    if "model" in q:
        model = attempt(lambda: resolve_model(q["model"]))
        if model is not None:
            link.fields["model"] = model
    if "prompt" in q:
        if len(q["prompt"]) > MAX_PROMPT_CHARS:
            link.errors.append(
                f"prompt has {len(q['prompt'])} characters; the limit is {MAX_PROMPT_CHARS}"
            )
        else:
            link.fields["prompt"] = q["prompt"]
    if "max_new_tokens" in q:
        budget = attempt(lambda: _link_budget(q["max_new_tokens"]))
        if budget is not None:
            link.fields["max_new_tokens"] = budget
    for name, p in SAMPLING_BY_NAME.items():
        if name in q:
            value = attempt(lambda p=p, raw=q[name]: parse_param(p, raw))
            if value is not None:
                link.fields[name] = value

    given: dict[str, Any] = {}
    if "preset" in q:
        preset = q["preset"]
        if preset == "defaults" or preset in m.presets:
            given |= m.preset(preset)
            link.fields["preset"] = preset
        else:
            known = ", ".join(["defaults", *m.presets])
            link.errors.append(f"preset={preset!r} is not a preset of {method}; known: {known}")
    if "params" in q:
        given |= attempt(lambda: _link_params(q["params"], m)) or {}
    by_name = {p.name: p for p in m.params}
    others = {p.name: n for n, other in METHODS.items() for p in other.params if n != method}
    for key, raw in q.items():
        if key in LINK_FORM_FIELDS or key in SAMPLING_BY_NAME:
            continue
        if key in by_name:
            given[key] = raw
        elif key in others:
            link.errors.append(
                f"{key} is a parameter of {others[key]}, not of {method} (add method={others[key]})"
            )
        else:
            link.errors.append(f"unknown link parameter {key!r}")
    for key, raw in given.items():
        value = attempt(lambda key=key, raw=raw: parse_param(by_name[key], raw))
        if value is not None:
            link.params[key] = value
    if "draft" in link.params:
        try:
            check_draft(link.params)
        except InvalidInput as exc:
            link.errors.append(str(exc))
            del link.params["draft"]
    return link


def _link_budget(raw: str) -> int:
    try:
        number = float(raw)
    except ValueError:
        number = math.nan
    return check_budget(number, shown=raw)


def _link_params(raw: str, m: Any) -> dict[str, Any]:
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"params is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(values, dict):
        raise InvalidInput(
            f"params must be a JSON object of {m.name}'s parameters, got {type(values).__name__}"
        )
    names = {p.name for p in m.params}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InvalidInput(
            f"params: {unknown[0]!r} is not a parameter of {m.name}; valid: "
            f"{', '.join(sorted(names)) or 'none'}"
        )
    return values


# --- trace files: checked for meaning, not just form -----------------------------------------------

ORIGINS = frozenset({"target", "draft", "correction", "bonus"})
FORWARD_KINDS = frozenset({"prefill", "target", "draft", "verify"})
MAX_LAYERS = 1024
MAX_VOCAB = 10_000_000
# A prompt's tokens: no more than the engine's prompt limit in characters (a token is >= 1 of them).
MAX_PROMPT_IDS = MAX_PROMPT_CHARS
# The largest draft any method proposes in one step: lookahead's pool trie, G ≤ 16 candidates of
# N − 1 ≤ 11 tokens (token_tree: MAX_NODES = 64 grown + a 32-token copied branch).
MAX_DRAFT_NODES = 16 * 11
DRAFT_STOP_REASONS = frozenset({"confidence", "max_draft", "eos", "budget"})
NGRAM_SIZES = range(2, 13)  # lookahead's N; 0 in traces made before the field existed


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


def check_trace(trace: Trace, vocab: int | None = None) -> Trace:
    """Check an imported trace's fields and the consistency of its events; return it with its
    statistics recomputed from the events and its lossless claim dropped (see `recheck_lossless`).
    `vocab`: the model's vocabulary size when the model is available here; else the file's own
    `vocab_size`, if any, bounds the token ids. Raises TraceError naming the field."""
    meta = dict(trace.meta)

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise TraceError(message)

    def whole(value: Any, lo: int, hi: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi

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

    def tokens_ok(ids: Any, where: str) -> None:
        need(
            isinstance(ids, list | tuple) and all(whole(t, 0, vocab - 1) for t in ids),
            f"trace field '{where}' must hold token ids in 0..{vocab - 1}",
        )

    def probs_ok(probs: tuple[float, ...], where: str) -> None:
        need(all(0.0 <= p <= 1.0 for p in probs), f"{where}: probabilities must be in [0, 1]")

    prompt_ids = meta.get("prompt_ids")
    tokens_ok(prompt_ids, "prompt_ids")
    need(bool(prompt_ids), "trace field 'prompt_ids' is empty")
    need(
        len(prompt_ids) <= MAX_PROMPT_IDS,
        f"trace field 'prompt_ids' holds {len(prompt_ids)} tokens; the limit is {MAX_PROMPT_IDS}",
    )

    events = trace.events
    n_layers = meta.get("n_layers", MAX_LAYERS)
    last_commit = -1
    n_committed = 0
    committed_before: dict[int, int] = {}  # step -> tokens committed by the earlier steps
    drafted: dict[int, list[int]] = {}  # step -> the parents of the draft nodes proposed
    for i, e in enumerate(events):
        where = f"event {i} ({e.type})"
        if isinstance(e, Done):
            need(i == len(events) - 1, f"{where}: Done must be the last event")
            continue
        step = getattr(e, "step", None)
        if step is not None:
            # A step takes at least one event, so no step can exceed the event count.
            need(whole(step, 0, len(events)), f"{where}: step {step} is outside 0..{len(events)}")
            need(
                step <= last_commit + 1, f"{where}: step {step} comes before step {last_commit + 1}"
            )
            committed_before.setdefault(step, n_committed)
        if isinstance(e, Prefill):
            tokens_ok(e.prompt_ids, f"{where}.prompt_ids")
            need(
                list(e.prompt_ids) == list(prompt_ids),
                f"{where}: prompt_ids differ from the trace's",
            )
        elif isinstance(e, Commit):
            need(step > last_commit, f"{where}: step {step} commits again after step {last_commit}")
            last_commit = step
            tokens_ok(e.tokens, f"{where}.tokens")
            n_committed += len(e.tokens)
            need(
                len(e.tokens) == len(e.origins) == len(e.probs) > 0,
                f"{where}: tokens, origins and probs must be equally long and not empty",
            )
            need(
                set(e.origins) <= ORIGINS,
                f"{where}: origins must be among {', '.join(sorted(ORIGINS))}",
            )
            probs_ok(e.probs, where)
        elif isinstance(e, Draft):
            tokens_ok(e.tokens, f"{where}.tokens")
            need(
                len(e.tokens) == len(e.parents) == len(e.probs),
                f"{where}: tokens, parents and probs must be equally long",
            )
            need(
                all(-1 <= p < j for j, p in enumerate(e.parents)),
                f"{where}: each parent must be -1 or an earlier node",
            )
            probs_ok(e.probs, where)
            need(
                len(e.tokens) <= MAX_DRAFT_NODES,
                f"{where}: a draft has at most {MAX_DRAFT_NODES} nodes, got {len(e.tokens)}",
            )
            need(step not in drafted, f"{where}: step {step} drafts twice")
            drafted[step] = list(e.parents)
        elif isinstance(e, Verify):
            parents = drafted.get(step, [])
            need(
                all(whole(a, 0, len(parents) - 1) for a in e.accepted),
                f"{where}: accepted nodes must be among the step's {len(parents)} drafted",
            )
            # Acceptance walks down the tree from its root: each node is the previous one's child.
            need(
                all(
                    parents[a] == (e.accepted[j - 1] if j else -1) for j, a in enumerate(e.accepted)
                ),
                f"{where}: accepted nodes must form a path from the draft's root",
            )
            if e.correction is not None:
                tokens_ok([e.correction], f"{where}.correction")
            probs_ok(e.target_probs, where)
        elif isinstance(e, Forward):
            need(
                e.kind in FORWARD_KINDS,
                f"{where}: kind must be among {', '.join(sorted(FORWARD_KINDS))}",
            )
            need(
                whole(e.n_input_tokens, 0, UI_MAX_NEW_TOKENS + len(prompt_ids)),
                f"{where}: bad n_input_tokens",
            )
            need(whole(e.layers, 0, n_layers), f"{where}: layers must be in 0..{n_layers}")
            need(math.isfinite(e.wall_ms) and e.wall_ms >= 0, f"{where}: wall_ms must be >= 0")
        elif isinstance(e, TopK):
            tokens_ok(e.tokens, f"{where}.tokens")
            need(len(e.tokens) == len(e.probs), f"{where}: tokens and probs must be equally long")
            probs_ok(e.probs, where)
        elif isinstance(e, JacobiIteration):
            tokens_ok(e.tokens, f"{where}.tokens")
            need(
                len(e.tokens) == len(e.changed), f"{where}: tokens and changed must be equally long"
            )
            need(
                len(e.tokens) <= MAX_DRAFT_NODES,
                f"{where}: a Jacobi block has at most {MAX_DRAFT_NODES} tokens",
            )
            need(
                whole(e.iteration, 0, len(events)),
                f"{where}: iteration must be a whole number in 0..{len(events)}",
            )
            # The block guesses absolute output positions start, start + 1, ...: those right after
            # what the earlier steps committed (-1: a trace made before the field existed).
            need(
                whole(e.start, -1, n_committed) and e.start in (-1, committed_before[step]),
                f"{where}: start must be the {committed_before[step]} tokens committed before "
                f"step {step} (or -1), got {e.start!r}",
            )
        elif isinstance(e, LookaheadWindow):
            for level in e.levels:
                tokens_ok(level, f"{where}.levels")
            tokens_ok(e.outputs, f"{where}.outputs")
            width = len(e.outputs)
            need(
                all(len(level) == width for level in e.levels),
                f"{where}: every level and the outputs must be equally wide",
            )
            need(
                width <= MAX_DRAFT_NODES and len(e.levels) <= max(NGRAM_SIZES),
                f"{where}: the window is at most {MAX_DRAFT_NODES} wide and "
                f"{max(NGRAM_SIZES)} levels deep",
            )
        elif isinstance(e, NgramPool):
            need(
                whole(e.n, 0, max(NGRAM_SIZES)) and (e.n == 0 or e.n in NGRAM_SIZES),
                f"{where}: n must be in {min(NGRAM_SIZES)}..{max(NGRAM_SIZES)} (or 0), got {e.n!r}",
            )
            for gram in e.added:
                tokens_ok(gram, f"{where}.added")
            for entry in e.top:
                need(
                    len(entry) >= 2 and entry[0] >= 0, f"{where}: top entries are (count, *tokens)"
                )
                tokens_ok(entry[1:], f"{where}.top")
        elif isinstance(e, AttentionMask):
            need(len(e.visible) == len(e.labels), f"{where}: one visible list per label")
            need(
                all(0 <= j < len(e.labels) for row in e.visible for j in row),
                f"{where}: visible indices must be among the {len(e.labels)} inputs",
            )
            tokens_ok(e.input_ids, f"{where}.input_ids")
            need(
                len(e.input_ids) in (0, len(e.labels)) and len(e.branches) in (0, len(e.labels)),
                f"{where}: input_ids and branches must have one entry per label",
            )
        elif isinstance(e, DraftStop):
            probs_ok((e.threshold, e.rate, *e.confidences), where)
            need(
                e.reason in DRAFT_STOP_REASONS,
                f"{where}: reason must be one of {', '.join(sorted(DRAFT_STOP_REASONS))}, "
                f"got {e.reason!r}",
            )
        elif isinstance(e, CopySource):
            # The copy's source must lie in the context the model saw at that step.
            longest = len(prompt_ids) + meta["max_new_tokens"]
            need(
                e.start >= 0 and e.n >= 1 and e.start + e.n <= e.context_len <= longest,
                f"{where}: the copied span must lie within the {e.context_len}-token context",
            )
    need(last_commit >= 0, "the trace has no committed tokens to replay")
    committed = [t for e in events if isinstance(e, Commit) for t in e.tokens]
    need(
        len(committed) <= meta["max_new_tokens"],
        f"the trace commits {len(committed)} tokens, more than its max_new_tokens "
        f"({meta['max_new_tokens']})",
    )
    if "token_ids" in meta:
        need(
            meta["token_ids"] == committed,
            "trace field 'token_ids' differs from the committed tokens",
        )

    # Recompute what the views show rather than trust the file: statistics from the events (with
    # the recorded wall time when it is a plausible number) and no lossless claim.
    done = events[-1] if events and isinstance(events[-1], Done) else None
    recorded = done.stats.get("wall_s") if done else None
    wall = recorded if isinstance(recorded, int | float) and 0 < recorded < 1e6 else None
    body = [e for e in events if not isinstance(e, Done)]
    reason = done.finish_reason if done and done.finish_reason in ("eos", "length") else "cancelled"
    stats = compute_stats(body, wall)
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
        return {
            "status": "n/a",
            "note": "sampling run: lossless in distribution, not token by token",
        }
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
    reference = _cached_reference(bundle, tuple(meta["prompt_ids"]), budget)
    check = compare_tokens(reference, tokens, bundle.exact)
    return {
        "status": "identical" if check.identical else "differs",
        "first_divergence": check.first_divergence,
        "compared": check.compared,
        "rechecked": True,
    }


def stopped(trace: Trace, elapsed_s: float | None = None) -> Trace:
    """A run cut short by Stop, kept so it can be stepped through and exported: its events so far
    and a Done("cancelled") with the statistics of what did happen. A run stopped while its
    greedy check ran keeps its own Done, with the check marked as not done."""
    events = list(trace.events)  # a snapshot: the run may still be appending
    done = next((e for e in events if isinstance(e, Done)), None)
    body = [e for e in events if not isinstance(e, Done)]
    if done is None:
        done = Done("cancelled", compute_stats(body, elapsed_s))
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
