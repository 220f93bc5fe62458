"""The Run tab: prompt, model, method, Run/Stop; then the method's preset and parameters; the live
output beside them (on a phone, directly under Run); step-through; trace export and import; and the
link that pre-fills it all.

Every handler returns a `{component: value}` dict, so an update names what it changes. Project
errors become a message in the status line and clear the views they would have made stale.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.core.events import Forward
from decoders.core.params import SAMPLING_PARAMS
from decoders.core.tracefile import MAX_TRACE_BYTES
from visualizer import (
    acceptance_panel,
    extra_panels,
    forward_timeline,
    method_panel,
    metrics_html,
    token_spans_html,
    tokens_per_step,
)
from visualizer.panels import MAX_EXTRA_PANELS

from .common import (
    budget_slider,
    explainer,
    gpu,
    internal_error,
    message,
    model_picker,
)
from .links import parse_link
from .live import Trace, in_background, run_live, stopped
from .models import model_choices
from .run_views import (
    COUNT_REDRAWS,
    DEFAULT_METHOD,
    DRAW_SHARE,
    FIGURES_EVERY_S,
    HEARTBEAT_S,
    ON_LOAD,
    SAY_BUSY,
    SHOW_OUTPUT_ON_A_PHONE,
    TOKENS_EVERY_S,
    RunTab,
    _control,
    _describe,
    _export,
    knob_values,
    prompt_html,
    showcase_step,
    stale_note,
    views_of,
    with_plot_width,
)
from .tour import tour_step
from .traces import EXAMPLE_PROMPTS, load_example, read_trace, recheck_lossless


def build_run_tab(demo: gr.Blocks) -> RunTab:
    """Call inside a `gr.Tab`: lays the tab out, wires its handlers and the link pre-fill."""
    example = load_example()
    start = _initial(example)
    with gr.Row(elem_id="run-row"):
        with gr.Column(scale=2, min_width=320, elem_id="run-controls"):
            form = _form(demo, example, start)
        with gr.Column(scale=3, min_width=320, elem_id="run-output"):
            output = _output(start)
    tab = RunTab(
        **form,
        **output,
        timer=gr.Timer(0.6, active=False),
        trace=gr.State(example),  # the cold page's views are the example's: step through it
        sampling=(form["temperature"], form["top_p"], form["seed"]),
    )
    _wire(tab, demo)
    return tab


def _form(demo: gr.Blocks, example: Trace | None, start: dict[str, Any]) -> dict[str, Any]:
    """The left column: prompt, model, method, budget, Run/Stop and the status line on top; then the
    preset and the method's parameters (one group shown); then example prompts, sampling and trace
    files. On a phone the output comes between the parameters and the rest (CSS)."""
    method_choices = [(m.title, name) for name, m in METHODS.items()]
    with gr.Column(elem_id="run-top"):
        prompt = gr.Textbox(label="Prompt", lines=5, value=EXAMPLE_PROMPTS[0], elem_id="prompt")
        # One above the other: side by side, the methods' names were cut mid-word.
        model = model_picker(model_choices(), "model")
        method = gr.Dropdown(method_choices, value=DEFAULT_METHOD, label="Method", elem_id="method")
        max_new = budget_slider("max-new-tokens")
        with gr.Row():
            run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
        status = gr.Markdown(
            f"📂 An example run, recorded: {_describe(example)}. Press **Run** to decode "
            "live, then step through it."
            if example
            else "",
            elem_id="status",
        )
    with gr.Column(elem_id="run-knobs"):
        preset = gr.Dropdown(
            _preset_choices(DEFAULT_METHOD),
            value="defaults",
            label="Preset (sets the parameters below)",
            info="defaults = our best settings on this machine; paper = the paper's",
            elem_id="preset",
        )
        # The chosen method's controls only, drawn anew when another method, a preset, a link or
        # a trace sets them (`knobs`); what is typed into them goes to `edits`, by name.
        knobs = gr.State({"method": DEFAULT_METHOD, "values": _defaults(DEFAULT_METHOD)})
        edits = gr.State({})
        _draw_knobs(demo, knobs, edits)
    with gr.Column(elem_id="run-more"):
        gr.Examples([[p] for p in EXAMPLE_PROMPTS], [prompt], label="Example prompts")
        with gr.Accordion("Sampling (temperature 0 = greedy, lossless)", open=False):
            temperature, top_p, seed = (_control(p, "sampling") for p in SAMPLING_PARAMS)
        with gr.Accordion("Trace file: export / import", open=False):
            export_btn = gr.DownloadButton(
                "Export trace (JSON)",
                value=start["export"],
                visible=start["export"] is not None,
                elem_id="export",
            )
            upload = gr.File(
                label="Import a trace to replay (no model needed)",
                # any file: ours is the message that names what is wrong with it (gradio's own
                # type check answered a .png with a bare "Error" in the box)
                type="filepath",
                elem_id="import",
            )
    return dict(
        prompt=prompt,
        model=model,
        method=method,
        max_new=max_new,
        run_btn=run_btn,
        stop_btn=stop_btn,
        status=status,
        preset=preset,
        knobs=knobs,
        edits=edits,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        export_btn=export_btn,
        upload=upload,
    )


def _output(start: dict[str, Any]) -> dict[str, Any]:
    """The right column: the tokens and metrics, step-through with the method's views under it,
    the timeline and per-step charts, the explainer (open on a desktop, closed on a phone)."""
    show_seen = gr.Checkbox(
        False, label="Show what the model sees (the chat template)", elem_id="show-seen"
    )
    seen = gr.HTML(start["seen"], visible=False, elem_id="seen")
    stale = gr.HTML("", padding=False, container=False, elem_id="stale")
    tokens = gr.HTML(start["tokens"], elem_id="tokens")
    metrics = gr.HTML(start["metrics"], elem_id="metrics")
    with gr.Row(equal_height=True):
        prev_btn = gr.Button("◀ Prev", size="sm", elem_id="prev", min_width=60)
        play_btn = gr.Button("▶ Play", size="sm", elem_id="play", min_width=60)
        pause_btn = gr.Button("⏸ Pause", size="sm", elem_id="pause", min_width=60)
        next_btn = gr.Button("Next ▶", size="sm", elem_id="next", min_width=60)
    last = start["last_step"]
    step = gr.Slider(
        0,
        max(last or 0, 1),
        value=start["step"] or 0,
        step=1,
        label="Step" if last is None else f"Step (0–{last})",
        interactive=last is not None,
        elem_id="step",
    )
    # The method's own views right under the slider that drives them (a phone sees both at once),
    # then the timeline and the per-step charts.
    panel = gr.Plot(start["panel"], label="Method panel", elem_id="panel", show_label=False)
    extras = [
        gr.Plot(
            start["extras"][i] if i < len(start["extras"]) else None,
            visible=i < len(start["extras"]),
            elem_id=f"panel{i + 2}",
            show_label=False,
        )
        for i in range(EXTRA_PANELS)  # a method's further views, stacked
    ]
    timeline = gr.Plot(
        start["timeline"], label="Forward passes", elem_id="timeline", show_label=False
    )
    with gr.Row():
        per_step = gr.Plot(
            start["per_step"], label="Tokens per step", elem_id="per-step", show_label=False
        )
        hist = gr.Plot(start["hist"], label="Acceptance", elem_id="hist", show_label=False)
    with gr.Accordion("How this method works", open=True, elem_id="explainer"):
        method_help = gr.Markdown(explainer(DEFAULT_METHOD))
    width = gr.Number(None, visible=False, elem_id="plot-width")
    redraw = gr.Button("redraw", elem_id="redraw", elem_classes=["dl-hidden"])
    return dict(
        stale=stale,
        width=width,
        redraw=redraw,
        show_seen=show_seen,
        seen=seen,
        tokens=tokens,
        metrics=metrics,
        prev_btn=prev_btn,
        play_btn=play_btn,
        pause_btn=pause_btn,
        next_btn=next_btn,
        step=step,
        timeline=timeline,
        per_step=per_step,
        hist=hist,
        panel=panel,
        extras=extras,
        method_help=method_help,
    )


# As many further views as the method that declares the most draws (at most MAX_EXTRA_PANELS).
EXTRA_PANELS = min(MAX_EXTRA_PANELS, max(len(m.views) for m in METHODS.values()) - 1)


def _initial(example: Trace | None) -> dict[str, Any]:
    """The cold page's views: the example trace at its showcase step, or empty ones."""
    if example is None:
        empty = token_spans_html([], {})
        return dict(
            tokens=empty,
            metrics="",
            seen="",
            timeline=None,
            per_step=None,
            hist=None,
            panel=None,
            extras=[],
            last_step=None,
            step=None,
            export=None,
        )
    method = example.meta["method"]
    at = showcase_step(example)
    upto = at if at < example.last_step else None
    return dict(
        tokens=token_spans_html(example.events, example.texts, upto),
        metrics=metrics_html(example.stats, example.meta.get("lossless")),
        seen=prompt_html(example),
        timeline=forward_timeline(example.events, upto),
        per_step=tokens_per_step(example.events, upto),
        hist=acceptance_panel(example.stats),
        panel=method_panel(views_of(method), example.events, example.texts, at),
        extras=extra_panels(views_of(method), example.events, example.texts, at),
        last_step=example.last_step,
        step=at,
        export=_export(example),
    )


def _preset_choices(method: str) -> list[str]:
    return ["defaults", *METHODS[method].presets]


def _defaults(method: str) -> dict[str, Any]:
    return METHODS[method].preset("defaults")


def _draw_knobs(demo: gr.Blocks, knobs: gr.State, edits: gr.State) -> None:
    """The chosen method's parameters, as controls built from its schema (`_control`), drawn
    where this is called: on load and whenever `knobs` is set. A value typed into one is kept in
    `edits` under the parameter's name, where Run reads it."""

    @gr.render(inputs=[knobs], triggers=[demo.load, knobs.change], show_progress="hidden")
    def draw(state: dict | None) -> None:
        method = (state or {}).get("method")
        if method not in METHODS:
            return
        values = state["values"]
        with gr.Group(elem_id="knobs"):
            for p in METHODS[method].knobs:
                control = _control(p, method, values.get(p.name))
                control.change(
                    _typed(p.name),
                    [control, edits],
                    edits,
                    queue=False,  # before a Run pressed right after it
                    api_visibility="private",
                    show_progress="hidden",
                )


def _typed(name: str) -> Callable[[Any, dict | None], dict]:
    def keep(value: Any, edits: dict | None) -> dict:
        return {**(edits or {}), name: value}

    return keep


def _wire(t: RunTab, demo: gr.Blocks) -> None:
    _wire_run(t)
    _wire_stepping(t, demo)
    _wire_trace_files(t)
    _wire_method(t)
    _wire_links(t, demo)


def _run_handler(t: RunTab) -> Callable[..., Iterator[dict]]:
    """Run: decode live, streaming the tokens at once and the figures as often as drawing them
    leaves time for decoding; the finished run's full views at the end."""

    @gpu
    def on_run(
        request: gr.Request, model_id, prompt_text, method_name, budget, temp, tp, sd, knobs, edits
    ) -> Iterator[dict]:
        session, begun = getattr(request, "session_hash", None), time.monotonic()
        REPLACED.add(session)
        width = WIDTHS.get(session)  # the view's width the page last said (load, resize, step)
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
                if STOPS.get(session, 0.0) > begun:  # Stop: what was decoded stays, to step
                    yield _stopped_views(t, trace, width)
                    return
                if not batch:
                    waited = f"{time.perf_counter() - started:.0f} s"
                    yield {t.status: f"⏳ encoding the prompt… {waited}" if not n else gr.skip()}
                    continue
                for live in batch:
                    trace = live.trace
                    n = len(trace.token_ids)
                    if live.done:
                        reason = trace.meta.get("finish_reason")
                        # a tour stop's live run opens at the step the stop's rule picks
                        opened = tour_step(session, trace)
                        # the run's own method named over its results (the picker may have moved)
                        title = (
                            METHODS[method_name].title if method_name in METHODS else method_name
                        )
                        done = f"✅ Done: {n} tokens ({reason}), decoded by {title}."
                        yield t.full_views(trace, done, width, opened)
                        return
                    if live.phase == "checking":
                        yield {t.status: f"⏳ checking against greedy… ({n} tokens decoded)"}
                        continue
                    # as the finished run's card says: the prompt's forward apart
                    # (the prefill is the run's first forward: found at once, not by a scan)
                    prefill_s = (
                        next(
                            (
                                e.wall_ms
                                for e in trace.events
                                if isinstance(e, Forward) and e.kind == "prefill"
                            ),
                            0.0,
                        )
                        / 1000.0
                    )
                    decoding_s = live.elapsed_s - prefill_s if live.elapsed_s else 0.0
                    update: dict[Any, Any] = {
                        t.tokens: token_spans_html(trace.events, trace.texts),
                        t.metrics: metrics_html(
                            {
                                "tokens_per_s": n / decoding_s if decoding_s > 0 else None,
                                "ttft_s": prefill_s or None,
                                "new_tokens": n,
                            }
                        ),
                        t.trace: trace,  # the partial trace: Stop keeps it for stepping and export
                        t.status: f"⏳ decoding… {n} tokens",
                    }
                    if first:
                        update[t.seen] = prompt_html(trace)
                        first = False
                    now = time.perf_counter()
                    if now - figures_at >= max(FIGURES_EVERY_S, draw_s / DRAW_SHARE):
                        method = trace.meta["method"]
                        update |= {
                            t.timeline: forward_timeline(trace.events),
                            t.per_step: tokens_per_step(trace.events),
                            t.panel: method_panel(
                                views_of(method), trace.events, trace.texts, trace.last_step, width
                            ),
                        }
                        figures_at = time.perf_counter()
                        draw_s = figures_at - now
                    yield update
        except DecodingLabError as exc:
            yield t.cleared(message(str(exc)))
        except Exception as exc:  # the boundary: a message, never a bare "Error"
            yield t.cleared(message(internal_error(exc)))

    return on_run


# Stop, per browser session: when it was last pressed. The run in that session sees it within a
# heartbeat and ends itself, keeping what it decoded. (Gradio's own `cancels` left the Run button
# pending until the cancelled handler's thread came back, and dropped the next Run meanwhile.)
STOPS: dict[str | None, float] = {}
# The method view's width in pixels, per session, as the page last said it (at load, on a resize,
# with each step): a run draws its views for it (the `run_stream` API keeps its inputs).
WIDTHS: dict[str | None, int | None] = {}
# The sessions whose views a run or an import has replaced: the page's opening redraw of its
# example leaves them alone.
REPLACED: set[str | None] = set()


def stale_for(picked: str, trace: Trace | None) -> str:
    """The figures still show the last run: say whose when another method is picked, so nobody
    reads them as this method's (they are dimmed until a run of this method replaces them)."""
    shown = trace.meta.get("method") if trace is not None else None
    return stale_note(shown, picked) if shown is not None and shown != picked else ""


def forget(session: str | None) -> None:
    """A page closed (or reloaded: a new session): drop what this module kept for it. A run still
    streaming to it has already ended: a dropped connection closes its handler (`in_background`)."""
    STOPS.pop(session, None)
    WIDTHS.pop(session, None)
    REPLACED.discard(session)


def _stopped_views(t: RunTab, trace: Trace | None, width: int | None) -> dict:
    """A run cut short by Stop: its views as they stood, to step through and export."""
    if trace is None or not trace.token_ids:
        return t.cleared("⏹ Stopped before the first token.")
    kept = stopped(trace)
    return t.full_views(
        kept,
        f"⏹ Stopped at {len(kept.token_ids)} tokens: step through what was decoded, or export it.",
        width,
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
        lambda name, trace: stale_for(name, trace),
        [t.method, t.trace],
        t.stale,
        api_visibility="private",
        show_progress="hidden",
    )

    def on_stop(request: gr.Request) -> dict:
        STOPS[getattr(request, "session_hash", None)] = time.monotonic()
        return {t.status: gr.skip()}

    t.stop_btn.click(on_stop, None, t.status, api_visibility="private", show_progress="hidden")


def _wire_stepping(t: RunTab, demo: gr.Blocks) -> None:
    """The step slider, Prev / Next, Play / Pause."""
    step_outputs = [t.tokens, t.timeline, t.per_step, t.panel, *t.extras]

    def on_step(request: gr.Request, trace: Trace | None, s: float, width: int | None) -> dict:
        WIDTHS[getattr(request, "session_hash", None)] = width
        if trace is None or trace.meta.get("finish_reason") is None:
            return {t.tokens: gr.skip()}  # nothing to step, or a run still streaming
        return t.step_views(trace, int(s), width)

    def on_open(request: gr.Request, trace: Trace | None, s: float, width: int | None) -> dict:
        """The example drawn for the page's width, unless a run or an import already replaced
        it: on a busy server this redraw can land after a quick import (a bad file's cleared
        views would show the example again)."""
        session = getattr(request, "session_hash", None)
        if session in REPLACED:
            return {t.tokens: gr.skip()}
        views = on_step(request, trace, s, width)
        return {t.tokens: gr.skip()} if session in REPLACED else views  # replaced meanwhile

    # A step moved, a resize (the views' new width), or the page opening on its example (drawn
    # for a phone's width until the page says its own).
    for trigger, fn, counted in (
        (t.step.change, on_step, False),
        (t.redraw.click, on_step, True),
        (demo.load, on_open, False),
    ):
        event = trigger(
            fn,
            [t.trace, t.step, t.width],
            step_outputs,
            js=with_plot_width(3),
            api_visibility="private",
            show_progress="hidden",
        )
        if counted:  # a count of finished redraws, for whoever waits on one (the browser tests)
            event.then(None, None, None, js=COUNT_REDRAWS, api_visibility="private")

    def nudge(delta: int):
        def fn(trace: Trace | None, s: float) -> dict:
            if trace is None:
                return {t.step: gr.skip()}
            return {t.step: min(max(int(s) + delta, 0), trace.last_step)}

        return fn

    t.prev_btn.click(nudge(-1), [t.trace, t.step], t.step, api_visibility="private")
    t.next_btn.click(nudge(+1), [t.trace, t.step], t.step, api_visibility="private")

    def play(trace: Trace | None, s: float) -> dict:
        if trace is None:
            return {t.step: gr.skip()}
        start = 0 if int(s) >= trace.last_step else int(s)
        return {t.timer: gr.Timer(active=True), t.step: start}

    t.play_btn.click(play, [t.trace, t.step], [t.timer, t.step], api_visibility="private")
    t.pause_btn.click(
        lambda: {t.timer: gr.Timer(active=False)}, None, t.timer, api_visibility="private"
    )

    def tick(trace: Trace | None, s: float) -> dict:
        if trace is None or int(s) >= trace.last_step:
            return {t.timer: gr.Timer(active=False)}
        return {t.step: int(s) + 1}

    t.timer.tick(
        tick, [t.trace, t.step], [t.timer, t.step], api_visibility="private", show_progress="hidden"
    )


def _wire_trace_files(t: RunTab) -> None:
    """Import a trace: replay it with no model, then re-check it against greedy."""

    @gpu
    def on_import(request: gr.Request, path: str | None, width: int | None) -> Iterator[dict]:
        if path:  # a file, good or bad, replaces the views
            REPLACED.add(getattr(request, "session_hash", None))
        try:
            yield from import_trace(path, width)
        except Exception as exc:  # the boundary: a message, never a bare "Error"
            yield {t.status: message(internal_error(exc))}  # what was on screen stays

    def import_trace(path: str | None, width: int | None) -> Iterator[dict]:
        if not path:
            yield {t.status: gr.skip()}
            return
        try:
            if os.path.getsize(path) > MAX_TRACE_BYTES:
                raise DecodingLabError(f"trace file is larger than {MAX_TRACE_BYTES // 2**20} MiB")
            trace = read_trace(Path(path).read_bytes())
        except (DecodingLabError, OSError) as exc:  # the run on screen stays, to step and export
            yield {t.status: message(f"Could not import the trace: {exc}")}
            return
        trace.meta["lossless"] = {"status": "not checked", "note": "checking against greedy…"}
        replay = f"📂 Replaying an imported trace: {_describe(trace)}."
        yield {
            **t.full_views(trace, f"{replay} ⏳ checking against greedy…", width),
            **t.form_for(trace),
        }
        try:
            trace.meta["lossless"] = recheck_lossless(trace)
        except DecodingLabError as exc:
            trace.meta["lossless"] = {"status": "not checked", "note": f"not checked: {exc}"}
        yield {
            t.metrics: metrics_html(trace.stats, trace.meta["lossless"]),
            t.export_btn: gr.DownloadButton(value=_export(trace), visible=True),
            t.status: replay,
        }

    t.upload.upload(
        on_import,
        [t.upload, t.width],
        [*t.views, *t.form],
        js=with_plot_width(2),
        api_visibility="private",
        concurrency_id="decode",  # its greedy re-check is a decode: queued with the runs
        show_progress="hidden",
    ).then(lambda: None, None, t.upload, api_visibility="private")  # ready for another file


def _wire_method(t: RunTab) -> None:
    """A method's parameters, preset and explainer; the chat template's view."""

    def on_method(name: str, trace: Trace | None) -> dict:
        if name not in METHODS:
            return {t.method_help: gr.skip()}
        return {
            t.method_help: explainer(name),
            t.preset: gr.Dropdown(choices=_preset_choices(name)),  # its value: see below
            t.stale: stale_for(name, trace),
        }

    t.method.change(
        on_method,
        [t.method, t.trace],
        [t.method_help, t.preset, t.stale],
        api_visibility="private",
    )

    def on_pick(name: str) -> dict:
        """A visitor's new method starts from its defaults; a link's, a trace's or a tour stop's
        method comes with its own values (set beside it)."""
        if name not in METHODS:
            return {t.preset: gr.skip()}
        return {t.preset: "defaults", **t.knobs_for(name, _defaults(name))}

    t.method.input(on_pick, t.method, [t.preset, t.knobs, t.edits], api_visibility="private")

    def on_preset(method_name: str, preset_name: str) -> dict:
        """A visitor's pick sets the method's controls (only then: a link's values stay)."""
        if method_name not in METHODS or preset_name is None:
            return {t.status: gr.skip()}
        m = METHODS[method_name]
        try:
            values = m.preset(preset_name)
        except KeyError:
            return {t.status: gr.skip()}
        return t.knobs_for(method_name, values)

    t.preset.input(
        on_preset,
        [t.method, t.preset],
        [t.knobs, t.edits, t.status],
        api_visibility="private",
    )
    t.show_seen.change(
        lambda on: {t.seen: gr.HTML(visible=on)}, t.show_seen, t.seen, api_visibility="private"
    )


def _wire_links(t: RunTab, demo: gr.Blocks) -> None:
    """Links: URL parameters pre-fill the form."""

    def from_url(request: gr.Request) -> dict:
        query = dict(request.query_params) if request else {}
        out: dict[Any, Any] = {t.status: gr.skip()}  # gradio reads an empty dict as one value
        if not query or getattr(request, "session_hash", None) in REPLACED:
            return out  # (a quick import's form and status stand: this load came late)
        link = parse_link(query, DEFAULT_METHOD)
        method = link.fields.get("method", DEFAULT_METHOD)
        fields = {
            "model": t.model,
            "prompt": t.prompt,
            "method": t.method,
            "max_new_tokens": t.max_new,
            "temperature": t.temperature,
            "top_p": t.top_p,
            "seed": t.seed,
        }
        out |= {fields[k]: v for k, v in link.fields.items() if k in fields}
        if "method" in link.fields or link.params:
            out |= t.knobs_for(method, _defaults(method) | dict(link.params))
        if "preset" in link.fields:
            out[t.preset] = gr.Dropdown(
                choices=_preset_choices(method), value=link.fields["preset"]
            )
        if link.errors:
            out[t.status] = message("This link has problems: " + "; ".join(link.errors))
        elif link.fields.keys() & {"prompt", "method", "model", "preset"} or link.params:
            # The views below still show the recorded example: say so, or a shared link reads as
            # if its prompt had produced that output.
            out[t.status] = (
                f"🔗 This link filled in the form ({method}). Press **Run** to decode it; until "
                "then the views below show the recorded example."
            )
        return out

    demo.load(None, None, None, js=ON_LOAD, api_visibility="private")
    demo.load(
        from_url,
        None,
        [*t.form, t.preset, t.status],
        api_visibility="private",
        show_progress="hidden",
    )
