"""The Run tab's state and what it shows: the controls built from a method's schema, the views at
a step or at the end of a run, a cleared page, and the form a trace fills in. No handlers here
(ui/run_tab.py builds the tab and wires them)."""

from __future__ import annotations

import html
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.core.events import Commit, Verify
from decoders.core.params import SAMPLING_PARAMS, Param
from visualizer import (
    acceptance_panel,
    extra_panels,
    forward_timeline,
    method_panel,
    metrics_html,
    quality_point,
    token_spans_html,
    tokens_per_step,
)
from visualizer.tokens import display_text

from .common import (
    quality_points,
)
from .links import UI_MAX_NEW_TOKENS, parse_param
from .live import Trace, measured_speedup
from .models import model_choices
from .tour import Opened, telling
from .tour_marks import mark

DEFAULT_METHOD = "token_tree"  # a cold page shows a method that drafts, not the grey baseline
# While streaming: tokens at most every TOKENS_EVERY_S; figures every FIGURES_EVERY_S, or less
# often when drawing them is slow (at most a quarter of the time goes to drawing), since each
# update competes with the decoding thread for the GIL.
TOKENS_EVERY_S = 0.25
HEARTBEAT_S = 0.5  # a run's handler wakes at least this often, so a Stop is never kept waiting
FIGURES_EVERY_S = 1.0
DRAW_SHARE = 0.25

# Desktop: two columns. Phone (ui/style.py): the controls column dissolves, so Run and the status
# come first, then the method's parameters (closed), then the output and the rest of the form.
# On a phone (the CSS breakpoint below): the parameters and the explainer start closed, so the
# form and the output come first; and Run brings the output into view.
PHONE = "window.matchMedia('(max-width: 768px)').matches"


def close_on_a_phone(accordion: str) -> str:
    """A `js` function that closes the accordion `accordion` (a selector) on a phone, once."""
    return f"""() => {{
  if (!{PHONE}) return;
  const label = document.querySelector('{accordion} .label-wrap');
  if (label && label.classList.contains('open')) label.click();
}}"""


CLOSE_EXPLAINER_ON_A_PHONE = close_on_a_phone("#explainer")
CLOSE_PARAMETERS_ON_A_PHONE = close_on_a_phone("#run-params")
# The method view's width in the page, handed to the server with each event that draws it (a view
# sizes its labels to it: see visualizer/panels.draw).
PLOT_WIDTH = "(document.querySelector('#panel')?.clientWidth || null)"


def with_plot_width(n_inputs: int) -> str:
    """An event's `js`: its inputs as they are, the last one (`RunTab.width`) set to the method
    view's width. (Gradio hands a `js` function the inputs and then the outputs, and sends what it
    returns as the inputs.)"""
    return f"(...a) => [...a.slice(0, {n_inputs - 1}), {PLOT_WIDTH}]"


# A resize (a phone turned, a window narrowed) redraws the views at the new width, once it has
# settled and only when the view's width changed enough to matter.
REDRAW_ON_RESIZE = f"""() => {{
  let last = {PLOT_WIDTH}, timer = null;
  window.addEventListener('resize', () => {{
    clearTimeout(timer);
    timer = setTimeout(() => {{
      const now = {PLOT_WIDTH};
      if (now && Math.abs(now - (last || 0)) > 40) {{
        last = now;
        document.querySelector('#redraw')?.click();
      }}
    }}, 300);
  }});
}}"""
COUNT_REDRAWS = "() => { window.dlRedraws = (window.dlRedraws || 0) + 1; }"
ON_LOAD = f"""() => {{
  ({CLOSE_EXPLAINER_ON_A_PHONE})();
  ({CLOSE_PARAMETERS_ON_A_PHONE})();
  ({REDRAW_ON_RESIZE})();
}}"""
# Run pressed while a run is going starts nothing (the click's trigger_mode is "once"): said
# beside the button for a few seconds, so a second press is not silently lost.
SAY_BUSY = """(() => {
  const status = document.querySelector('#status')?.innerText || '';
  if (!status.includes('⏳')) return;
  const btn = document.querySelector('#run-btn');
  let note = document.querySelector('#dl-busy');
  if (!note && btn) {
    note = document.createElement('div');
    note.id = 'dl-busy';
    note.style.cssText = 'font-size:12px;color:#b26a00;margin-top:4px';
    btn.insertAdjacentElement('afterend', note);
  }
  if (!note) return;
  note.textContent = 'A run is already going: this press started nothing (Stop ends it).';
  clearTimeout(window.dlBusyTimer);
  window.dlBusyTimer = setTimeout(() => note.remove(), 4000);
})();
"""
SHOW_OUTPUT_ON_A_PHONE = f"""() => {{
  if ({PHONE}) document.querySelector('#tokens')?.scrollIntoView({{block: 'start'}});
}}"""


# While the views show another method's run than the one picked (the method was changed, not yet
# run): dimmed, under a note that says whose run they are.
STALE_CSS = (
    "<style>#tokens, #metrics, #panel, #timeline, #per-step, #hist, [id^=panel], #step, #prev, "
    "#next, #play, #pause "
    "{opacity: .35; transition: opacity .2s}</style>"
)


def stale_note(shown: str, picked: str) -> str:
    """The note over views that show `shown`'s run while `picked` is the method chosen."""
    was = METHODS[shown].title if shown in METHODS else shown
    now = METHODS[picked].title if picked in METHODS else picked
    return (
        f'{STALE_CSS}<div class="dl-stale">ℹ️ These views are the last run\'s: '
        f"{html.escape(was)}. Press <b>Run</b> to decode with {html.escape(now)}.</div>"
    )


def _control(p: Param, method: str, value: Any = None) -> gr.components.Component:
    """A parameter's control, built from its schema (`value`: what it shows; None = its default)."""
    label = f"{p.name} — {p.help}"
    key = f"{method}-{p.name}"
    value = p.default if value is None else value
    if p.type is bool:
        return gr.Checkbox(value=value, label=label, elem_id=key, interactive=True)
    if p.choices:
        return gr.Dropdown(list(p.choices), value=value, label=label, elem_id=key, interactive=True)
    if p.type in (int, float) and p.min is not None and p.max is not None and p.max - p.min <= 1000:
        step = 1 if p.type is int else 0.01
        return gr.Slider(
            p.min, p.max, value=value, step=step, label=label, elem_id=key, interactive=True
        )
    if p.type in (int, float):
        return gr.Number(
            value=value,
            label=label,
            precision=0 if p.type is int else None,
            elem_id=key,
            interactive=True,
        )
    return gr.Textbox(value=str(value), label=label, elem_id=key, interactive=True)


def prompt_html(trace: Trace) -> str:
    """What the model sees: the prompt ids as tokens, chat template included. Special tokens are
    marked; alternating shades show where one token ends and the next begins."""
    ids = trace.meta.get("prompt_ids") or []
    spans = []
    for i, t in enumerate(ids):
        text = trace.texts.get(t, "?")
        special = text.startswith("<|") and text.endswith("|>")
        cls = "special" if special else "ab"[i % 2]
        title = html.escape(f"{text!r} · id {t} · position {i}")
        spans.append(f'<span class="{cls}" title="{title}">{display_text(text)}</span>')
    return (
        f"<div><b>What the model sees</b> — {len(ids)} prompt tokens: your prompt inside the "
        "model's chat template (prompt lookup can copy from all of it).</div>"
        f'<div class="dl-seen">{"".join(spans)}</div>'
    )


def _export(trace: Trace) -> str:
    folder = Path(tempfile.mkdtemp(prefix="decoding-lab-"))
    path = folder / f"trace-{trace.meta.get('method', 'run')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(trace.to_json())
    return str(path)


def _describe(trace: Trace) -> str:
    meta = trace.meta
    return f"{meta.get('method')} on {meta.get('model')}, {len(trace.token_ids)} tokens"


def result_panel(trace: Trace):
    """The panel beside the metrics: an early-exit run as a point on its method's benchmarked
    quality-against-compute curve; every other run, its acceptance."""
    method = trace.meta.get("method")
    if method not in METHODS or METHODS[method].family != "early exit":  # a quality-vs-layers point
        return acceptance_panel(trace.stats)
    badge = trace.meta.get("lossless") or {}
    agreement = badge.get("agreement") if badge.get("status") == "lossy" else None
    points = quality_points(str(trace.meta.get("model", "")))
    return quality_point(points, method, agreement, trace.stats.get("layers_per_token"))


def views_of(method: str) -> tuple[str, ...]:
    """The views a method declares (an unknown method, as an old trace may name: the top-k)."""
    return METHODS[method].views if method in METHODS else ("topk_panel",)


@dataclass
class RunTab:
    """The tab's components, kept by name so handlers can say what they update."""

    prompt: Any
    model: Any
    method: Any
    max_new: Any
    temperature: Any
    top_p: Any
    seed: Any
    run_btn: Any
    stop_btn: Any
    status: Any
    preset: Any
    # The chosen method's parameters are drawn by `gr.render` from `knobs` (a State: {"method":
    # name, "values": {parameter: value}}), so the page holds one method's controls, not every
    # method's; what a visitor types into them since is in `edits` ({parameter: value}).
    knobs: Any
    edits: Any
    export_btn: Any
    upload: Any
    show_seen: Any
    seen: Any
    tokens: Any
    metrics: Any
    prev_btn: Any
    play_btn: Any
    pause_btn: Any
    next_btn: Any
    telling_btn: Any  # back to the run's telling step (`opened_at`)
    step: Any
    timeline: Any
    per_step: Any
    hist: Any
    panel: Any
    extras: list[Any]
    method_help: Any
    timer: Any
    trace: Any  # gr.State holding the Trace shown (a run, its partial stream, an import)
    width: Any  # the method view's width in the page (hidden; set by each event's js)
    stale: Any  # a style that dims the views while they show another method's run
    redraw: Any  # a hidden button a resize clicks
    sampling: tuple[Any, ...] = field(default=())

    # --- views of a trace --------------------------------------------------------------------

    def step_views(
        self,
        trace: Trace,
        step: int | None,
        width: int | None = None,
        focus: tuple[str, ...] = (),
        view: str = "",
    ) -> dict:
        """Tokens and figures as they stood at `step` (None = the end), the method's views drawn
        for `width` pixels; `focus`: in the view named `view` (its first: ""), the legend entries
        kept bright while the rest is dimmed (a tour stop's, for its live run)."""
        upto = step if step is not None and step < trace.last_step else None
        at = trace.last_step if upto is None else upto
        names = views_of(trace.meta.get("method", "autoregressive"))
        main = method_panel(names, trace.events, trace.texts, at, width)
        extras = extra_panels(names, trace.events, trace.texts, at, width)
        if focus:
            shown = [main, *extras] if at > 0 else [main]  # at step 0 empty extras are left out
            i = names.index(view) if view in names else 0
            if i < len(shown):
                mark(shown[i], focus)
        return {
            self.tokens: token_spans_html(trace.events, trace.texts, upto),
            self.timeline: forward_timeline(trace.events, upto),
            self.per_step: tokens_per_step(trace.events, upto),
            self.panel: main,
            **{
                plot: gr.Plot(value=extras[i], visible=True)
                if i < len(extras)
                else gr.Plot(value=None, visible=False)
                for i, plot in enumerate(self.extras)
            },
        }

    def full_views(
        self,
        trace: Trace,
        status: str,
        width: int | None = None,
        opened: Opened | None = None,
        at_step: int | None = None,
    ) -> dict:
        """Every view of a finished (or stopped, or imported) trace, opened at its telling step
        (`opened_at`: its method's tour rule, said in the status; the tokens after it stay on
        screen, pending), or at `opened` (a tour stop's, for its live run, with the stop's
        focus marked), or at `at_step` (a link's `step`, when the run has it)."""
        if at_step is not None and 0 <= at_step <= trace.last_step:
            opened = Opened(at_step, "the link's step")
        opened = opened or opened_at(trace)
        at = opened.step
        if at < trace.last_step or opened.note:
            status += f" Opened at step {at}: {opened.why}. {opened.note}".rstrip()
        return {
            **self.step_views(trace, at, width, opened.focus, opened.view),
            self.metrics: metrics_html(
                trace.stats,
                trace.meta.get("lossless"),
                measured_speedup(trace),
                "this run, on this machine" if measured_speedup(trace) else "",
            ),
            self.hist: result_panel(trace),
            self.step: gr.Slider(
                minimum=0,
                maximum=max(trace.last_step, 1),
                value=at,
                step=1,
                interactive=True,
                label=f"Step (0–{trace.last_step})",
            ),
            self.trace: trace,
            self.export_btn: gr.DownloadButton(value=_export(trace), visible=True),
            self.seen: prompt_html(trace),
            self.status: status,
            self.stale: "",
        }

    def cleared(self, status: str) -> dict:
        """No trace: empty views, nothing to step or export (after an error, or as a run starts)."""
        return {
            self.tokens: token_spans_html([], {}),
            self.metrics: "",
            self.timeline: None,
            self.per_step: None,
            self.hist: None,
            self.panel: None,
            **{plot: gr.Plot(value=None, visible=False) for plot in self.extras},
            # Only the value: the browser applies a new maximum and value one after the other, and a
            # maximum below the value shown (a finished run's step) flashed an error badge.
            self.step: gr.Slider(value=0, interactive=False, label="Step"),
            self.trace: None,
            self.export_btn: gr.DownloadButton(visible=False),
            self.seen: "",
            self.status: status,
            self.stale: "",
        }

    @property
    def views(self) -> list[Any]:
        """Every component `full_views` and `cleared` update."""
        return [
            self.tokens,
            self.metrics,
            self.timeline,
            self.per_step,
            self.hist,
            self.panel,
            *self.extras,
            self.step,
            self.trace,
            self.export_btn,
            self.seen,
            self.status,
            self.stale,
        ]

    @property
    def form(self) -> list[Any]:
        """The run's inputs, in the order `run_stream` takes them (scripts call it so)."""
        return [
            self.model,
            self.prompt,
            self.method,
            self.max_new,
            self.temperature,
            self.top_p,
            self.seed,
            self.knobs,
            self.edits,
        ]

    def form_for(self, trace: Trace) -> dict:
        """Method, model, prompt, budget and parameters as the trace recorded them (the ones this
        page can show; the trace itself was checked before)."""
        meta = trace.meta
        method = meta["method"]
        out: dict[Any, Any] = {self.method: method}
        if meta["model"] in {v for _, v in model_choices()}:
            out[self.model] = meta["model"]
        if isinstance(meta.get("prompt"), str):
            out[self.prompt] = meta["prompt"]
        if meta["max_new_tokens"] <= UI_MAX_NEW_TOKENS:
            out[self.max_new] = meta["max_new_tokens"]
        by_name = {p.name: p for p in (*METHODS[method].knobs, *SAMPLING_PARAMS)}
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}
        values = METHODS[method].preset("defaults")
        for name, raw in (meta.get("params") or {}).items():
            if name not in by_name:
                continue
            try:
                value = parse_param(by_name[name], raw)
            except DecodingLabError:
                continue  # a value this build would refuse: keep the form's
            if name in sampling:
                out[sampling[name]] = value
            else:
                values[name] = value
        return out | self.knobs_for(method, values)

    def knobs_for(self, method: str, values: dict[str, Any]) -> dict:
        """The method's controls drawn anew with these values (nothing typed since)."""
        return {self.knobs: {"method": method, "values": values}, self.edits: {}}


def knob_values(method: str, knobs: dict | None, edits: dict | None) -> dict[str, Any]:
    """The parameters a run of `method` takes from the form, by name: the values its controls
    were drawn with and what was typed into them since; a method whose controls are not drawn
    (an API call naming another one) runs at its defaults."""
    if method not in METHODS:
        return {}
    if not knobs or knobs.get("method") != method:
        return METHODS[method].preset("defaults")
    return {**knobs["values"], **(edits or {})}


def showcase(trace: Trace) -> tuple[int, str]:
    """The step a page opens at when its method has no tour rule: the one where the target
    accepted the most drafted tokens (the first such: its method panel has the most to show);
    without verification (Mask-Predict's blocks), the one that committed the most tokens; else
    the last step."""
    accepted = {e.step: len(e.accepted) for e in trace.events if isinstance(e, Verify)}
    if any(accepted.values()):
        best = max(accepted.values())
        return min(s for s, n in accepted.items() if n == best), f"{best} drafted tokens accepted"
    several = {e.step: len(e.tokens) for e in trace.events if isinstance(e, Commit)}
    if several and max(several.values()) > 1:
        most = max(several.values())
        step = min(s for s, n in several.items() if n == most)
        return step, f"{most} tokens committed in one step"
    return trace.last_step, "the last step"


def opened_at(trace: Trace) -> Opened:
    """Where a finished run opens (and "telling step" goes): its method's telling step, by the
    rule the tour's stop of that method states (ui/tour.telling), else `showcase`'s step."""
    told = telling(trace)
    if told is not None:
        return told
    return Opened(*showcase(trace))


def showcase_step(trace: Trace) -> int:
    return opened_at(trace).step
