"""The Tour tab: the guided tour's stops (ui/tour.py), one at a time, each a recorded run drawn at
its telling step with the thing to look at marked; Prev / Next, a stop picker, and "Run it live",
which fills the Run tab with the stop's method, prompt and settings and runs it there."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from decoders.core.facts import UnknownFact, fill, lossless_leaders, speeds
from decoders.core.readings import fmt_ratio
from visualizer import method_panel, metrics_html, token_spans_html
from visualizer.compare_views import quality_chart, speedup_chart

from .common import internal_error, message
from .compare_tab import CompareTab
from .run_views import RunTab, views_of
from .tour import (
    ALL,
    BEYOND,
    LIVE,
    SIDE_BY_SIDE,
    STOPS,
    TRANSLATION,
    TRANSLATION_SOURCE,
    here_sentence,
    mark,
    recorded,
    side_by_side,
    side_by_side_row,
)

SHOW_NARRATION = "() => document.querySelector('#tour-nav')?.scrollIntoView({block: 'start'})"
TOUR_WIDTH = "(document.querySelector('#tour-panel')?.clientWidth || null)"
# Before the tour is drawn there is no figure to measure: its column's share of the window (the
# whole width on a phone, three fifths of the page's width beside the narration on a desktop).
TOUR_WIDTH_ESTIMATE = (
    "(window.innerWidth <= 768 ? window.innerWidth - 32"
    " : Math.round(Math.min(window.innerWidth, 1600) * 0.55))"
)
KEYS = [s.key for s in STOPS] + [SIDE_BY_SIDE, TRANSLATION]
CHOICES = [(f"{i + 1}. {s.title}", s.key) for i, s in enumerate(STOPS)] + [
    (f"{len(STOPS) + 1}. All of them side by side", SIDE_BY_SIDE),
    (f"{len(STOPS) + 2}. Translation: several right answers", TRANSLATION),
]
# Run it live: the Run tab's button (the side-by-side stop: Compare's; the translation stop:
# none), pressed once the form holds the stop's settings.
PRESS = f"""(key) => {{
  if (key === '{TRANSLATION}') return;  // the lab has translated its sentence already
  const button = key === '{SIDE_BY_SIDE}' ? '#cmp-btn' : '#run-btn';
  setTimeout(() => document.querySelector(button)?.click(), 300);
}}"""


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


def _narration(key: str, at: int | None = None, last: int | None = None) -> str:
    n = KEYS.index(key) + 1
    if key == TRANSLATION:
        return f"<div class='dl-tour-where'>Stop {n} of {len(KEYS)} · {BEYOND}</div>\n\n" + (
            TRANSLATION_NARRATION
        )
    if key == SIDE_BY_SIDE:
        record = side_by_side()
        return (
            f"<div class='dl-tour-where'>Stop {n} of {len(KEYS)} · {ALL}</div>\n\n"
            "### All of them side by side\n\n"
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
        f"<div class='dl-tour-where'>Stop {n} of {len(KEYS)} · {stop.chapter}</div>\n\n"
        f"### {stop.title}\n\n{fill(stop.narration)} {here_sentence(stop)}\n\n"
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


def show(key: str, width: float | None = None) -> dict[str, Any]:
    """What one stop shows: the narration, the tokens and metrics as recorded, the marked figure
    (side by side: the recorded comparison's two charts; translation: the lab on the shipped
    models)."""
    w = int(width) if width else None
    if key == TRANSLATION:
        from decoders.seq2seq.lab import metrics, parse_source, translate_all
        from visualizer.translation_views import CSS as LAB_CSS
        from visualizer.translation_views import outputs_html, references_html
        from visualizer.translation_views import quality_chart as lab_chart

        lab = translate_all("modes", parse_source(TRANSLATION_SOURCE))
        return {
            "narration": _narration(key),
            "tokens": f"<style>{LAB_CSS}</style>" + references_html(lab) + outputs_html(lab),
            "metrics": "",
            "panel": lab_chart(metrics("modes"), "modes", w),
            "second": None,
        }
    if key == SIDE_BY_SIDE:
        rows = side_by_side()["rows"]
        return {
            "narration": _narration(key),
            "tokens": "",
            "metrics": "",
            "panel": speedup_chart(rows),
            "second": quality_chart(rows),
        }
    stop = STOPS[KEYS.index(key)]
    trace = recorded(stop.recording)
    at = stop.pick(trace)
    method = trace.meta["method"]
    views = (stop.view,) if stop.view else views_of(method)
    fig = method_panel(views, trace.events, trace.texts, at, w)
    return {
        "narration": _narration(key, at, trace.last_step),
        "tokens": token_spans_html(trace.events, trace.texts, at),
        # the speed as the side-by-side stop measured it: one reference, one price table
        "metrics": metrics_html(
            {**trace.stats, **_timed(side_by_side_row(stop))},
            trace.meta.get("lossless"),
            side_by_side_row(stop),
            "the tour's side-by-side recording",
        ),
        "panel": mark(fig, stop.focus),
        "second": None,
    }


@dataclass
class TourTab:
    pick: Any
    live_btn: Any


def build_tour_tab(
    tab: gr.Tab, tabs: gr.Tabs, wire: Callable[[TourTab], None]
) -> tuple[gr.State, gr.Number]:
    """Call inside the `gr.Tab` it is: the stop picker, Prev / Next / Run it live, the narration,
    the figure and the recorded tokens, drawn the first time the tab opens (a page that never
    opens it builds none of it); `wire` then connects its Run it live. Returns the flag that
    opens it and the width it is drawn for (a handler that selects the tab sets both)."""
    opened = gr.State(False)
    width = gr.Number(None, visible=False, elem_id="tour-width")
    tab.select(
        lambda w: (True, w),
        width,
        [opened, width],
        js=f"(...a) => [{TOUR_WIDTH_ESTIMATE}]",
        api_visibility="private",
        show_progress="hidden",
    )

    @gr.render(inputs=[opened, width], triggers=[opened.change], show_progress="hidden")
    def draw(on: bool, w: float | None) -> None:
        if on:
            wire(_draw(tabs, width, w))

    return opened, width


def _draw(tabs: gr.Tabs, width: gr.Number, w: float | None) -> TourTab:
    first = KEYS[0]
    start = show(first, w)
    with gr.Row(elem_id="tour-nav"):
        pick = gr.Dropdown(
            CHOICES, value=first, label="Stop", elem_id="tour-stop", scale=4, interactive=True
        )
        with gr.Column(scale=1, min_width=160):
            with gr.Row():
                prev_btn = gr.Button("◀ Prev", size="sm", elem_id="tour-prev", min_width=70)
                next_btn = gr.Button("Next ▶", size="sm", elem_id="tour-next", min_width=70)
    with gr.Row(elem_id="tour-row"):
        with gr.Column(scale=2, min_width=300):
            narration = gr.Markdown(start["narration"], elem_id="tour-text")
            live_btn = gr.Button("▶ Run it live", variant="primary", elem_id="tour-live")
            status = gr.Markdown("", elem_id="tour-status")
        with gr.Column(scale=3, min_width=300):
            panel = gr.Plot(start["panel"], elem_id="tour-panel", show_label=False)
            second = gr.Plot(None, visible=False, elem_id="tour-second", show_label=False)
            metrics = gr.HTML(start["metrics"], elem_id="tour-metrics")
            tokens = gr.HTML(start["tokens"], elem_id="tour-tokens")
            # again under the figure: on a phone the top ones are two screens up by now
            with gr.Row():
                prev_low = gr.Button("◀ Prev", size="sm", elem_id="tour-prev-low", min_width=70)
                next_low = gr.Button("Next ▶", size="sm", elem_id="tour-next-low", min_width=70)
    outputs = [narration, tokens, metrics, panel, second, status]

    def on_stop(key: str, w: float | None) -> dict:
        if key not in KEYS:
            return {status: message(f"no tour stop named {key!r}")}
        try:
            v = show(key, w)
        except Exception as exc:  # a recording that no longer reads: a message, not "Error"
            return {status: message(internal_error(exc))}
        return {
            narration: v["narration"],
            tokens: v["tokens"],
            metrics: v["metrics"],
            panel: v["panel"],
            second: gr.Plot(v["second"], visible=v["second"] is not None),
            status: "",
        }

    js = f"(k, w) => [k, {TOUR_WIDTH}]"
    pick.change(
        on_stop, [pick, width], outputs, js=js, api_visibility="private", show_progress="hidden"
    )

    def on_tab(key: str, w: float | None, evt: gr.SelectData) -> dict:
        """The tour's figure is drawn when its tab opens (at the width it opens at)."""
        if evt.value != "Tour":
            return {status: gr.skip()}
        return on_stop(key, w)

    tabs.select(
        on_tab, [pick, width], outputs, js=js, api_visibility="private", show_progress="hidden"
    )

    def nudge(delta: int):
        def fn(key: str) -> str:
            i = KEYS.index(key) if key in KEYS else 0
            return KEYS[min(max(i + delta, 0), len(KEYS) - 1)]

        return fn

    for button, delta in ((prev_btn, -1), (next_btn, 1), (prev_low, -1), (next_low, 1)):
        button.click(nudge(delta), pick, pick, api_visibility="private")
    # the lower buttons bring the new stop's narration into view
    for button in (prev_low, next_low):
        button.click(None, None, None, js=SHOW_NARRATION, api_visibility="private")

    return TourTab(pick, live_btn)


def wire_live(
    tour: TourTab, run: RunTab, compare: CompareTab, tabs: gr.Tabs, translation: gr.State
) -> None:
    """Run it live: a stop's run in the Run tab (its method, prompt, budget and settings), or the
    side-by-side stop's comparison in the Compare tab (every stop's spec, the same rounds); then the
    tab's own button is pressed."""

    def live(request: gr.Request, key: str) -> dict:
        if key == TRANSLATION:
            return {tabs: gr.Tabs(selected="translation"), translation: True}
        if key in KEYS and key not in (
            SIDE_BY_SIDE,
            TRANSLATION,
        ):  # the run opens at the stop's step
            LIVE[getattr(request, "session_hash", None)] = key
        if key == SIDE_BY_SIDE:
            record = side_by_side()
            return {
                tabs: gr.Tabs(selected="compare"),
                compare.preset: None,  # the tour's own specs, no preset's
                compare.prompt: record["prompt"],
                compare.specs: "\n".join(str(r["method"]) for r in record["rows"][1:]),
                compare.max_new: record["max_new_tokens"],
                compare.rounds: record["rounds"],
            }
        stop = STOPS[KEYS.index(key)] if key in KEYS else STOPS[0]
        return {
            tabs: gr.Tabs(selected="run"),
            # the form as the recording ran (an imported trace fills it the same way)
            **run.form_for(recorded(stop.recording)),
            run.preset: "defaults" if not stop.params else None,  # its own settings: no preset
        }

    outputs = [
        tabs,
        translation,
        *run.form,
        run.preset,
        compare.preset,
        compare.prompt,
        compare.specs,
        compare.max_new,
        compare.rounds,
    ]
    tour.live_btn.click(live, tour.pick, outputs, api_visibility="private").then(
        None, tour.pick, None, js=PRESS, api_visibility="private"
    )
