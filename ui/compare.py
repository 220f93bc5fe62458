"""Compare: several method specs on one prompt, greedy, side by side in one run. No gradio here.

A row is a method spec as the benchmark takes it (`NAME:KEY=VALUE[:KEY=VALUE]`, parsed by
`decoders.bench.parse_method`), so the same method can appear with different settings. Autoregressive
always runs first, in the same run: it is the speed reference (speedup = tokens/s ÷ its tokens/s) and
the lossless reference (every greedy row must reproduce its tokens). One number format everywhere:
ratios with 2 decimals, tokens/s with 1.
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from decoders import METHODS, InvalidInput, compare_tokens, prepare
from decoders.bench import parse_method
from decoders.core import quality
from decoders.core.costs import hold_prices, price_table
from decoders.core.errors import DecodingLabError
from decoders.core.events import Commit, Done, Forward, token_ids
from decoders.core.params import SAMPLING_PARAMS, validate_params
from decoders.core.prices import PriceTable, recorded_prices
from decoders.core.readings import (  # the rules a reading follows, one place each
    explained,
)
from decoders.engine import check_request, run_events, with_near_tie
from decoders.specs import BREAK as SPEC_BREAK
from decoders.specs import spec_of  # parse_spec's inverse, one spelling everywhere

from .compare_text import (  # noqa: F401  (what a comparison says, by its old names too)
    REFERENCE,
    TABLE_HEADERS,
    _clock_sentence,
    _lossy_sentence,
    _measured,
    _speed_sentence,
    _unexplained_sentence,
    headline,
    prices_line,
    table_rows,
)
from .links import check_budget
from .live import Trace, run_meta
from .models import check_draft, get_bundle, token_texts

MAX_SPECS = len(METHODS) + 8  # rows per comparison: every method at its defaults and a few more

MAX_ROUNDS = 5  # runs per spec (a row's speedup: the median of its rounds)
ROUNDS = 3  # the default: a median and a spread from three rounds


# --- specs and presets ----------------------------------------------------------------------------


def paper_spec(name: str) -> str:
    """A method at its paper's settings, spelled with the keys the paper fixes."""
    m = METHODS[name]
    values = m.preset("paper")
    return spec_of(name, {k: values[k] for k in m.presets["paper"]})


DEFAULT_PRESET = "each family at its best"
EVERY_METHOD = "every method at its defaults"


# Derived from the methods' declarations: each family's best (`Method.family_best`), every method at
# its defaults (each at its best on this machine), the papers' settings, then the presets each
# method brings (`Method.compare`).
def _family_bests() -> tuple[str, ...]:
    """Each family's best: the first method in the registry's order to claim it (a copy of a
    method claims what its original does, and the original keeps it)."""
    best: dict[str, str] = {}
    for name, m in METHODS.items():
        if m.family_best:
            best.setdefault(m.family, name)
    return tuple(best.values())


PRESETS: dict[str, tuple[str, ...]] = {
    DEFAULT_PRESET: _family_bests(),
    EVERY_METHOD: tuple(name for name, m in METHODS.items() if m.in_default_compare),
    "the papers' settings": tuple(
        paper_spec(name) for name, m in METHODS.items() if "paper" in m.presets
    ),
    **{label: specs for m in METHODS.values() for label, specs in m.compare.items()},
    "quick look": ("prompt_lookup", "speculative", "lookahead"),
}


def preset_specs(name: str) -> list[str]:
    if name not in PRESETS:
        raise InvalidInput(f"unknown compare preset {name!r}; known: {', '.join(PRESETS)}")
    return list(PRESETS[name])


def split_specs(text: str | Iterable[str]) -> list[str]:
    """Specs from a textbox (one per line) or an API string (comma-separated); blanks dropped."""
    items = [text] if isinstance(text, str) else list(text)
    return [s.strip() for item in items for s in re.split(r"[\n,]", str(item)) if s.strip()]


# A break opportunity after each ':' of a spec: the table wraps its cells, and a long spec
# (calm:confidence=saturation:threshold=0.995) then breaks between its settings, not mid-word.
# parse_spec drops it again, so a spec copied out of the table still parses (decoders.specs).
BREAK = SPEC_BREAK


@dataclass(frozen=True)
class Spec:
    label: str  # as the visitor wrote it (whitespace trimmed)
    method: str
    params: dict[str, Any]  # validated, defaults filled in


def parse_spec(spec: str) -> Spec:
    """Parse and validate one spec; any problem is an InvalidInput that names the spec."""
    label = spec.replace(BREAK, "").strip()
    if not label:
        raise InvalidInput("a method spec is empty")
    try:
        name, raw = parse_method(label)
        name = name.strip()
        if name not in METHODS:
            raise InvalidInput(f"unknown method {name!r}; valid: {', '.join(METHODS)}")
        m = METHODS[name]
        sampling = {p.name for p in SAMPLING_PARAMS} & set(raw)
        if sampling:
            raise InvalidInput(
                f"{sorted(sampling)[0]!r} is a sampling setting; Compare runs greedy (lossless)"
            )
        values = validate_params(m.knobs, {k.strip(): v.strip() for k, v in raw.items()}, name)
        check_draft(values)
    except DecodingLabError as exc:
        message = str(exc).removeprefix(f"method spec {label!r}: ")
        raise InvalidInput(f"method spec {label!r}: {message}") from None
    return Spec(label, name, values)


def parse_specs(specs: str | Iterable[str]) -> list[Spec]:
    """Validate every spec (before any model runs); autoregressive first, duplicates dropped."""
    parsed = [parse_spec(s) for s in split_specs(specs)]
    if not parsed:
        raise InvalidInput("list at least one method spec to compare, e.g. prompt_lookup")
    if len(parsed) > MAX_SPECS:
        raise InvalidInput(f"at most {MAX_SPECS} method specs per comparison, got {len(parsed)}")
    seen: dict[tuple, Spec] = {}
    for s in [parse_spec(REFERENCE), *parsed]:
        key = (s.method, tuple(sorted((k, repr(v)) for k, v in s.params.items())))
        seen.setdefault(key, s)  # the same run twice (e.g. with a default spelled out) runs once
    return list(seen.values())


# --- the comparison -------------------------------------------------------------------------------


@dataclass
class Comparison:
    """The comparison as it stands: one row and one trace per spec run so far (autoregressive
    first); with several rounds, each spec's fastest run."""

    specs: list[Spec]
    rows: list[dict[str, Any]] = field(default_factory=list)
    traces: dict[str, Trace] = field(default_factory=dict)  # by spec label
    runs_done: int = 0
    runs_total: int = 0

    @property
    def done(self) -> bool:
        return self.runs_done == self.runs_total

    @property
    def progress(self) -> str:
        return f"{self.runs_done} of {self.runs_total} runs done"

    @property
    def prices(self) -> PriceTable | None:
        """The price table every run's work here was priced by (the reference's, as recorded)."""
        reference = self.traces.get(self.specs[0].label) if self.specs else None
        return recorded_prices(reference.meta) if reference is not None else None

    def headline(self) -> str:
        if self.done:
            return headline(self.rows)
        return f"So far ({self.progress}): {headline(self.rows)}"


def compare_methods(
    model: str | None,
    prompt: str,
    specs: str | Iterable[str],
    max_new_tokens: int,
    warm_up: bool = True,
    rounds: int = ROUNDS,
) -> Iterator[Comparison]:
    """Run each spec greedily on the same prompt, autoregressive first (the speed and lossless
    reference), yielding the comparison as it stands after each run.

    Every spec is validated and every run prepared (drafters loaded, skip sets checked) before
    the first one starts, so a bad spec costs nothing and no run's clock includes a load. Runs
    skip optional detail events (top-k candidates): what is timed is decoding, not recording.
    With `rounds` > 1 every spec runs that many times, each round in a rotated order with the
    reference in every round (a busy machine's load drifts; rotation spreads the drift over every
    spec), and a row's speedup is the median of its rounds' speedups, each over the reference's
    run in the same round, with their range as its spread; the row shows its fastest run. Every
    run is checked against greedy.
    """
    max_new_tokens = check_budget(max_new_tokens)
    if isinstance(rounds, float) and rounds.is_integer():
        rounds = int(rounds)  # a slider's or a JSON client's 2.0
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise InvalidInput(
            f"rounds must be a whole number between 1 and {MAX_ROUNDS}, got {rounds!r}"
        )
    parsed = parse_specs(specs)
    for s in parsed:
        check_request(prompt, s.method, max_new_tokens, s.params)
    bundle = get_bundle(model)
    runs = {}
    for s in parsed:
        try:
            runs[s.label] = prepare(
                bundle, prompt, s.method, max_new_tokens, params=s.params, detail=False
            )
        except DecodingLabError as exc:
            raise InvalidInput(f"method spec {s.label!r}: {exc}") from None
    total = len(parsed) * rounds
    # No re-measure beside the warm-up or the timed runs, and one already under way (the price
    # measured when the model loaded) ends first: a warm-up beside it would skew the price.
    with hold_prices():
        if warm_up:
            # A spec's first forwards in a process are slow (allocations, a drafter's first use,
            # a draft length's first shapes): a few tokens of each spec first, so no row pays for
            # them and the reference is not made slow by going first. parse_specs already dropped
            # duplicate settings, so each distinct spec warms once; like the timed runs, no detail.
            for s in parsed:
                warm = prepare(
                    bundle, prompt, s.method, min(4, max_new_tokens), params=s.params, detail=False
                )
                for _ in run_events(warm):
                    pass
        yield from _rounds(bundle, parsed, runs, prompt, max_new_tokens, rounds, total)


def _rounds(bundle, parsed, runs, prompt: str, max_new_tokens: int, rounds: int, total: int):
    """compare_methods' timed rounds (see there)."""
    best: dict[str, Trace] = {}  # each spec's fastest run so far
    diverged: dict[str, int] = {}  # a spec whose run (any round) left greedy: where
    ties: dict[str, int] = {}  # ... only at a float near-tie (engine.NEAR_TIE): where
    n_runs: dict[str, int] = {}  # runs so far per spec (a spec later in this round has one fewer)
    ratios: dict[str, list[float]] = {}  # each round's speed over the reference's in that round
    rate: dict[tuple[int, str], float] = {}  # (round, spec) -> tokens/s
    done = 0
    for k in range(rounds):
        shift = k % len(parsed)
        for spec in parsed[shift:] + parsed[:shift]:
            trace = _timed(bundle, spec, runs[spec.label], prompt, max_new_tokens)
            done += 1
            n_runs[spec.label] = n_runs.get(spec.label, 0) + 1
            rate[k, spec.label] = trace.stats["tokens_per_s"]
            ref_rate = rate.get((k, parsed[0].label))
            if ref_rate:  # the reference has run in this round: pair every run of the round
                for p in parsed:
                    if (k, p.label) in rate and len(ratios.get(p.label, ())) <= k:
                        ratios.setdefault(p.label, []).append(rate[k, p.label] / ref_rate)
            if spec is not parsed[0]:  # the reference ran first in round 1
                reference = best[parsed[0].label].token_ids
                check = compare_tokens(reference, trace.token_ids, bundle.exact)
                if not check.identical:  # a float near-tie that flipped is no broken method
                    check = with_near_tie(bundle, trace.meta["prompt_ids"], reference, check)
                    found = ties if check.near_tie else diverged
                    found.setdefault(spec.label, check.first_divergence or 0)
            if spec.label not in best or _faster(trace, best[spec.label]):
                best[spec.label] = trace
            shown = [p for p in parsed if p.label in best]
            rows = [
                _row(
                    p, best[p.label], best[parsed[0].label], diverged, ties, n_runs[p.label], bundle
                )
                | _spread(ratios.get(p.label, []), p is parsed[0])
                for p in shown
            ]
            for r in rows:
                r["explained"] = explained(r)
            for r in rows:
                best[r["method"]].meta["lossless"] = r["lossless"]
            yield Comparison(parsed, rows, {p.label: best[p.label] for p in shown}, done, total)


def _spread(ratios: list[float], is_reference: bool) -> dict[str, Any]:
    """A spec's speedup over the rounds (each round's run over the reference's run in the same
    round), once there are two: their median, and their range as its spread."""
    if is_reference or len(ratios) < 2:
        return {"speedup_range": None}
    return {
        "speedup": round(statistics.median(ratios), 2),
        "speedup_range": (round(min(ratios), 2), round(max(ratios), 2)),
    }


def work_of(trace: Trace) -> str:
    """What a run did, apart from its clock: its tokens and every forward's kind, inputs and
    depth. Two runs with the same work cost the same; only noise tells their times apart."""
    forwards = [
        (e.kind, e.n_input_tokens, e.layers, e.split, e.shallow)
        for e in trace.events
        if isinstance(e, Forward)
    ]
    digest = hashlib.sha1(repr((trace.token_ids, forwards)).encode()).hexdigest()
    return digest[:12]


def _faster(a: Trace, b: Trace) -> bool:
    return a.stats["tokens_per_s"] > b.stats["tokens_per_s"]


def _timed(bundle: Any, spec: Spec, run: Any, prompt: str, max_new_tokens: int) -> Trace:
    """One run of one spec, recorded as a Trace with each commit's arrival time."""
    trace = Trace({**run_meta(bundle, run, prompt), "spec": spec.label})
    # When each commit arrived, from the run's start: the race is drawn against this clock, so
    # its lines end where the table's tokens/s says (forward time alone leaves out the drafting
    # work between forwards).
    commit_s: list[float] = []
    start = time.perf_counter()
    for event in run_events(run):
        if isinstance(event, Commit):
            commit_s.append(time.perf_counter() - start)
        trace.events.append(event)
    tokens = trace.token_ids
    # Every token a view may name (the lookahead window and pool, Jacobi blocks, the tree mask's
    # inputs), as the Run tab keeps them, not only commits and drafts.
    ids = set(run.prompt_ids) | {t for e in trace.events for t in token_ids(e)}
    trace.texts = token_texts(bundle, ids)
    done = next(e for e in reversed(trace.events) if isinstance(e, Done))
    trace.meta.update(
        token_ids=tokens,
        text=bundle.decode(tokens),
        stats=done.stats,
        finish_reason=done.finish_reason,
        commit_s=[round(t, 5) for t in commit_s],
    )
    return trace


def _row(
    spec: Spec,
    trace: Trace,
    reference: Trace,
    diverged: Mapping[str, int],
    ties: Mapping[str, int],
    runs: int,
    bundle: Any,
) -> dict[str, Any]:
    s = trace.stats
    base = reference.stats["tokens_per_s"] or 1.0
    is_ref = trace is reference
    check = compare_tokens(reference.token_ids, trace.token_ids, bundle.exact)
    first = diverged.get(spec.label, check.first_divergence)
    identical = check.identical and spec.label not in diverged
    accept = s.get("mean_acceptance_length")
    # As the Run tab says: in half precision a different batch shape can flip a near-tie, so a
    # difference there is not by itself a broken method.
    caveat = (
        None
        if check.exact_dtype
        else f"{bundle.dtype} on {bundle.device}: near-ties can flip between batch shapes"
    )
    lossy = not METHODS[spec.method].claims_lossless(spec.params)
    q = quality.compare(reference.token_ids, trace.token_ids) if lossy and not is_ref else None
    if is_ref:
        lossless = "reference"
    elif q is not None:  # lossy: never a tick, even when it happened to match
        lossless = f"≈ lossy: {100 * q.agreement:.0f}% agree" + (
            "" if q.first_difference is None else f", differs at token {q.first_difference}"
        )
    elif identical:
        lossless = "✓ identical"
    elif spec.label in ties and spec.label not in diverged:  # counted apart, said as such
        lossless = f"≈ identical up to a float near-tie at token {ties[spec.label]}"
    else:
        lossless = f"✗ differs at token {first}" + ("" if caveat is None else " (half precision)")
    return {
        "method": spec.label,
        "name": spec.method,
        "tokens_per_s": round(s["tokens_per_s"], 1),
        "speedup": 1.0 if is_ref else round(s["tokens_per_s"] / base, 2),
        "tokens_per_target_forward": round(s["tokens_per_target_forward"], 2),
        "mean_acceptance_length": None if accept is None else round(accept, 2),
        "new_tokens": s["new_tokens"],
        "wall_s": s["wall_s"],
        "runs": runs,
        "work": work_of(trace),
        "identical": identical,
        "near_tie": not identical and spec.label in ties and spec.label not in diverged,
        "lossy": lossy,
        "first_divergence": None if identical else first,
        "lossless": lossless,
        "caveat": caveat,
        # quality against greedy (exact rows: 1 when identical) and compute, for the quality chart
        "agreement": q.agreement if q is not None else float(identical),
        "rouge_l": q.rouge_l if q is not None else float(identical),
        "layers_per_token": s.get("layers_per_token"),
        "exit_depth": s.get("exit_depth"),
        # the work priced by the price table, against the reference's: what verdicts decide on
        "modelled_speedup": 1.0 if is_ref else s.get("modelled_speedup"),
        "price_error": price_table(bundle).spread,
    }


# Short, and broken at spaces only, so the whole table fits beside the form at 1440 px (the row
# dicts keep the long names).
# The verdict beside the speed, so both read without scrolling on a narrow table.
def remeasure_prices(model: str | None) -> PriceTable:
    """Measure the model's price table again now (after any comparison timing its rounds) and
    keep it for every later run."""
    from decoders.engine import calibrate

    return calibrate(get_bundle(model), again=True)
