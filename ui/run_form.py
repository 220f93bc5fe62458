"""The Run tab's layout: the form (prompt, model, method, budget, Run/Stop, the preset and the
chosen method's controls, drawn from its schema), the output column, and the cold page's views.
No handlers here but the controls' own (ui/run_tab.py wires the tab)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from decoders import METHODS
from decoders.core.params import SAMPLING_PARAMS
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
    model_picker,
)
from .live import Trace
from .models import model_choices
from .run_views import (
    DEFAULT_METHOD,
    _control,
    _describe,
    _export,
    prompt_html,
    showcase_step,
    views_of,
)
from .traces import EXAMPLE_PROMPTS


def form_column(demo: gr.Blocks, example: Trace | None, start: dict[str, Any]) -> dict[str, Any]:
    """The left column: prompt, model, method, budget, Run/Stop and the status line on top; then the
    preset and the method's parameters (one group shown, in an accordion closed on a phone); then
    example prompts, sampling and trace files. On a phone the output comes between the
    parameters and the rest (CSS)."""
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
    # Open on a desktop (beside the output); on a phone it starts closed (ON_LOAD), so the output
    # follows Run, and one tap opens it. Run reads `knobs` and `edits`, open or closed.
    with gr.Column(elem_id="run-knobs"):
        with gr.Accordion(params_label(DEFAULT_METHOD), open=True, elem_id="run-params") as params:
            preset = gr.Dropdown(
                preset_choices(DEFAULT_METHOD),
                value="defaults",
                label="Preset (sets the parameters below)",
                info="defaults = our best settings on this machine; paper = the paper's",
                elem_id="preset",
            )
            # The chosen method's controls only, drawn anew when another method, a preset, a
            # link or a trace sets them (`knobs`); what is typed into them goes to `edits`.
            knobs = gr.State({"method": DEFAULT_METHOD, "values": defaults(DEFAULT_METHOD)})
            edits = gr.State({})
            _draw_knobs(demo, knobs, edits, params)
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


def output_column(start: dict[str, Any]) -> dict[str, Any]:
    """The right column: the tokens and metrics, step-through with the method's views under it,
    the timeline and per-step charts, the explainer (open on a desktop, closed on a phone). On a
    phone the metrics follow the method's views, so that one screen under the tokens holds the
    step controls and the view (ui/style.py)."""
    show_seen = gr.Checkbox(
        False, label="Show what the model sees (the chat template)", elem_id="show-seen"
    )
    seen = gr.HTML(start["seen"], visible=False, elem_id="seen")
    stale = gr.HTML("", padding=False, container=False, elem_id="stale")
    tokens = gr.HTML(start["tokens"], elem_id="tokens")
    metrics = gr.HTML(start["metrics"], elem_id="metrics")
    # The step controls in one column of their own, so a phone can move them (with the method's
    # views) right under the tokens: ui/style.py.
    with gr.Column(elem_id="run-stepper"):
        with gr.Row(equal_height=True):
            prev_btn = gr.Button("◀ Prev", size="sm", elem_id="prev", min_width=60)
            play_btn = gr.Button("▶ Play", size="sm", elem_id="play", min_width=60)
            pause_btn = gr.Button("⏸ Pause", size="sm", elem_id="pause", min_width=60)
            next_btn = gr.Button("Next ▶", size="sm", elem_id="next", min_width=60)
            # back to the step the run opened at: its method's telling step (run_views.opened_at)
            telling_btn = gr.Button("⤴ Telling step", size="sm", elem_id="telling", min_width=60)
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
        telling_btn=telling_btn,
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


def initial_views(example: Trace | None) -> dict[str, Any]:
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


def preset_choices(method: str) -> list[str]:
    return ["defaults", *METHODS[method].presets]


def defaults(method: str) -> dict[str, Any]:
    return METHODS[method].preset("defaults")


def params_label(method: str) -> str:
    """The parameters' accordion names whose they are (on a phone, closed, it is all one sees of
    them): the method's title without its parenthesis, which would wrap on a phone."""
    return (
        f"Parameters of {METHODS[method].title.split(' (')[0]}"
        if method in METHODS
        else "Parameters"
    )


def _draw_knobs(demo: gr.Blocks, knobs: gr.State, edits: gr.State, params: gr.Accordion) -> None:
    """The chosen method's parameters, as controls built from its schema (`_control`), drawn
    where this is called: on load and whenever `knobs` is set. A value typed into one is kept in
    `edits` under the parameter's name, where Run reads it. The accordion `params` they sit in
    is renamed for the method whose controls they are."""
    knobs.change(
        lambda state: gr.Accordion(label=params_label((state or {}).get("method"))),
        knobs,
        params,
        queue=False,
        api_visibility="private",
        show_progress="hidden",
    )

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
