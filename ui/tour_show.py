"""What a tour stop shows (ui/tour.py's stops, drawn by ui/tour_tab.py): its narration, the
figure at a step, the recorded tokens and metrics, the question of a stop that asks one; the two
paths through the tour (the 15-minute lesson, every stop), and the links that open a stop at a
step. No gradio here."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from decoders.core.events import Event
from decoders.core.facts import UnknownFact, fill, lossless_leaders, speeds
from decoders.core.readings import fmt_ratio
from visualizer import method_panel, metrics_html, token_spans_html
from visualizer.compare_views import quality_chart, speedup_chart

from .glossary import annotate
from .run_views import views_of
from .tour import (
    ALL,
    BEYOND,
    LESSON_MINUTES,
    SIDE_BY_SIDE,
    STOPS,
    TRANSLATION,
    TRANSLATION_SOURCE,
    here_sentence,
    recorded,
    side_by_side,
    side_by_side_row,
)
from .tour_marks import mark, question

KEYS = [s.key for s in STOPS] + [SIDE_BY_SIDE, TRANSLATION]
CHOICES = [(f"{i + 1}. {s.title}", s.key) for i, s in enumerate(STOPS)] + [
    (f"{len(STOPS) + 1}. All of them side by side", SIDE_BY_SIDE),
    (f"{len(STOPS) + 2}. Translation: several right answers", TRANSLATION),
]
TRANSLATION_NARRATION = """### Translation: when there is more than one right answer

Everything so far kept the model's own answer. Non-autoregressive *translation* writes every
word of a sentence in one pass, and meets a problem the drafters never do: a sentence with
several right translations. In this toy task each word has two synonyms (register a or b, one
register per sentence) and the words may also run in reverse: four right answers. A vanilla
NAT's positions each choose alone, so they mix them. Below, six small translation models
trained here, each with its remedy.

<div class='dl-look'>👀 <b>Look at</b>: the vanilla NAT's row — a-words and b-words in one
sentence, marked — then distillation's row, and the chart: Mask-Predict climbing with each
extra pass.</div>

**Run it live** opens the Translation lab, where you can type your own sentence."""


def _where(key: str, chapter: str, lesson: bool) -> str:
    """The stop's place: its number on the tour, its chapter, and on the lesson its place there
    and a class's minutes at it."""
    said = f"Stop {number(key)} of {len(KEYS)} · {chapter}"
    keys = path(True)
    if lesson and key in keys:
        said += f" · lesson {keys.index(key) + 1} of {len(keys)}, {_minutes(LESSON_MINUTES[key])}"
    return f"<div class='dl-tour-where'>{said}</div>\n\n"


def _narration(
    key: str, at: int | None = None, last: int | None = None, lesson: bool = False
) -> str:
    n = KEYS.index(key) + 1
    if key == TRANSLATION:
        return _where(key, BEYOND, lesson) + TRANSLATION_NARRATION
    if key == SIDE_BY_SIDE:
        record = side_by_side()
        return (
            _where(key, ALL, lesson) + "### All of them side by side\n\n"
            f"Every stop's run again, on the same prompt and budget ({record['max_new_tokens']} "
            f"tokens), {record['rounds']} rounds with autoregressive in each, recorded on this "
            "app's CPU. A method gains only by committing more tokens per forward than its "
            "wider forwards and its drafting cost: compare the two bars of each row (the diamond is the "
            "speedup its work is worth on the price table). Lossy "
            "methods trade agreement with greedy for speed; the second chart puts each where it "
            "lands. **Run it live** runs this comparison again in the Compare tab (a few "
            "minutes), or pick any stop to see one method again.\n\n"
            f"<div class='dl-look'>👀 <b>Look at</b>: {html.escape(_best_sentence(record))}</div>"
        )
    stop = STOPS[n - 1]
    where = (
        f"Opened at step {at} of {last} (step 0 is the prompt's forward, which wrote the first "
        f"token): {stop.rule}. **Run it live** to decode it yourself and step through every step."
        if at is not None
        else ""
    )
    return (
        _where(key, stop.chapter, lesson)
        + f"### {stop.title}\n\n{fill(stop.narration)} {here_sentence(stop)}\n\n"
        f"<div class='dl-look'>👀 <b>Look at</b>: {html.escape(stop.look)}</div>\n\n"
        f"<span class='dl-tour-rule'>{where}</span>"
    )


def _best_sentence(record: dict[str, Any]) -> str:
    """The recorded comparison's winner by Compare's rule (facts.lossless_leaders, on modelled
    speedups), or the tie it found."""
    try:
        best, rivals = lossless_leaders({r["method"]: r for r in record["rows"]})
    except UnknownFact:
        return "each row's tokens per forward against its speedup."
    if rivals:
        names = ", ".join(r["method"] for r in rivals)
        lead = f"no clear winner: {best['method']} and {names} are too close to call on modelled speedups; "
    else:
        lead = "the fastest lossless method, "
    return (
        f"{lead}{best['method']}: {fmt_ratio(best['tokens_per_target_forward'])} tokens per "
        f"forward became {speeds(best)}, because its forwards are wider and its drafting is not "
        "free."
    )


def _timed(row: dict[str, Any] | None) -> dict[str, Any]:
    """The side-by-side row's clock readings (its tokens/s): a stop's card shows the speed of the
    same rounds its speedup came from, not its own recording's (timed alone, another moment)."""
    return {"tokens_per_s": row["tokens_per_s"]} if row and row.get("tokens_per_s") else {}


def show(
    key: str,
    width: float | None = None,
    step: int | None = None,
    asking: bool = False,
    lesson: bool = False,
) -> dict[str, Any]:
    """What one stop shows: the narration, the tokens and metrics as recorded, the marked figure
    at `step` (None: the stop's telling step; `asking`: a stop with a question shows it there, its
    answer painted over: ui/tour.question), and where it is (`at`, `last`, None for the two
    stops that are no run; `asked`: the question shown). Side by side: the recorded comparison's
    two charts; translation: the lab on the shipped models."""
    w = int(width) if width else None
    plain = {"at": None, "last": None, "asked": "", "rule": ""}
    if key == TRANSLATION:
        from decoders.seq2seq.lab import metrics, parse_source, translate_all
        from visualizer.translation_views import CSS as LAB_CSS
        from visualizer.translation_views import outputs_html, references_html
        from visualizer.translation_views import quality_chart as lab_chart

        lab = translate_all("modes", parse_source(TRANSLATION_SOURCE))
        return {
            **plain,
            "narration": annotate(_narration(key, lesson=lesson)),
            "tokens": f"<style>{LAB_CSS}</style>" + references_html(lab) + outputs_html(lab),
            "metrics": "",
            "panel": lab_chart(metrics("modes"), "modes", w),
            "second": None,
        }
    if key == SIDE_BY_SIDE:
        rows = side_by_side()["rows"]
        return {
            **plain,
            "narration": annotate(_narration(key, lesson=lesson)),
            "tokens": "",
            "metrics": "",
            "panel": speedup_chart(rows),
            "second": quality_chart(rows),
        }
    stop = STOPS[KEYS.index(key)]
    trace = recorded(stop.recording)
    telling = stop.pick(trace)
    at = telling if step is None else min(max(int(step), 0), trace.last_step)
    asked = stop.ask if asking and stop.ask and at == telling else ""
    method = trace.meta["method"]
    views = (stop.view,) if stop.view else views_of(method)
    fig = mark(method_panel(views, trace.events, trace.texts, at, w), stop.focus)
    return {
        "narration": annotate(_narration(key, telling, trace.last_step, lesson)),
        # a question's tokens: those written before its step, and none after (greyed, the
        # tokens to come would say the answer)
        "tokens": token_spans_html(_before(trace.events, at), trace.texts)
        if asked
        else token_spans_html(trace.events, trace.texts, at),
        # the speed as the side-by-side stop measured it: one reference, one price table
        "metrics": metrics_html(
            {**trace.stats, **_timed(side_by_side_row(stop))},
            trace.meta.get("lossless"),
            side_by_side_row(stop),
            "the tour's side-by-side recording",
        ),
        "panel": question(fig, stop.conceal) if asked else fig,
        "second": None,
        "at": at,
        "last": trace.last_step,
        "asked": asked,
        "rule": stop.rule,
    }


def _before(events: Sequence[Event], step: int) -> list[Event]:
    """The run's events before `step` (those of no step, the prefill's, kept)."""
    return [e for e in events if getattr(e, "step", -1) < step]


def number(key: str) -> int:
    """A stop's number on the full tour (what `?tour=N` opens), 1-based."""
    return KEYS.index(key) + 1


def path(lesson: bool) -> list[str]:
    """The stops Prev / Next walk: the 15-minute lesson's, or every stop."""
    return [k for k in KEYS if k in LESSON_MINUTES] if lesson else list(KEYS)


def lesson_minutes() -> float:
    return sum(LESSON_MINUTES[k] for k in path(True))


def choices(lesson: bool) -> list[tuple[str, str]]:
    """The stop picker's entries: every stop by its number; on the lesson, its stops with
    their place on it and a class's minutes at each."""
    if not lesson:
        return CHOICES
    keys = path(True)
    label = dict((k, lab) for lab, k in CHOICES)
    return [
        (f"{label[k]} · {i + 1}/{len(keys)}, {_minutes(LESSON_MINUTES[k])}", k)
        for i, k in enumerate(keys)
    ]


def _minutes(m: float) -> str:
    return f"{m:g} min"


def moved(key: str, delta: int, lesson: bool) -> str:
    """The stop `delta` places away on the chosen path (held at its ends); from a stop off the
    lesson, the lesson's nearest stop that way."""
    keys = path(lesson)
    if key in keys:
        return keys[min(max(keys.index(key) + delta, 0), len(keys) - 1)]
    i = KEYS.index(key) if key in KEYS else 0
    ahead = [k for k in keys if (KEYS.index(k) > i if delta > 0 else KEYS.index(k) < i)]
    if not ahead:
        return key
    return ahead[0] if delta > 0 else ahead[-1]


def link(key: str, at: int | None, lesson: bool) -> str:
    """The query that opens this stop (at this step, on this path): `?tour=N&step=K`."""
    query = f"?tour={number(key)}"
    if at is not None:
        query += f"&step={at}"
    return query + ("&lesson=1" if lesson else "")


def link_html(key: str, at: int | None, lesson: bool) -> str:
    """A link to this stop and step, and a button that copies it (the page's own address in
    front), for a teacher to send to a class."""
    query = link(key, at, lesson)
    what = "this stop" if at is None else f"stop {number(key)} at step {at}"
    copy = (
        # (inside an inline handler `URL` is document.URL: the constructor is window's)
        "const u=new window.URL(this.dataset.q,location.href).href;"
        "if(navigator.clipboard){navigator.clipboard.writeText(u).then(()=>"
        "{this.textContent='✓ copied'},()=>window.prompt('Copy this link',u))}"
        "else{window.prompt('Copy this link',u)}"
    )
    return (
        f"<div class='dl-tour-link'>🔗 <a href='{html.escape(query)}' target='_blank' "
        f"rel='noopener'>link to {what}</a> <button type='button' class='dl-copy' "
        f"data-q='{html.escape(query)}' onclick=\"{copy}\">copy</button></div>"
    )


def read_link(query: dict[str, str]) -> dict[str, Any] | None:
    """A tour link's stop, step, path and presenter flag, checked (None: no tour link). A bad
    value opens the tour's first stop with a message that names it."""
    if "tour" not in query:
        return None
    lesson = query.get("lesson") in ("1", "true", "yes")
    out: dict[str, Any] = {"key": path(lesson)[0], "step": None, "lesson": lesson, "error": ""}
    raw = query["tour"]
    if not raw.isdigit() or not 1 <= int(raw) <= len(KEYS):
        out["error"] = f"tour={raw!r} is not a stop: the tour's stops are 1–{len(KEYS)}"
        return out
    out["key"] = KEYS[int(raw) - 1]
    if "step" in query:
        rawstep, shown = query["step"], show_steps(out["key"])
        if shown is None:
            out["error"] = f"step={rawstep!r}: stop {raw} is no single run, it has no steps"
        elif not rawstep.isdigit() or int(rawstep) > shown:
            out["error"] = (
                f"step={rawstep!r} is not a step of stop {raw}: its steps are 0–{shown}; "
                "opened at its telling step"
            )
        else:
            out["step"] = int(rawstep)
    return out


def show_steps(key: str) -> int | None:
    """A stop's last step (None for the two stops that are no single run)."""
    if key in (SIDE_BY_SIDE, TRANSLATION):
        return None
    return recorded(STOPS[KEYS.index(key)].recording).last_step
