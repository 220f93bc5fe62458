"""The public entry points: `stream()` yields a method's events live; `generate()` consumes them.

Input is validated before any model work, so bad input fails fast with a project error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decoders.core import costs
from decoders.core.base import DecodeConfig, Method
from decoders.core.errors import InvalidInput, InvalidParameter, UnknownMethod
from decoders.core.events import Commit, Done, Event, Forward
from decoders.core.models import ModelBundle, check_window
from decoders.core.params import validate_params
from decoders.core.prices import drafter_key
from decoders.core.stats import StatsAccumulator
from decoders.core.tracefile import trace_to_dict
from decoders.registry import METHODS

MAX_NEW_TOKENS_CAP = int(os.environ.get("DECODING_LAB_MAX_NEW_TOKENS", "2048"))
MAX_PROMPT_CHARS = 64_000


@dataclass
class GenerationResult:
    model_id: str
    method: str
    params: dict[str, Any]
    prompt: str | None
    prompt_ids: list[int]
    max_new_tokens: int
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    prices: dict[str, Any] = field(default_factory=dict)  # the price table its work was priced by

    def trace(self) -> dict[str, Any]:
        """The versioned, self-contained JSON trace of this run."""
        meta = {
            "model": self.model_id,
            "method": self.method,
            "params": self.params,
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "max_new_tokens": self.max_new_tokens,
            "token_ids": self.token_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "stats": self.stats,
            "prices": self.prices,
        }
        return trace_to_dict(meta, self.events)


@dataclass(frozen=True)
class Run:
    """A validated request, ready to decode."""

    bundle: ModelBundle
    method: Method
    prompt: str | None
    prompt_ids: list[int]
    cfg: DecodeConfig


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise UnknownMethod(f"unknown method {name!r}; valid: {', '.join(METHODS)}")
    return METHODS[name]


def check_request(
    prompt: str | Sequence[int],
    method: str,
    max_new_tokens: int,
    params: Mapping[str, Any] | None,
) -> tuple[Method, dict[str, Any]]:
    """The checks that need no model: method, parameters, budget, prompt text."""
    m = get_method(method)
    values = validate_params(m.schema, params or {}, m.name)
    if values.get("beta", 1) > 1 and values.get("temperature", 0.0) > 0:
        raise InvalidParameter(
            f"relaxed verification (beta = {values['beta']}) applies to greedy verification; "
            "sampling keeps the exact rejection rule: set beta = 1 or temperature = 0"
        )
    if values.get("synthetic", 0.0) > 0 and values.get("temperature", 0.0) > 0:
        raise InvalidParameter(
            f"synthetic acceptance (synthetic = {values['synthetic']}) replaces greedy "
            "verification; sampling keeps the exact rejection rule: set synthetic = 0 or "
            "temperature = 0"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise InvalidInput(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS_CAP:
        raise InvalidInput(
            f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}, got {max_new_tokens}"
        )
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InvalidInput("the prompt is empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise InvalidInput(
                f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}"
            )
    return m, values


def prepare(
    bundle: ModelBundle,
    prompt: str | Sequence[int],
    method: str = "autoregressive",
    max_new_tokens: int = 64,
    *,
    chat: bool | None = None,
    detail: bool = True,
    params: Mapping[str, Any] | None = None,
) -> Run:
    """Check everything about a request and encode the prompt; raise InvalidInput with a clear message."""
    m, values = check_request(prompt, method, max_new_tokens, params)
    if isinstance(prompt, str):
        text: str | None = prompt
        prompt_ids = bundle.encode(prompt, chat)
    else:
        text, prompt_ids = None, [int(t) for t in prompt]
        if not prompt_ids:
            raise InvalidInput("the prompt is empty")
        vocab = bundle.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise InvalidInput(f"prompt ids must be in [0, {vocab})")
    if len(prompt_ids) + max_new_tokens > bundle.context_length:
        raise InvalidInput(
            f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({max_new_tokens}) is "
            f"{len(prompt_ids) + max_new_tokens} tokens, longer than the model's context of "
            f"{bundle.context_length} tokens"
        )
    check_window(bundle, len(prompt_ids), max_new_tokens)
    if m.check is not None:
        m.check(bundle, values)
    cfg = DecodeConfig(max_new_tokens, bundle.eos_ids, values, detail)
    return Run(bundle, m, text, prompt_ids, cfg)


def run_events(run: Run) -> Iterator[Event]:
    """Decode, passing every event through, and end with Done(stats)."""
    # its work priced by the model's table (measured the first time, drafters included)
    acc = StatsAccumulator(costs.price_table(run.bundle, price_runs), run.method.name)
    tokens: list[int] = []
    start = time.perf_counter()
    for event in run.method.decode(run.bundle, run.prompt_ids, run.cfg):
        acc.add(event)
        if isinstance(event, Commit):
            tokens.extend(event.tokens)
        yield event
    wall = time.perf_counter() - start
    reason = "eos" if tokens and tokens[-1] in run.bundle.eos_ids else "length"
    yield Done(reason, acc.result(wall))


def stream(
    bundle: ModelBundle,
    prompt: str | Sequence[int],
    method: str = "autoregressive",
    max_new_tokens: int = 64,
    *,
    chat: bool | None = None,
    detail: bool = True,
    **params: Any,
) -> Iterator[Event]:
    """Validate now, then return the live event stream (close it to cancel the run)."""
    return run_events(
        prepare(bundle, prompt, method, max_new_tokens, chat=chat, detail=detail, params=params)
    )


def generate(
    bundle: ModelBundle,
    prompt: str | Sequence[int],
    method: str = "autoregressive",
    max_new_tokens: int = 64,
    *,
    chat: bool | None = None,
    record: bool = True,
    **params: Any,
) -> GenerationResult:
    """Run a method to the end. record=False keeps no events (and skips optional detail), for benchmarks."""
    run = prepare(bundle, prompt, method, max_new_tokens, chat=chat, detail=record, params=params)
    events: list[Event] = []
    tokens: list[int] = []
    done: Done | None = None
    for event in run_events(run):
        if isinstance(event, Commit):
            tokens.extend(event.tokens)
        elif isinstance(event, Done):
            done = event
        if record or isinstance(event, Done):
            events.append(event)
    assert done is not None
    return GenerationResult(
        model_id=bundle.model_id,
        method=run.method.name,
        params=dict(run.cfg.params),
        prompt=run.prompt,
        prompt_ids=run.prompt_ids,
        max_new_tokens=run.cfg.max_new_tokens,
        token_ids=tokens,
        text=bundle.decode(tokens),
        finish_reason=done.finish_reason,
        stats=done.stats,
        events=events,
        prices=costs.price_table(bundle).to_dict(),
    )


# How close two logits must be for a token to count as a float near-tie: batched and one-at-a-time
# forwards add in another order, so the last bits differ and a top-two gap inside that noise may
# flip between them. Measured, the largest batched-vs-incremental logit difference on the
# embedded model (tests/test_cuda.py; docs/GPU.md): float32 5.3e-5 on an H200 with TF32 off (and
# 6.7e-6 on the tiny model on a CPU); bfloat16 0.56 on the H200. The tolerances sit above those
# with room (float16, not measured yet, at bfloat16's scaled by its 3 more mantissa bits).
NEAR_TIE = {"float32": 1e-3, "float16": 0.15, "bfloat16": 1.0}


@dataclass(frozen=True)
class LosslessCheck:
    identical: bool
    first_divergence: int | None  # index into the generated tokens, None when identical
    compared: int
    exact_dtype: bool  # float32: exact; half precision can flip near-ties between batch shapes
    # At the first divergence: greedy's top-two logit gap there, when it was looked at (None: not)
    gap: float | None = None
    tolerance: float | None = None

    @property
    def near_tie(self) -> bool:
        """The first difference falls where greedy's top two tokens were closer than the dtype's
        float noise: a flip between kernel paths, not a wrong verification."""
        return (
            not self.identical
            and self.gap is not None
            and self.tolerance is not None
            and self.gap < self.tolerance
        )

    def describe(self) -> str:
        if self.identical:
            return f"identical to greedy ({self.compared} tokens)"
        if self.near_tie:
            return (
                f"identical up to a float near-tie at generated token {self.first_divergence} "
                f"(greedy's top two logits there are {self.gap:.2g} apart, under the "
                f"{self.tolerance:g} its precision can move)"
            )
        return f"differs from greedy at generated token {self.first_divergence}"


def greedy_reference(
    bundle: ModelBundle, prompt_ids: Sequence[int], max_new_tokens: int
) -> list[int]:
    return generate(
        bundle, list(prompt_ids), "autoregressive", max_new_tokens, record=False
    ).token_ids


def check_lossless(
    bundle: ModelBundle, result: GenerationResult, reference: Sequence[int] | None = None
) -> LosslessCheck:
    """Compare a run's tokens with autoregressive greedy on the same prompt ids and budget; at a
    difference, say whether it falls on a float near-tie (`near_tie_gap`)."""
    if reference is None:
        reference = greedy_reference(bundle, result.prompt_ids, result.max_new_tokens)
    check = compare_tokens(reference, result.token_ids, bundle.exact)
    return with_near_tie(bundle, result.prompt_ids, reference, check)


def with_near_tie(
    bundle: ModelBundle, prompt_ids: Sequence[int], reference: Sequence[int], check: LosslessCheck
) -> LosslessCheck:
    """`check` with greedy's top-two gap at its first divergence, where there is one inside the
    reference (a missing tail has no gap to look at)."""
    k = check.first_divergence
    if check.identical or k is None or k >= len(reference):
        return check
    from dataclasses import replace

    gap = near_tie_gap(bundle, prompt_ids, reference[:k])
    tolerance = NEAR_TIE.get(str(bundle.dtype).replace("torch.", ""), NEAR_TIE["float32"])
    return replace(check, gap=gap, tolerance=tolerance)


def near_tie_gap(bundle: ModelBundle, prompt_ids: Sequence[int], output: Sequence[int]) -> float:
    """Greedy's top-two logit gap for the token after prompt + `output`, one forward."""
    import torch

    ids = torch.tensor([[*prompt_ids, *output]], device=bundle.device)
    with torch.inference_mode():
        logits = bundle.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def compare_tokens(
    reference: Sequence[int], tokens: Sequence[int], exact: bool = True
) -> LosslessCheck:
    for i, (a, b) in enumerate(zip(reference, tokens, strict=False)):
        if a != b:
            return LosslessCheck(False, i, len(tokens), exact)
    if len(reference) != len(tokens):
        return LosslessCheck(False, min(len(reference), len(tokens)), len(tokens), exact)
    return LosslessCheck(True, None, len(tokens), exact)


# The trained drafting heads, each read by a short run on a fixed probe whose drafts follow only
# the head's probabilities (no price sizes them: the token tree keeps its `nodes` most confident).
FINGERPRINT_PROBE = "def mean(values):\n    return sum(values) / len(values)\n"
FINGERPRINT_RUNS = (
    ("token_tree", {"size": "fixed"}),  # the EAGLE head
    ("kangaroo", {}),  # the early-exit adapter
    ("medusa", {}),  # the Medusa heads
)


def has_float(v: object) -> bool:
    """A float, or a tuple holding one at any depth (an event's probabilities)."""
    return isinstance(v, float) or (isinstance(v, tuple) and any(has_float(x) for x in v))


def float_fields(events: Sequence[Event]) -> list[tuple[str, Any]]:
    """Every float a run's events carry but its clock and its prices (draft and target
    probabilities, confidences, exit scores): what a machine's kernels round."""
    from dataclasses import fields

    from decoders.core.events import Priced

    return [
        (f"{e.type}.{f.name}", getattr(e, f.name))
        for e in events
        if not isinstance(e, (Done, Priced, Forward))
        for f in fields(e)
        if has_float(getattr(e, f.name))
    ]


def draft_fingerprint(bundle: ModelBundle, max_new_tokens: int = 16) -> str:
    """What this machine's kernels make of the trained drafting heads (they may draft in
    bfloat16, whose products round differently on AMX tiles, AVX-512 BF16 and other kernels):
    a digest of every probability the heads' short runs on a fixed probe carry. Two machines
    (or thread counts) with the same fingerprint draft the same bits, so a recorded run replays
    step by step; with another, a tree sized by those probabilities may keep other nodes."""
    import hashlib

    digest = hashlib.sha256()
    for method, params in FINGERPRINT_RUNS:
        run = generate(bundle, FINGERPRINT_PROBE, method, max_new_tokens, chat=False, **params)
        digest.update(repr((method, run.token_ids, float_fields(run.events))).encode())
    return digest.hexdigest()[:12]


def calibrate(bundle: ModelBundle, *, again: bool = False) -> costs.PriceTable:
    """This model's price table: stored, or measured now with every drafter's price (`again`:
    measured now whatever is stored, replacing it)."""
    if again:
        return costs.measure(bundle, price_runs)
    return costs.price_table(bundle, price_runs)


PROBE_TOKENS = 20  # each method's runs when a price table is completed (price_runs)
PROBE_ROUNDS = 3


def price_runs(bundle: ModelBundle, table: costs.PriceTable) -> costs.PriceTable:
    """Complete a new price table with what only runs can measure, from every method at its
    defaults on a short probe, PROBE_ROUNDS rounds in turn (after a warm-up run each: a method's
    first run pays its one-time set-up): the forward of each drafter but the target's own first
    k layers (self:k, which the depth rule prices): a trained head, an early exit with its
    adapter, another model (the median of its draft forwards, each over the target's forward of
    as many inputs); then each method's cost beyond its forwards' shapes (`PriceTable.methods`).
    Load only ever slows a run, so each reading keeps its least over the rounds."""
    import dataclasses
    import statistics

    from decoders.core.errors import DecodingLabError
    from decoders.core.events import Commit, Draft

    names = []
    for name in METHODS:
        try:
            generate(bundle, FINGERPRINT_PROBE, name, 4, chat=False)
            names.append(name)
        except DecodingLabError:  # a method this model cannot run (no trained part for it)
            continue
    rounds = [
        {n: generate(bundle, FINGERPRINT_PROBE, n, PROBE_TOKENS, chat=False) for n in names}
        for _ in range(PROBE_ROUNDS)
    ]
    seen: dict[str, list[float]] = {}  # drafter -> its median draft forward, per round
    for runs in rounds:
        this: dict[str, list[float]] = {}
        for run in runs.values():
            pending: list[Forward] = []
            for e in run.events:
                if isinstance(e, Forward) and e.kind == "draft":
                    pending.append(e)
                elif isinstance(e, Draft):
                    key = drafter_key(e.source)
                    if not key.startswith("self:") and e.step > 1:  # past the first shapes
                        this.setdefault(key, []).extend(
                            f.wall_ms / table.forward_ms / table.inputs(f.n_input_tokens)
                            for f in pending
                        )
                    pending = []
        for key, v in this.items():
            if v:  # a drafter whose steps after the first drafted nothing has no reading
                seen.setdefault(key, []).append(statistics.median(v))
    drafters = {k: round(min(v), 5) for k, v in sorted(seen.items())}
    table = dataclasses.replace(table, drafters=drafters)
    methods: dict[str, tuple[float, float]] = {}
    for name in names:
        readings = [r for runs in rounds if (r := _beyond_shapes(runs[name], table, Commit))]
        if readings:
            methods[name] = (min(f for f, _ in readings), min(b for _, b in readings))
    return dataclasses.replace(table, methods=methods)


def _beyond_shapes(
    run: GenerationResult, table: costs.PriceTable, commit: type
) -> tuple[float, float] | None:
    """One run's (forwards' wall time over their priced shapes, time between forwards per
    step, in one-token forwards)."""
    work = StatsAccumulator(table)
    for e in run.events:
        work.add(e)
    priced = work.result()["work"]
    forwards = [e for e in run.events if isinstance(e, Forward) and e.kind != "prefill"]
    steps = sum(1 for e in run.events if isinstance(e, commit) and e.step > 0)
    if not forwards or not steps or not priced:
        return None
    spent = sum(e.wall_ms for e in forwards)
    between = run.stats["wall_s"] * 1000 - run.stats["ttft_s"] * 1000 - spent
    return (
        round(spent / table.forward_ms / priced, 4),
        round(max(0.0, between) / table.forward_ms / steps, 4),
    )
