"""The guided tour: an ordered set of stops for a class, each a recorded run of the embedded model
opened at its most telling step, with a short narration and the one thing to look at marked on
the figure. No gradio here (ui/tour_tab.py draws it), and no model compute but the trained
heads' fingerprint (`draft_fingerprint`, asked for when a live run differs from its recording):
the runs are recorded by `python scripts/make_tour.py` into assets/tour/, and
`tests/test_tour.py` re-runs every stop against the current decoders, so a recording cannot go
stale.

How a stop's step is chosen is a rule, said on the page beside the figure (`Stop.rule`) and
computed from the trace's events (`Stop.pick`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from decoders import METHODS
from decoders.core import facts
from decoders.core.base import TourStop
from decoders.core.events import (
    Commit,
    Done,
    Draft,
    Event,
    LayerExit,
    MaskPredictStep,
    Prefill,
    Priced,
    Verify,
)
from decoders.core.readings import fmt_share
from decoders.engine import has_float
from decoders.specs import spec_of

from .live import Trace
from .traces import EXAMPLE_PROMPTS

TOUR = Path(__file__).resolve().parents[1] / "assets" / "tour"
PROMPT = EXAMPLE_PROMPTS[0]  # code that repeats its prompt's names: every family has work to do
BUDGET = 48
SIDE_BY_SIDE = "side_by_side"  # the comparison stop's file: a Compare of every stop's run
TRANSLATION = "translation"  # the stop after it: the Translation lab (decoders/seq2seq)
TRANSLATION_SOURCE = "w3 w1 w4 w15 w9 w2"  # its sentence (task `modes`)
ROUNDS = 3  # the recorded Compare's rounds (each speedup a median with its spread)

# --- step rules -------------------------------------------------------------------------------


def _steps(trace: Trace) -> list[int]:
    return sorted({e.step for e in trace.events if isinstance(e, Commit) and e.step > 0})


def most_committed(trace: Trace) -> int:
    """The first step that committed the most tokens."""
    commits = [e for e in trace.events if isinstance(e, Commit) and e.step > 0]
    best = max(commits, key=lambda e: len(e.tokens), default=None)
    return best.step if best else trace.last_step


def least_sure(trace: Trace) -> int:
    """The step whose token the model was least sure of (its lowest probability)."""
    commits = [e for e in trace.events if isinstance(e, Commit) and e.step > 0 and e.probs]
    best = min(commits, key=lambda e: min(e.probs), default=None)
    return best.step if best else trace.last_step


def copied_won(trace: Trace) -> int:
    """The step where the most accepted tokens were copied from the context; else the most
    committed."""
    verdicts = {e.step: e for e in trace.events if isinstance(e, Verify)}
    scored = [
        (len([a for a in verdicts[d.step].accepted if a in set(d.copied)]), -d.step)
        for d in trace.events
        if isinstance(d, Draft) and d.copied and d.step in verdicts
    ]
    best = max(scored, default=(0, 0))
    return -best[1] if best[0] else most_committed(trace)


def most_relaxed(trace: Trace) -> int:
    """The step where the relaxed rule accepted the most drafts the exact rule would have
    rejected; else the most committed."""
    scored = [(len(e.relaxed), -e.step) for e in trace.events if isinstance(e, Verify)]
    best = max(scored, default=(0, 0))
    return -best[1] if best[0] else most_committed(trace)


def shallowest_exit(trace: Trace) -> int:
    """The step whose token left the model earliest; ties: the last such step (more of the
    heatmap drawn)."""
    exits = [e for e in trace.events if isinstance(e, LayerExit)]
    best = min(exits, key=lambda e: (e.layer, -e.step), default=None)
    return best.step if best else trace.last_step


def most_refilled(trace: Trace) -> int:
    """The block where refinement changed the most tokens (a re-masked token came back as a
    different one); ties: the first."""
    fills: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for e in trace.events:
        if isinstance(e, MaskPredictStep):
            fills.setdefault(e.step, []).append((e.iteration, e.tokens))
    changed = {
        step: sum(
            a != b
            for (_, before), (_, after) in itertools.pairwise(rows)
            for a, b in zip(before, after, strict=False)
        )
        for step, rows in ((s, sorted(r)) for s, r in fills.items())
    }
    if not changed:
        return most_committed(trace)
    return max(changed, key=lambda s: (changed[s], -s))


# --- the stops --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stop:
    """One stop: a recorded run (`key`.json in assets/tour/) of `method` with `params` on the
    tour's prompt, the narration, the one thing to look at, and the step rule."""

    key: str
    chapter: str
    title: str
    method: str
    narration: str
    look: str
    pick: Callable[[Trace], int]
    rule: str
    params: Mapping[str, Any] = field(default_factory=dict)
    # Legend entries (their names contain one of these) kept bright; the rest of the figure is
    # dimmed, so the eye goes where `look` says. Empty: nothing dimmed.
    focus: tuple[str, ...] = ()
    # Another stop's recorded run, shown at another step (the token tree's two stops).
    same_run_as: str = ""
    # The method's view the stop draws (by name, one of its declared views); "": its first.
    view: str = ""
    # Its drafts come from a trained head (EAGLE, Kangaroo's adapter, Medusa's heads), which may
    # draft in bfloat16: a machine whose kernels round it otherwise (another draft_fingerprint)
    # grows other trees from the same heads, lossless all the same.
    head_drafted: bool = False
    ask: str = ""  # predict, then reveal: the question ("" = none)
    conceal: tuple[str, ...] = ()  # the legend entries hidden until the reveal

    @property
    def recording(self) -> str:
        return self.same_run_as or self.key

    @property
    def path(self) -> Path:
        return TOUR / f"{self.recording}.json"


BOTTLENECK = "1 · One token per forward"
GUESS = "2 · Guess and check"
TREE = "3 · Many guesses checked at once"
NO_DRAFTER = "4 · Guessing without a drafter"
SELF = "5 · The model drafts for itself"


def _lossy_chapter() -> str:
    """The lossy chapter's title, from what its runs showed in the side-by-side recording: how
    many of them were faster than plain decoding (by the verdict rule, on modelled speedups)."""
    rows = facts.tour_rows()
    lossy = [r for r in rows.values() if r.get("lossy")]
    faster = [r for r in lossy if facts.said(r, rows) == facts.SAID["faster"]]
    return f"6 · Giving up exactness: {len(faster)} of {len(lossy)} faster here"


LESS = _lossy_chapter()
ALL = "7 · All of them side by side"
BEYOND = "8 · Beyond language models: translation"

CHAPTERS = {
    "bottleneck": BOTTLENECK,
    "guess": GUESS,
    "tree": TREE,
    "no_drafter": NO_DRAFTER,
    "self": SELF,
    "lossy": LESS,
}
# The rules a stop may name for its telling step, each said on the page beside the figure.
RULES: dict[str, tuple[Callable[[Trace], int], str]] = {
    "most_committed": (most_committed, "the step that committed the most tokens"),
    "least_sure": (least_sure, "the step whose token the model was least sure of"),
    "copied_won": (
        copied_won,
        "the step where the most accepted tokens were copied from the context",
    ),
    "most_relaxed": (
        most_relaxed,
        "the step where the relaxed rule accepted the most drafts the exact rule would reject",
    ),
    "shallowest_exit": (shallowest_exit, "the step whose token left the model earliest"),
    "most_refilled": (most_refilled, "the block where refilling changed the most tokens"),
}


def _stop(name: str, s: TourStop) -> Stop:
    """A declared stop, as the tour draws it (its chapter's title, its rule's function)."""
    if s.chapter not in CHAPTERS or s.rule not in RULES:
        raise ValueError(f"{name}: tour stop {s.title!r} names no chapter or rule of the tour")
    pick, rule = RULES[s.rule]
    return Stop(
        s.key or name,
        CHAPTERS[s.chapter],
        s.title,
        name,
        s.narration,
        s.look,
        pick,
        rule,
        s.params,
        s.focus,
        s.same_run_as,
        s.view,
        s.head_drafted,
        s.ask,
        s.conceal,
    )


def _recorded_specs() -> set[str] | None:
    """The runs the side-by-side recording holds, as specs (None: no recording to read)."""
    try:
        return {str(r["method"]) for r in side_by_side()["rows"]}
    except (OSError, ValueError, KeyError):
        return None


def _stops() -> tuple[tuple[Stop, ...], tuple[Stop, ...]]:
    """(every declared stop, the recorded ones), in the lesson's order: chapter, then place. A
    stop is recorded when the side-by-side recording holds its run (a stop shown at another
    stop's recording: that stop's run, of the same method); a method added since joins once
    `python scripts/make_tour.py` has recorded it. Two stops with one key (a copied method's
    copied stop): a recorded one keeps it, else the first."""
    found = sorted(
        ((name, s) for name, m in METHODS.items() for s in m.tour),
        key=lambda d: (list(CHAPTERS).index(d[1].chapter), d[1].place, d[0]),
    )
    stops = [_stop(name, s) for name, s in found]
    specs = _recorded_specs()

    def recorded(stop: Stop) -> bool:
        run = next((o for o in stops if o.method == stop.method and o.key == stop.recording), None)
        return run is not None and (specs is None or spec_of_stop(run) in specs)

    kept: dict[str, Stop] = {}
    for stop in sorted(stops, key=lambda st: not recorded(st)):  # stable: lesson order within
        kept.setdefault(stop.key, stop)
    declared = tuple(s for s in stops if kept.get(s.key) is s)
    return declared, tuple(s for s in declared if recorded(s))


# A tour stop's "Run it live", per browser session: the stop whose rule the run opens at.
LIVE: dict[str | None, str] = {}


def forget(session: str | None) -> None:
    """A page closed: drop its pending live run's stop."""
    LIVE.pop(session, None)


@dataclass(frozen=True)
class Opened:
    """Where a finished run opens: its step, the rule that chose it (said beside it), a note on
    the run, and what its figure marks (a tour stop's focus, in the stop's view)."""

    step: int
    why: str
    note: str = ""
    focus: tuple[str, ...] = ()
    view: str = ""


def tour_step(session: str | None, trace: Trace) -> Opened | None:
    """For the live run a tour stop asked for (once): the step its rule picks in this run, the
    rule, how the run compares with the stop's recording (`replay_note`) and the stop's focus,
    when the run is that stop's method; else None (the run's telling step: `telling`)."""
    key = LIVE.pop(session, None)
    stop = next((s for s in STOPS if s.key == key), None)
    if stop is None or trace.meta.get("method") != stop.method or not trace.token_ids:
        return None
    return Opened(
        stop.pick(trace),
        f"the tour stop's rule, {stop.rule}",
        replay_note(stop, trace),
        stop.focus,
        stop.view,
    )


def decisions(events: Sequence[Event]) -> list[tuple]:
    """What a run decided, without its clock or its floats: every event's whole-number and
    text fields (tokens, tree shapes, accepted paths, origins, exits), Forward's kind, inputs
    and layers included; timings, probabilities and prices left out. Two runs that decided the
    same replay step for step."""
    out = []
    for e in events:
        if isinstance(e, (Done, Priced, Prefill)):
            continue
        kept = tuple(
            (f.name, getattr(e, f.name))
            for f in fields(e)
            if not has_float(getattr(e, f.name))  # a Forward's wall_ms too
        )
        out.append((e.type, kept))
    return out


def replay_note(stop: Stop, trace: Trace) -> str:
    """A live run of a stop against its recording: the same steps, or why not (this machine's
    prices size the tree otherwise; its kernels round the heads' bfloat16 otherwise)."""
    was = recorded(stop.recording)
    if decisions(trace.events) == decisions(was.events):
        return "It took the same steps as the tour's recording."
    why = []
    if [e for e in trace.events if isinstance(e, Priced)] != [
        e for e in was.events if isinstance(e, Priced)
    ]:
        why.append(
            "this machine prices a forward's inputs otherwise, so drafts are sized otherwise"
        )
    if stop.head_drafted and draft_fingerprint() != side_by_side().get("draft_fingerprint"):
        why.append(
            "this machine rounds bfloat16 differently, so the trained head's draft "
            "probabilities move in their last bits and the tree keeps other nodes"
        )
    because = f": {'; and '.join(why)}" if why else ""
    return (
        f"It took other steps than the tour's recording{because}. Its output is checked "
        "against greedy all the same."
    )


@cache
def recorded(key: str) -> Trace:
    """A stop's recorded run (checked as an imported trace is, once per process)."""
    from .traces import check_trace

    stop = next(s for s in STOPS if s.key == key)
    raw = stop.path.read_text()
    claim = json.loads(raw).get("lossless") or {}
    trace = check_trace(Trace.from_json(raw))
    status = claim.get("status")
    said = {
        "identical": f"identical to greedy ({claim.get('compared')} tokens)",
        "lossy": f"lossy: {claim.get('note') or 'differs from greedy'}",
    }.get(str(status), str(status or "no claim"))
    trace.meta["lossless"] = {
        **claim,
        "status": "not checked" if status == "identical" else status or "not checked",
        "note": f"recorded: {said}; the test suite re-runs it against greedy",
    }
    return trace


@cache
def side_by_side() -> dict[str, Any]:
    """The recorded Compare of every stop's run: {"rows": [...], "rounds": n, "machine": ...}."""
    return json.loads((TOUR / f"{SIDE_BY_SIDE}.json").read_text())


def side_by_side_row(stop: Stop) -> dict[str, Any] | None:
    """The side-by-side recording's row of a stop's run: its speed against the one reference
    every stop shares (a stop's own recording was timed alone)."""
    spec = spec_of_stop(next(s for s in STOPS if s.key == stop.recording))
    return next((r for r in side_by_side()["rows"] if r["method"] == spec), None)


def here_sentence(stop: Stop) -> str:
    """What the stop's run showed in the side-by-side recording, said plainly: faster or slower
    than plain decoding (the verdict rule, on its modelled speedup), both speeds, and for a lossy
    method how much of its output agreed with greedy's."""
    row = side_by_side_row(stop)
    if row is None or row["method"] == facts.REFERENCE:
        return ""
    verdict = facts.said(row, facts.tour_rows())
    said = f"In the side-by-side recording it was {verdict} plain decoding ({facts.speeds(row)}"
    measured = float(row["speedup"])
    if (verdict == facts.SAID["faster"] and measured < 1) or (
        verdict == facts.SAID["slower"] and measured > 1
    ):  # the verdict is the work's; say where the clock's median fell on the other side
        said += "; its measured median fell on the other side of 1×, within the model's error"
    said += ")"
    if row.get("lossy"):
        said += f", and {fmt_share(row['agreement'])} of its output agreed with greedy's"
        if row.get("first_divergence") is not None:
            said += f" (the first difference at token {row['first_divergence']})"
    return said + "."


def drafting_dtype() -> str:
    """The dtype trained drafting heads run in on this machine beside the float32 target
    (packing.draft_dtype), as side_by_side records it (for the reader: what decides whether a
    recording replays is `draft_fingerprint`, not the dtype's name)."""
    import torch

    from decoders.core.packing import draft_dtype

    return str(draft_dtype(torch.device("cpu"), torch.float32)).removeprefix("torch.")


@cache
def draft_fingerprint() -> str:
    """This process's fingerprint of the embedded model's trained heads (engine.draft_fingerprint,
    a few short runs, once): side_by_side records the recording machine's, and a head-drafted stop
    replays step by step only where the two agree."""
    from decoders.core.models import EMBEDDED_ID
    from decoders.engine import draft_fingerprint as fingerprint

    from .models import get_bundle

    return fingerprint(get_bundle(EMBEDDED_ID))


def pin_prices(trace: Trace) -> None:
    """Price the embedded model by the table `trace` was priced by (in this process only): a
    tree sized by cost then grows the same trees as when it was recorded (the tour's comparison,
    and the test that re-runs each stop)."""
    from decoders.core import costs
    from decoders.core.models import EMBEDDED_ID
    from decoders.core.prices import recorded_prices

    from .models import get_bundle

    table = recorded_prices(trace.meta)
    if table is not None:
        costs.set_table(get_bundle(EMBEDDED_ID), table)


def spec_of_stop(stop: Stop) -> str:
    """The stop's run as a Compare spec (`name:key=value`, decoders.specs' spelling)."""
    return spec_of(stop.method, stop.params)


def telling(trace: Trace) -> Opened | None:
    """A run's telling step by its method's tour rule (the first stop it declares, recorded or
    not; with that stop's focus); None for a method with no stop, or a run with no tokens."""
    stop = next((s for s in DECLARED if s.method == trace.meta.get("method")), None)
    if stop is None or not trace.token_ids:
        return None
    return Opened(
        stop.pick(trace), f"{stop.rule} (this method's telling step)", "", stop.focus, stop.view
    )


# What `scripts/make_tour.py` records, and the tour (the recorded ones), in the lesson's order.
DECLARED, STOPS = _stops()

# The 15-minute lesson: eight stops, a class's minutes at each (the rest of the tour is the full
# path). By stop key; a key the tour does not hold (a method removed) is left out.
LESSON_MINUTES: dict[str, float] = {
    "autoregressive": 1.5,
    "prompt_lookup": 2,
    "speculative": 2.5,
    "token_tree": 2,
    "jacobi": 2,
    "kangaroo": 1.5,
    "calm": 1.5,
    SIDE_BY_SIDE: 2,
}
