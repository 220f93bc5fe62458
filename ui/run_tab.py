"""The Run tab: prompt, model, method, Run/Stop; then the method's preset and parameters; the live
output beside them (on a phone, directly under Run); step-through; trace export and import; and the
link that pre-fills it all.

Every handler returns a `{component: value}` dict, so an update names what it changes. Project
errors become a message in the status line and clear the views they would have made stale.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.core.events import Forward
from visualizer import (
    forward_timeline,
    method_panel,
    metrics_html,
    token_spans_html,
    tokens_per_step,
)

from . import run_session as sessions
from .common import (
    gpu,
    internal_error,
    message,
)
from .live import Trace, in_background, run_live, stopped
from .run_form import form_column, initial_views, output_column
from .run_session import forget  # noqa: F401  (the page forgets a closed session)
from .run_views import (
    DRAW_SHARE,
    FIGURES_EVERY_S,
    HEARTBEAT_S,
    SAY_BUSY,
    SHOW_OUTPUT_ON_A_PHONE,
    TOKENS_EVERY_S,
    RunTab,
    knob_values,
    prompt_html,
    views_of,
)
from .run_wires import wire_links, wire_method, wire_stepping, wire_trace_files
from .tour import Opened, tour_step
from .tour_tab import LANDED
from .traces import load_example


def build_run_tab(demo: gr.Blocks) -> RunTab:
    """Call inside a `gr.Tab`: lays the tab out, wires its handlers and the link pre-fill."""
    example = load_example()
    start = initial_views(example)
    with gr.Row(elem_id="run-row"):
        with gr.Column(scale=2, min_width=320, elem_id="run-controls"):
            form = form_column(demo, example, start)
        with gr.Column(scale=3, min_width=320, elem_id="run-output"):
            output = output_column(start)
    tab = RunTab(
        **form,
        **output,
        timer=gr.Timer(0.6, active=False),
        trace=gr.State(example),  # the cold page's views are the example's: step through it
        sampling=(form["temperature"], form["top_p"], form["seed"]),
    )
    _wire(tab, demo)
    return tab


def _wire(t: RunTab, demo: gr.Blocks) -> None:
    _wire_run(t)
    wire_stepping(t, demo)
    wire_trace_files(t)
    wire_method(t)
    wire_links(t, demo)


def _run_handler(t: RunTab) -> Callable[..., Iterator[dict]]:
    """Run: decode live, streaming the tokens at once and the figures as often as drawing them
    leaves time for decoding; the finished run's full views at the end."""

    @gpu
    def on_run(
        request: gr.Request, model_id, prompt_text, method_name, budget, temp, tp, sd, knobs, edits
    ) -> Iterator[dict]:
        session, begun = getattr(request, "session_hash", None), time.monotonic()
        sessions.REPLACED.add(session)
        width = sessions.WIDTHS.get(session)  # as the page last said it (load, resize, step)
        sampling = method_name in METHODS and METHODS[method_name].sampling
        params: dict[str, Any] = {"temperature": temp, "top_p": tp, "seed": sd} if sampling else {}
        params |= knob_values(method_name, knobs, edits)
        # Clear the previous run's views at once, so what streams next is this run.
        yield t.cleared("⏳ loading the model and encoding the prompt…")
        try:
            figures_at, draw_s, first, trace = 0.0, 0.0, True, None
            started, n = time.perf_counter(), 0
            runs = run_live(
                model_id, prompt_text, method_name, budget, params, every_s=TOKENS_EVERY_S
            )
            # In a thread of its own, beside this handler: while a long prompt is encoded (or the
            # greedy check runs) the handler still wakes twice a second, so a Stop ends it at once.
            for batch in in_background(runs, heartbeat_s=HEARTBEAT_S, name="run"):
                if sessions.STOPS.get(session, 0.0) > begun:  # Stop: what was decoded stays
                    yield _stopped_views(t, trace, width)
                    return
                if not batch:
                    waited = f"{time.perf_counter() - started:.0f} s"
                    yield {t.status: f"⏳ encoding the prompt… {waited}" if not n else gr.skip()}
                    continue
                for live in batch:
                    trace = live.trace
                    n = len(trace.token_ids)
                    if live.done:  # a tour stop's live run opens at the step its rule picks
                        yield t.full_views(
                            trace,
                            _done(trace, method_name),
                            width,
                            tour_step(session, trace),
                            sessions.LINK_STEPS.pop(session, None),
                        )
                        return
                    if live.phase == "checking":
                        yield {t.status: f"⏳ checking against greedy… ({n} tokens decoded)"}
                        continue
                    update = _streamed(t, trace, live.elapsed_s)
                    if first:
                        update[t.seen] = prompt_html(trace)
                        first = False
                    now = time.perf_counter()
                    if now - figures_at >= max(FIGURES_EVERY_S, draw_s / DRAW_SHARE):
                        update |= _figures(t, trace, width)
                        figures_at = time.perf_counter()
                        draw_s = figures_at - now
                    yield update
        except DecodingLabError as exc:
            yield t.cleared(message(str(exc)))
        except Exception as exc:  # the boundary: a message, never a bare "Error"
            yield t.cleared(message(internal_error(exc)))

    return on_run


def _done(trace: Trace, method_name: str) -> str:
    """The finished run's status, its own method named (the picker may have moved since)."""
    title = METHODS[method_name].title if method_name in METHODS else method_name
    reason = trace.meta.get("finish_reason")
    return f"✅ Done: {len(trace.token_ids)} tokens ({reason}), decoded by {title}."


def _streamed(t: RunTab, trace: Trace, elapsed_s: float | None) -> dict[Any, Any]:
    """A streaming run's tokens, speed so far and status (its figures: `_figures`). The speed is
    the finished run's card's: the prompt's forward apart (the run's first forward)."""
    n = len(trace.token_ids)
    prefill_ms = next(
        (e.wall_ms for e in trace.events if isinstance(e, Forward) and e.kind == "prefill"), 0.0
    )
    prefill_s = prefill_ms / 1000.0
    decoding_s = elapsed_s - prefill_s if elapsed_s else 0.0
    speed = {
        "tokens_per_s": n / decoding_s if decoding_s > 0 else None,
        "ttft_s": prefill_s or None,
        "new_tokens": n,
    }
    return {
        t.tokens: token_spans_html(trace.events, trace.texts),
        t.metrics: metrics_html(speed),
        t.trace: trace,  # the partial trace: Stop keeps it for stepping and export
        t.status: f"⏳ decoding… {n} tokens",
    }


def _figures(t: RunTab, trace: Trace, width: int | None) -> dict[Any, Any]:
    """A streaming run's timeline, per-step chart and method panel, at the last step."""
    views = views_of(trace.meta["method"])
    return {
        t.timeline: forward_timeline(trace.events),
        t.per_step: tokens_per_step(trace.events),
        t.panel: method_panel(views, trace.events, trace.texts, trace.last_step, width),
    }


def _stopped_views(t: RunTab, trace: Trace | None, width: int | None) -> dict:
    """A run cut short by Stop: its views as they stood, to step through and export."""
    if trace is None or not trace.token_ids:
        return t.cleared("⏹ Stopped before the first token.")
    kept = stopped(trace)
    return t.full_views(
        kept,
        f"⏹ Stopped at {len(kept.token_ids)} tokens: step through what was decoded, or export it.",
        width,
        Opened(kept.last_step, "where Stop ended it"),  # where it stood, not its telling step
    )


def _wire_run(t: RunTab) -> None:
    """Run, stream, Stop; after a run the form shows the values it used."""
    on_run = _run_handler(t)
    t.run_btn.click(
        None,
        None,
        None,
        js=f"() => {{ {SAY_BUSY} ({SHOW_OUTPUT_ON_A_PHONE})(); }}",
        api_visibility="private",
    )
    run_event = t.run_btn.click(
        on_run,
        t.form,
        t.views,
        # Run pressed again while a run is going starts nothing (a double-click is one run): the
        # page says so beside the button (SAY_BUSY); Stop ends the run within a heartbeat.
        trigger_mode="once",
        api_name="run_stream",
        api_visibility="undocumented",  # scripts may stream it too (scripts/bench_ui.py)
        concurrency_id="decode",
        show_progress="hidden",  # our status line says it; animated overlays cost CPU
    )

    def snap(trace: Trace | None) -> dict:
        """The boxes show what the run used: a slider's box keeps a typed 9999 while the browser
        sends its maximum, so after a run the form is set to the trace's own values."""
        if trace is None or trace.meta.get("finish_reason") is None:
            return {t.status: gr.skip()}
        form = t.form_for(trace)
        return {c: v for c, v in form.items() if c not in (t.method, t.model, t.prompt)} or {
            t.status: gr.skip()
        }

    run_event.then(
        snap,
        t.trace,
        [t.max_new, t.temperature, t.top_p, t.seed, t.knobs, t.edits, t.status],
        api_visibility="private",
        show_progress="hidden",
    ).then(
        # a method picked while the run streamed: its results stay marked as the run's own
        lambda name, trace: sessions.stale_for(name, trace),
        [t.method, t.trace],
        t.stale,
        api_visibility="private",
        show_progress="hidden",
    ).then(None, None, None, js=LANDED, api_visibility="private")  # a tour's live run: its figure

    def on_stop(request: gr.Request) -> dict:
        sessions.STOPS[getattr(request, "session_hash", None)] = time.monotonic()
        return {t.status: gr.skip()}

    t.stop_btn.click(on_stop, None, t.status, api_visibility="private", show_progress="hidden")
