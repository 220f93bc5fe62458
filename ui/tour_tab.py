"""The Tour tab: the guided tour's stops (ui/tour.py), one at a time, each a recorded run drawn at
its telling step with the thing to look at marked (ui/tour_show.py says what a stop shows). Two
paths (the 15-minute lesson, every stop), Prev / Next and the keyboard (←/→, PageUp/PageDown for
a clicker, Home/End), a step slider with "telling step", predict-then-reveal on the stops that
ask, a presenter mode (full-width figures, large type), a link to every stop and step, and "Run
it live", which fills the Run tab with the stop's method, prompt and settings, runs it there and
lands on its figure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from .common import internal_error, message
from .compare_tab import CompareTab
from .glossary import annotate
from .run_views import RunTab, views_of
from .tour import LIVE, SIDE_BY_SIDE, STOPS, TRANSLATION, TRANSLATION_SOURCE, recorded, side_by_side
from .tour_show import (
    KEYS,
    choices,
    lesson_minutes,
    link_html,
    moved,
    path,
    read_link,
    show,
    show_steps,
)

SHOW_NARRATION = "() => document.querySelector('#tour-nav')?.scrollIntoView({block: 'start'})"
PRESENTING = "document.body.classList.contains('dl-present')"
TOUR_WIDTH = "(document.querySelector('#tour-panel')?.clientWidth || null)"
# Before the tour is drawn there is no figure to measure: its column's share of the window (the
# whole width on a phone or in presenter mode, three fifths of the page beside the narration).
TOUR_WIDTH_ESTIMATE = (
    f"(window.innerWidth <= 768 || {PRESENTING} ? window.innerWidth - 32"
    " : Math.round(Math.min(window.innerWidth, 1600) * 0.55))"
)
# A link's `present=1` (read in the browser, before the first stop is drawn at its width).
PRESENT_FROM_LINK = (
    "(new URLSearchParams(location.search).get('present') === '1'"
    " && document.body.classList.add('dl-present'))"
)
LESSON, FULL = "15-minute lesson", "Every stop"


# Where a stop's live run lands: the Run tab's figure that holds the stop's view (the first view
# is #panel, the next ones #panel2, #panel3, …), Compare's chart for the side-by-side stop.
def _panel(index: int) -> str:
    """The Run tab's figure id for a method's view number `index` (0: its panel)."""
    return "#panel" + (str(index + 1) if index else "")


LAND = {s.key: _panel(views_of(s.method).index(s.view) if s.view else 0) for s in STOPS} | {
    SIDE_BY_SIDE: "#cmp-plot",
    TRANSLATION: "#tl-outputs",
}
SCROLL_TO = "(sel) => { const el = document.querySelector(sel); if (el) el.scrollIntoView({block: 'start'}); }"
# After a run: a live run from the tour lands on its figure (once).
LANDED = f"""() => {{
  const sel = window.dlLand;
  window.dlLand = null;
  // a count of landings, for whoever waits on one (the browser tests)
  if (sel) setTimeout(() => {{ ({SCROLL_TO})(sel); window.dlLanded = (window.dlLanded || 0) + 1; }}, 150);
}}"""
# Run it live: the Run tab's button (the side-by-side stop: Compare's; the translation stop:
# none, the lab translates the stop's sentence as it is drawn), pressed once the form holds the
# stop's settings; the page goes to the stop's figure at once (it streams there) and again when
# the run is done (`LANDED`).
PRESS = f"""(key) => {{
  const land = {LAND};
  window.dlLand = land[key] || null;
  const button = key === '{SIDE_BY_SIDE}' ? '#cmp-btn' : '#run-btn';
  setTimeout(() => {{
    if (key !== '{TRANSLATION}') document.querySelector(button)?.click();
    setTimeout(() => window.dlLand && ({SCROLL_TO})(window.dlLand), 400);
  }}, 300);
  if (key === '{TRANSLATION}') setTimeout(() => ({LANDED})(), 1500);
}}"""
# The keyboard, while the tour is on screen: ←/→ and PageUp/PageDown (a presenter's clicker)
# move between stops, Home/End go to the path's ends, R reveals a question's answer. Typing in
# a box is left alone.
KEYBOARD = """() => {
  if (window.dlTourKeys) return;
  window.dlTourKeys = true;
  const keys = {ArrowRight: '#tour-next', PageDown: '#tour-next', ArrowLeft: '#tour-prev',
                PageUp: '#tour-prev', Home: '#tour-first', End: '#tour-last',
                r: '#tour-reveal', R: '#tour-reveal'};
  document.addEventListener('keydown', (e) => {
    const target = keys[e.key];
    const next = document.querySelector('#tour-next');
    if (!target || !next || next.offsetParent === null || e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target;
    const typing = t && (t.tagName === 'TEXTAREA' || t.isContentEditable ||
      (t.tagName === 'INPUT' && !t.closest('#tour-nav')));
    if (typing) return;
    e.preventDefault();
    if (t && t.blur && t.closest && t.closest('#tour-nav')) t.blur();
    document.querySelector(target)?.click();
  });
}"""
# Presenter mode: the figure across the window, large type, the page's header out of the way.
TOGGLE_PRESENT = f"""(key, step, asking, lesson, w) => {{
  document.body.classList.toggle('dl-present');
  // the figures drawn already follow their new width (Plotly resizes on the window's event)
  setTimeout(() => window.dispatchEvent(new Event('resize')), 50);
  return [key, step, asking, lesson, {TOUR_WIDTH}];
}}"""
RESIZED = "() => setTimeout(() => window.dispatchEvent(new Event('resize')), 50)"
PRESENT_ZOOM = 1.35  # presenter mode: the figure's type, for the back of the room
CSS = f"""
.dl-present .gradio-container {{max-width: 100% !important; padding: 0 8px !important;}}
.dl-present .gradio-container .main {{max-width: 100% !important; padding: 0 8px !important;}}
.dl-present #dl-title, .dl-present #take-tour {{display: none;}}
/* one column: the figure first (the stop's title is in the picker above it), its step, then
   the narration with the question and Reveal, then the numbers and the tokens */
.dl-present #tour-row {{flex-direction: column;}}
.dl-present #tour-row > div {{display: contents;}}
.dl-present #tour-status {{order: 0;}}
.dl-present #tour-panel {{order: 1; zoom: {PRESENT_ZOOM};}}
.dl-present #tour-second {{order: 2; zoom: {PRESENT_ZOOM};}}
.dl-present #tour-step-row {{order: 3;}}
.dl-present #tour-ask {{order: 4;}}
.dl-present #tour-reveal {{order: 5;}}
.dl-present #tour-text {{order: 6;}}
.dl-present #tour-live {{order: 7;}}
.dl-present #tour-link {{order: 8;}}
.dl-present #tour-metrics {{order: 9;}}
.dl-present #tour-tokens {{order: 10;}}
.dl-present #tour-low-nav {{order: 11;}}
.dl-present #tour-text {{font-size: 1.3rem; line-height: 1.5;}}
.dl-present #tour-text h3 {{font-size: 2rem;}}
.dl-present #tour-ask .dl-ask, .dl-present .dl-look {{font-size: 1.3rem;}}
.dl-present #tour-reveal {{font-size: 1.2rem; min-height: 48px;}}
.dl-present #tour-tokens .dl-tokens {{font-size: 20px;}}
.dl-ask {{background: #ede7f6; border-left: 4px solid #4527a0; padding: 8px 10px;
  border-radius: 4px; color: #1a1a2e;}}
.dl-tour-link {{font-size: 13px; color: #37474f;}}
.dl-tour-link button {{margin-left: 6px; padding: 0 8px; border: 1px solid #90a4ae;
  border-radius: 4px; background: #fff; color: #263238; font-size: 13px; font-weight: normal;}}
"""


def _ask_html(asked: str) -> str:
    return (
        f"<div class='dl-ask'>❓ <b>Predict</b>: {annotate(asked)} <i>(The verdict colours "
        "are hidden: answer, then press Reveal.)</i></div>"
        if asked
        else ""
    )


@dataclass
class TourTab:
    pick: Any
    live_btn: Any


def build_tour_tab(
    tab: gr.Tab, tabs: gr.Tabs, wire: Callable[[TourTab], None]
) -> tuple[gr.State, gr.Number, gr.State]:
    """Call inside the `gr.Tab` it is: the stop picker, the path, Prev / Next / Run it live, the
    narration, the figure, its step and the recorded tokens, drawn the first time the tab opens (a
    page that never opens it builds none of it); `wire` then connects its Run it live. Returns the
    flag that opens it, the width it is drawn for and where it starts (a link's stop and step:
    `wire_tour_link`)."""
    opened = gr.State(False)
    start = gr.State(None)
    width = gr.Number(None, visible=False, elem_id="tour-width")
    tab.select(
        lambda w: (True, w),
        width,
        [opened, width],
        js=f"(...a) => [{TOUR_WIDTH_ESTIMATE}]",
        api_visibility="private",
        show_progress="hidden",
    )

    @gr.render(inputs=[opened, width, start], triggers=[opened.change], show_progress="hidden")
    def draw(on: bool, w: float | None, begin: dict | None) -> None:
        if on:
            wire(_draw(tabs, width, w, begin or {}))

    return opened, width, start


def wire_tour_link(demo: gr.Blocks, tabs: gr.Tabs, opened, width, start) -> None:
    """`?tour=N&step=K` (with `&lesson=1`, `&present=1`): the page opens on the Tour tab at stop
    N, step K; the keyboard is the tour's wherever it is on screen."""

    def tour_from_url(request: gr.Request, w: float | None) -> dict:
        query = dict(request.query_params) if request else {}
        begin = read_link(query)
        if begin is None:
            return {start: gr.skip()}
        return {tabs: gr.Tabs(selected="tour"), start: begin, opened: True, width: w}

    demo.load(None, None, None, js=KEYBOARD, api_visibility="private")
    demo.load(
        tour_from_url,
        width,
        [tabs, start, opened, width],
        js=f"(...a) => {{ {PRESENT_FROM_LINK}; return [{TOUR_WIDTH_ESTIMATE}]; }}",
        api_visibility="private",
        show_progress="hidden",
    )


def _draw(tabs: gr.Tabs, width: gr.Number, w: float | None, begin: dict) -> TourTab:
    lesson0 = bool(begin.get("lesson"))
    first = begin.get("key") or path(lesson0)[0]
    asking0 = begin.get("step") is None
    v0 = show(first, w, begin.get("step"), asking=asking0, lesson=lesson0)
    with gr.Row(elem_id="tour-nav"):
        pick = gr.Dropdown(
            choices(lesson0),
            value=first,
            label="Stop",
            elem_id="tour-stop",
            interactive=True,
            scale=4,
            min_width=300,
        )
        lesson = gr.Radio(
            [
                (f"{LESSON} ({len(path(True))} stops, {lesson_minutes():g} min)", True),
                (f"{FULL} ({len(KEYS)})", False),
            ],
            value=lesson0,
            label="Path",
            elem_id="tour-path",
            interactive=True,
            scale=3,
            min_width=280,
        )
        with gr.Column(scale=2, min_width=260):
            with gr.Row():
                prev_btn = gr.Button("◀ Prev", size="sm", elem_id="tour-prev", min_width=70)
                next_btn = gr.Button("Next ▶", size="sm", elem_id="tour-next", min_width=70)
                present = gr.Button("🖥 Present", size="sm", elem_id="tour-present", min_width=90)
    first_btn = gr.Button("first", elem_id="tour-first", elem_classes=["dl-hidden"])
    last_btn = gr.Button("last", elem_id="tour-last", elem_classes=["dl-hidden"])
    asking = gr.State(bool(v0["asked"]))
    with gr.Row(elem_id="tour-row"):
        with gr.Column(scale=2, min_width=300):
            status = gr.Markdown(
                message(begin["error"]) if begin.get("error") else "", elem_id="tour-status"
            )
            narration = gr.Markdown(v0["narration"], elem_id="tour-text")
            ask = gr.HTML(_ask_html(v0["asked"]), elem_id="tour-ask", padding=False)
            reveal = gr.Button(
                "Reveal the answer", visible=bool(v0["asked"]), elem_id="tour-reveal", size="sm"
            )
            live_btn = gr.Button("▶ Run it live", variant="primary", elem_id="tour-live")
            link = gr.HTML(link_html(first, v0["at"], lesson0), elem_id="tour-link", padding=False)
        with gr.Column(scale=3, min_width=300):
            panel = gr.Plot(v0["panel"], elem_id="tour-panel", show_label=False)
            second = gr.Plot(
                v0["second"],
                visible=v0["second"] is not None,
                elem_id="tour-second",
                show_label=False,
            )
            with gr.Row(equal_height=True, elem_id="tour-step-row"):
                step = gr.Slider(
                    0,
                    max(v0["last"] or 1, 1),
                    value=v0["at"] or 0,
                    step=1,
                    label=_step_label(v0),
                    visible=v0["at"] is not None,
                    elem_id="tour-step",
                    interactive=True,
                    scale=4,
                )
                telling = gr.Button(
                    "⤴ telling step",
                    size="sm",
                    visible=v0["at"] is not None,
                    elem_id="tour-telling",
                    scale=1,
                    min_width=110,
                )
            metrics = gr.HTML(v0["metrics"], elem_id="tour-metrics")
            tokens = gr.HTML(v0["tokens"], elem_id="tour-tokens")
            # again under the figure: on a phone the top ones are two screens up by now
            with gr.Row(elem_id="tour-low-nav"):
                prev_low = gr.Button("◀ Prev", size="sm", elem_id="tour-prev-low", min_width=70)
                next_low = gr.Button("Next ▶", size="sm", elem_id="tour-next-low", min_width=70)
    outputs = [
        narration,
        tokens,
        metrics,
        panel,
        second,
        status,
        step,
        telling,
        ask,
        reveal,
        link,
        asking,
    ]

    def drawn(key: str, at: int | None, ask_it: bool, on_lesson: bool, w: float | None) -> dict:
        """Every part of the tour for `key` at step `at` (None: its telling step)."""
        if key not in KEYS:
            return {status: message(f"no tour stop named {key!r}")}
        try:
            v = show(key, w, at, asking=ask_it, lesson=on_lesson)
        except Exception as exc:  # a recording that no longer reads: a message, not "Error"
            return {status: message(internal_error(exc))}
        run = v["at"] is not None
        return {
            narration: v["narration"],
            tokens: v["tokens"],
            metrics: v["metrics"],
            panel: v["panel"],
            second: gr.Plot(v["second"], visible=v["second"] is not None),
            status: "",
            step: gr.Slider(
                minimum=0,
                maximum=max(v["last"] or 1, 1),
                value=v["at"] or 0,
                label=_step_label(v),
                visible=run,
            ),
            telling: gr.Button(visible=run),
            ask: _ask_html(v["asked"]),
            reveal: gr.Button(visible=bool(v["asked"])),
            link: link_html(key, v["at"], on_lesson),
            asking: bool(v["asked"]),
        }

    def on_stop(key: str, on_lesson: bool, w: float | None) -> dict:
        return drawn(key, None, True, on_lesson, w)

    private = dict(api_visibility="private", show_progress="hidden")
    pick.change(
        on_stop, [pick, lesson, width], outputs, js=f"(k, l, w) => [k, l, {TOUR_WIDTH}]", **private
    )

    def on_tab(key: str, on_lesson: bool, w: float | None, evt: gr.SelectData) -> dict:
        """The tour's figure is drawn when its tab opens (at the width it opens at)."""
        if evt.value != "Tour":
            return {status: gr.skip()}
        return on_stop(key, on_lesson, w)

    tabs.select(
        on_tab, [pick, lesson, width], outputs, js=f"(k, l, w) => [k, l, {TOUR_WIDTH}]", **private
    )

    def at_step(key: str, s: float, on_lesson: bool, w: float | None) -> dict:
        return drawn(key, int(s), False, on_lesson, w)

    step.input(  # a drag, a click or the arrow keys on the slider (its last value drawn)
        at_step,
        [pick, step, lesson, width],
        outputs,
        js=f"(k, s, l, w) => [k, s, l, {TOUR_WIDTH}]",
        trigger_mode="always_last",
        **private,
    )
    telling.click(
        lambda k, on, w: drawn(k, None, False, on, w),
        [pick, lesson, width],
        outputs,
        js=f"(k, l, w) => [k, l, {TOUR_WIDTH}]",
        **private,
    )
    reveal.click(
        at_step,
        [pick, step, lesson, width],
        outputs,
        js=f"(k, s, l, w) => [k, s, l, {TOUR_WIDTH}]",
        **private,
    )

    def redraw(key: str, s: float, ask_it: bool, on_lesson: bool, w: float | None) -> dict:
        """Presenter mode on or off: the same stop, step and question, at the new width."""
        return drawn(key, None if ask_it else int(s), ask_it, on_lesson, w)

    present.click(
        redraw, [pick, step, asking, lesson, width], outputs, js=TOGGLE_PRESENT, **private
    ).then(None, None, None, js=RESIZED, api_visibility="private")

    def on_path(key: str, on_lesson: bool, w: float | None) -> dict:
        """Another path: its stops in the picker; the stop drawn again where it stays (its place
        on the lesson said), else the picker's change draws the path's first."""
        keys = path(on_lesson)
        picked = {
            pick: gr.Dropdown(choices=choices(on_lesson), value=key if key in keys else keys[0])
        }
        return picked | (drawn(key, None, True, on_lesson, w) if key in keys else {})

    lesson.input(
        on_path,
        [pick, lesson, width],
        [pick, *outputs],
        js=f"(k, l, w) => [k, l, {TOUR_WIDTH}]",
        **private,
    )

    def nudge(delta: int):
        def fn(key: str, on_lesson: bool) -> dict:
            to = moved(key, delta, on_lesson)
            if to != key:
                return {pick: to}
            keys = path(on_lesson)
            said = (
                f"This is the last stop of the {LESSON.lower()} ({len(keys)} of {len(keys)}): "
                f"take questions, or choose “{FULL}” to go on."
                if delta > 0 and on_lesson
                else "This is the tour's last stop."
                if delta > 0
                else "This is the first stop."
            )
            return {status: f"🏁 {said}"}

        return fn

    for button, delta in ((prev_btn, -1), (next_btn, 1), (prev_low, -1), (next_low, 1)):
        button.click(nudge(delta), [pick, lesson], [pick, status], api_visibility="private")
    for button, end in ((first_btn, 0), (last_btn, -1)):
        button.click(
            lambda on_lesson, end=end: path(on_lesson)[end], lesson, pick, api_visibility="private"
        )
    # the lower buttons bring the new stop's narration into view
    for button in (prev_low, next_low):
        button.click(None, None, None, js=SHOW_NARRATION, api_visibility="private")

    return TourTab(pick, live_btn)


def _step_label(v: dict) -> str:
    if v["at"] is None:
        return "Step"
    return f"Step (0–{v['last']})"


def wire_live(
    tour: TourTab,
    run: RunTab,
    compare: CompareTab,
    tabs: gr.Tabs,
    translation: gr.State,
) -> None:
    """Run it live: a stop's run in the Run tab (its method, prompt, budget and settings), the
    side-by-side stop's comparison in the Compare tab (every stop's spec, the same rounds), the
    translation stop's sentence in the lab; then the tab's own button is pressed."""

    def live(request: gr.Request, key: str) -> dict:
        if key == TRANSLATION:
            # the lab drawn on the stop's sentence (its flag carries the sentence)
            return {tabs: gr.Tabs(selected="translation"), translation: TRANSLATION_SOURCE}
        if key in KEYS and show_steps(key) is not None:  # the run opens at the stop's step
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
