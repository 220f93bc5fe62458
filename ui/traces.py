"""Trace files: checked for meaning, not just form, their lossless badge recomputed rather than
trusted; and the cold page's example trace. No gradio here."""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from decoders import METHODS
from decoders.core.errors import DecodingLabError, TraceError
from decoders.core.events import (
    AttentionMask,
    CatchUp,
    Commit,
    CopySource,
    Done,
    Draft,
    DraftStop,
    Forward,
    ForwardKind,
    HeadProposals,
    JacobiIteration,
    LayerExit,
    LookaheadWindow,
    MaskGroups,
    MaskPredictStep,
    NgramPool,
    Origin,
    Prefill,
    TopK,
    Verify,
)
from decoders.core.models import loaded
from decoders.core.params import validate_params
from decoders.core.stats import compute_stats
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


ORIGINS = frozenset(typing.get_args(Origin))
EXIT_RULES = ("confidence", "hash")
FORWARD_KINDS = frozenset(typing.get_args(ForwardKind))
MAX_LAYERS = 1024
MAX_VOCAB = 10_000_000
# A prompt's tokens: no more than the engine's prompt limit in characters (a token is >= 1 of them).
MAX_PROMPT_IDS = MAX_PROMPT_CHARS
# The largest draft any method proposes in one step: lookahead's pool trie, G ≤ 16 candidates of
# N − 1 ≤ 11 tokens (token_tree: MAX_NODES = 64 grown + a 32-token copied branch).
MAX_DRAFT_NODES = 16 * 11
DRAFT_STOP_REASONS = frozenset({"confidence", "max_draft", "eos", "budget", "cost"})
MAX_HEADS = 16  # Medusa heads' guesses: rows (heads) and columns (ranks) per step
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

    def position_ok(position: int, step: int, where: str) -> None:
        """An output position an event names: the tokens the earlier steps committed."""
        need(
            position == committed_before[step],
            f"{where}: position must be the {committed_before[step]} tokens committed before "
            f"step {step}, got {position!r}",
        )

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
    exited: set[int] = set()  # steps with a LayerExit
    caught: set[int] = set()  # steps with a CatchUp
    left_early: set[int] = set()  # output positions whose LayerExit left before the last layer
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
            need(
                set(e.relaxed) <= set(e.accepted),
                f"{where}: relaxed nodes must be among the accepted ones",
            )
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
        elif isinstance(e, HeadProposals):
            need(
                len(e.heads) == len(e.probs) <= MAX_HEADS
                and all(
                    len(t) == len(p) <= MAX_HEADS for t, p in zip(e.heads, e.probs, strict=True)
                ),
                f"{where}: heads and probs must have the same shape, at most "
                f"{MAX_HEADS} x {MAX_HEADS}",
            )
            for row in e.heads:
                tokens_ok(row, f"{where}.heads")
            probs_ok(tuple(p for row in e.probs for p in row), where)
            # Head 1 guesses the first position after what the earlier steps committed.
            position_ok(e.position, step, where)
        elif isinstance(e, LayerExit):
            need(
                whole(e.n_layers, 1, MAX_LAYERS)
                and ("n_layers" not in meta or e.n_layers == n_layers)
                and whole(e.layer, 1, e.n_layers),
                f"{where}: layer must be in 1..n_layers, the model's {n_layers} layers",
            )
            need(
                list(e.layers) == sorted(set(e.layers))
                and all(whole(ell, 1, e.n_layers - 1) for ell in e.layers)
                and len(e.confidences) == len(e.layers),
                f"{where}: layers must rise within 1..{n_layers - 1}, one confidence each",
            )
            probs_ok((*e.confidences, e.threshold), where)
            need(e.rule in EXIT_RULES, f"{where}: rule must be one of {', '.join(EXIT_RULES)}")
            need(step not in exited, f"{where}: step {step} exits twice")
            exited.add(step)
            if e.layer < e.n_layers:
                left_early.add(e.position)
            position_ok(e.position, step, where)
        elif isinstance(e, CatchUp):
            need(
                len(e.positions) == len(e.agreed) > 0
                and list(e.positions) == sorted(set(e.positions))
                and all(whole(x, 0, committed_before[step] - 1) for x in e.positions),
                f"{where}: positions must be earlier output tokens, rising, one agreed flag each",
            )
            need(
                set(e.positions) <= left_early,
                f"{where}: positions must be tokens that left at an early exit",
            )
            probs_ok((e.threshold,), where)
            need(step not in caught, f"{where}: step {step} catches up twice")
            caught.add(step)
        elif isinstance(e, MaskPredictStep):
            tokens_ok(e.tokens, f"{where}.tokens")
            probs_ok(e.probs, where)
            width = len(e.tokens)
            need(
                len(e.probs) == width <= MAX_DRAFT_NODES,
                f"{where}: tokens and probs must be equally long, at most {MAX_DRAFT_NODES}",
            )
            need(
                all(whole(j, 0, width - 1) for j in (*e.updated, *e.remasked)),
                f"{where}: updated and remasked must be positions in the block (0..{width - 1})",
            )
            need(
                whole(e.iteration, 0, MAX_DRAFT_NODES),
                f"{where}: iteration must be a whole number in 0..{MAX_DRAFT_NODES}",
            )
            position_ok(e.position, step, where)
        elif isinstance(e, MaskGroups):
            tokens_ok(e.candidates, f"{where}.candidates")
            tokens_ok(e.guesses, f"{where}.guesses")
            need(
                len(e.groups) == len(e.probs) <= MAX_DRAFT_NODES
                and all(
                    len(t) == len(p) <= MAX_DRAFT_NODES
                    for t, p in zip(e.groups, e.probs, strict=True)
                )
                and len(e.candidates) <= MAX_DRAFT_NODES,
                f"{where}: groups and probs must have the same shape, at most "
                f"{MAX_DRAFT_NODES} x {MAX_DRAFT_NODES}",
            )
            for row in e.groups:
                tokens_ok(row, f"{where}.groups")
            probs_ok(tuple(p for row in e.probs for p in row), where)
            need(
                whole(e.handed, -1, max(0, len(e.groups) - 1)),
                f"{where}: handed must name one of the {len(e.groups)} groups",
            )
            position_ok(e.position, step, where)
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
