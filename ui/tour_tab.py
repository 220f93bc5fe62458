"""The Tour tab: the guided tour's stops (ui/tour.py), one at a time, each a recorded run drawn at
its telling step with the thing to look at marked; Prev / Next, a stop picker, and "Run it live",
which fills the Run tab with the stop's method, prompt and settings and runs it there."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from decoders import METHODS
from visualizer import method_panel, metrics_html, token_spans_html
from visualizer.compare_views import quality_chart, speedup_chart
from visualizer.text import fmt_speedup

from .common import internal_error, message
from .run_views import RunTab, views_of
from .tour import ALL, BUDGET, PROMPT, SIDE_BY_SIDE, STOPS, mark, recorded, side_by_side

TOUR_WIDTH = "(document.querySelector('#tour-panel')?.clientWidth || null)"
KEYS = [s.key for s in STOPS] + [SIDE_BY_SIDE]
CHOICES = [(f"{i + 1}. {s.title}", s.key) for i, s in enumerate(STOPS)] + [
    (f"{len(STOPS) + 1}. All of them side by side", SIDE_BY_SIDE)
]
# Run it live: the Run tab's button, pressed once the form holds the stop's settings.
PRESS_RUN = "() => { setTimeout(() => document.querySelector('#run-btn')?.click(), 300); }"


def _narration(key: str, at: int | None = None, last: int | None = None) -> str:
    n = KEYS.index(key) + 1
    if key == SIDE_BY_SIDE:
        record = side_by_side()
        return (
            f"<div class='dl-tour-where'>Stop {n} of {len(KEYS)} · {ALL}</div>\n\n"
            "### All of them side by side\n\n"
            f"Every stop's run again, on the same prompt and budget ({record['max_new_tokens']} "
            f"tokens), {record['rounds']} rounds with autoregressive in each, recorded on this "
            "app's CPU. A method is faster only by committing more tokens per forward than its "
            "wider forwards and its drafting cost: compare the two bars of each row. Lossy "
            "methods trade agreement with greedy for speed; the second chart puts each where it "
            "lands. Press **Run it live** to run this comparison yourself in the Compare tab's "
            "spirit, or pick any stop to see one method again.\n\n"
            f"<div class='dl-look'>👀 <b>Look at</b>: {html.escape(_best_sentence(record))}</div>"
        )
    stop = STOPS[n - 1]
    where = (
        f"Opened at step {at} of {last}: {stop.rule}. **Run it live** to decode it yourself and "
        "step through every step."
        if at is not None
        else ""
    )
    return (
        f"<div class='dl-tour-where'>Stop {n} of {len(KEYS)} · {stop.chapter}</div>\n\n"
        f"### {stop.title}\n\n{stop.narration}\n\n"
        f"<div class='dl-look'>👀 <b>Look at</b>: {html.escape(stop.look)}</div>\n\n"
        f"<span class='dl-tour-rule'>{where}</span>"
    )


def _best_sentence(record: dict[str, Any]) -> str:
    rows = [r for r in record["rows"] if not r.get("lossy") and r["name"] != "autoregressive"]
    if not rows:
        return "each row's tokens per forward against its speedup."
    best = max(rows, key=lambda r: r["speedup"])
    return (
        f"the top lossless row, {best['method']}: {best['tokens_per_target_forward']:.2f} tokens "
        f"per forward became {fmt_speedup(best['speedup'])}, because its forwards are wider and "
        "its drafting is not free."
    )


def show(key: str, width: float | None = None) -> dict[str, Any]:
    """What one stop shows: the narration, the tokens and metrics as recorded, the marked figure
    (the last stop: the recorded comparison's two charts)."""
    w = int(width) if width else None
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
    fig = method_panel(views_of(method), trace.events, trace.texts, at, w)
    return {
        "narration": _narration(key, at, trace.last_step),
        "tokens": token_spans_html(trace.events, trace.texts, at),
        "metrics": metrics_html(trace.stats, trace.meta.get("lossless")),
        "panel": mark(fig, stop.focus),
        "second": None,
    }


def build_tour_tab(run: RunTab, tabs: gr.Tabs) -> None:
    """Call inside a `gr.Tab`: the stop picker, Prev / Next / Run it live, the narration, the
    figure and the recorded tokens."""
    first = KEYS[0]
    with gr.Row(elem_id="tour-nav"):
        pick = gr.Dropdown(CHOICES, value=first, label="Stop", elem_id="tour-stop", scale=4)
        with gr.Column(scale=1, min_width=160):
            with gr.Row():
                prev_btn = gr.Button("◀ Prev", size="sm", elem_id="tour-prev", min_width=70)
                next_btn = gr.Button("Next ▶", size="sm", elem_id="tour-next", min_width=70)
    with gr.Row(elem_id="tour-row"):
        with gr.Column(scale=2, min_width=300):
            narration = gr.Markdown(_narration(first), elem_id="tour-text")
            live_btn = gr.Button("▶ Run it live", variant="primary", elem_id="tour-live")
            status = gr.Markdown("", elem_id="tour-status")
        with gr.Column(scale=3, min_width=300):
            panel = gr.Plot(None, elem_id="tour-panel", show_label=False)
            second = gr.Plot(None, visible=False, elem_id="tour-second", show_label=False)
            metrics = gr.HTML("", elem_id="tour-metrics")
            tokens = gr.HTML("", elem_id="tour-tokens")
    width = gr.Number(None, visible=False, elem_id="tour-width")
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

    prev_btn.click(nudge(-1), pick, pick, api_visibility="private")
    next_btn.click(nudge(+1), pick, pick, api_visibility="private")

    def live(key: str) -> dict:
        """The Run tab's form set to the stop's run (the side-by-side stop: Compare's own
        preset is the place for that; here the Run tab runs the token tree)."""
        stop = STOPS[KEYS.index(key)] if key in KEYS[:-1] else STOPS[KEYS.index("token_tree")]
        m = METHODS[stop.method]
        values = {**m.preset("defaults"), **stop.params}
        return {
            tabs: gr.Tabs(selected="run"),
            run.prompt: PROMPT,
            run.method: stop.method,
            run.max_new: BUDGET,
            run.temperature: 0.0,
            run.preset: "defaults" if not stop.params else None,  # its own settings: no preset
            **{run.controls[(stop.method, k)]: v for k, v in values.items()},
        }

    live_outputs = [
        tabs,
        run.prompt,
        run.method,
        run.max_new,
        run.temperature,
        run.preset,
        *run.controls.values(),
    ]
    live_btn.click(live, pick, live_outputs, api_visibility="private").then(
        None, None, None, js=PRESS_RUN, api_visibility="private"
    )
