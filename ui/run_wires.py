"""The Run tab's handlers for stepping, trace files, the method picker and presets, and links."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.core.tracefile import MAX_TRACE_BYTES
from visualizer import (
    metrics_html,
)

from . import run_session as sessions
from .common import (
    explainer,
    gpu,
    internal_error,
    message,
)
from .links import parse_link
from .live import Trace
from .run_form import defaults, preset_choices
from .run_views import (
    COUNT_REDRAWS,
    DEFAULT_METHOD,
    ON_LOAD,
    RunTab,
    _describe,
    _export,
    opened_at,
    with_plot_width,
)
from .traces import read_trace, recheck_lossless


def wire_stepping(t: RunTab, demo: gr.Blocks) -> None:
    """The step slider, Prev / Next, Play / Pause."""
    step_outputs = [t.tokens, t.timeline, t.per_step, t.panel, *t.extras]

    def on_step(request: gr.Request, trace: Trace | None, s: float, width: int | None) -> dict:
        sessions.WIDTHS[getattr(request, "session_hash", None)] = width
        if trace is None or trace.meta.get("finish_reason") is None:
            return {t.tokens: gr.skip()}  # nothing to step, or a run still streaming
        return t.step_views(trace, int(s), width)

    def on_open(request: gr.Request, trace: Trace | None, s: float, width: int | None) -> dict:
        """The example drawn for the page's width, unless a run or an import already replaced
        it: on a busy server this redraw can land after a quick import (a bad file's cleared
        views would show the example again)."""
        session = getattr(request, "session_hash", None)
        if session in sessions.REPLACED:
            return {t.tokens: gr.skip()}
        views = on_step(request, trace, s, width)
        return (
            {t.tokens: gr.skip()} if session in sessions.REPLACED else views
        )  # replaced meanwhile

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

    def to_telling(trace: Trace | None) -> dict:
        if trace is None or trace.meta.get("finish_reason") is None:
            return {t.step: gr.skip()}
        return {t.step: opened_at(trace).step}

    t.telling_btn.click(to_telling, t.trace, t.step, api_visibility="private")
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


def wire_trace_files(t: RunTab) -> None:
    """Import a trace: replay it with no model, then re-check it against greedy."""

    @gpu
    def on_import(request: gr.Request, path: str | None, width: int | None) -> Iterator[dict]:
        if path:  # a file, good or bad, replaces the views
            sessions.REPLACED.add(getattr(request, "session_hash", None))
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


def wire_method(t: RunTab) -> None:
    """A method's parameters, preset and explainer; the chat template's view."""

    def on_method(name: str, trace: Trace | None) -> dict:
        if name not in METHODS:
            return {t.method_help: gr.skip()}
        return {
            t.method_help: explainer(name),
            t.preset: gr.Dropdown(choices=preset_choices(name)),  # its value: see below
            t.stale: sessions.stale_for(name, trace),
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
        return {t.preset: "defaults", **t.knobs_for(name, defaults(name))}

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


def wire_links(t: RunTab, demo: gr.Blocks) -> None:
    """Links: URL parameters pre-fill the form."""

    def from_url(request: gr.Request) -> dict:
        query = dict(request.query_params) if request else {}
        out: dict[Any, Any] = {t.status: gr.skip()}  # gradio reads an empty dict as one value
        if not query or getattr(request, "session_hash", None) in sessions.REPLACED:
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
        if "step" in link.fields:
            sessions.LINK_STEPS[getattr(request, "session_hash", None)] = link.fields["step"]
        if "method" in link.fields or link.params:
            out |= t.knobs_for(method, defaults(method) | dict(link.params))
        if "preset" in link.fields:
            out[t.preset] = gr.Dropdown(choices=preset_choices(method), value=link.fields["preset"])
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
