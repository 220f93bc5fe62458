"""The page: Run (live streaming + step-through), Compare, Learn; plus the `run` and `compare` API.

Handlers turn engine results (ui/session.py) into views (visualizer/). Every handler catches the
project's errors and shows them as a message, so a visitor never sees a traceback.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.events import MAX_TRACE_BYTES, Commit, Forward
from decoders.params import SAMPLING_PARAMS, Param
from visualizer import (
    acceptance_panel,
    compare_chart,
    extra_panels,
    forward_timeline,
    method_panel,
    metrics_html,
    token_spans_html,
    tokens_per_step,
)

from .session import (
    ALLOW_ANY_MODEL,
    UI_MAX_NEW_TOKENS,
    Trace,
    compare_methods,
    model_choices,
    run_live,
    run_to_end,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "explainers"
EXAMPLES = [
    ['def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'],
    ["Write a short, friendly email inviting the team to a Friday lunch."],
    [
        "Summarize in two sentences: Speculative decoding lets a small draft model propose several "
        "tokens that a large target model verifies in a single forward pass, so the output is exactly "
        "what the large model would have written, only faster."
    ],
    ["Translate to French: The library opens at nine and closes at six."],
    ["A train travels 120 km in 1.5 hours. What is its average speed? Explain step by step."],
]
# While streaming: tokens at most every TOKENS_EVERY_S, figures every FIGURES_EVERY_S (and at the
# end). Each update costs Python work that competes with the decoding thread for the GIL.
TOKENS_EVERY_S = 0.25
FIGURES_EVERY_S = 3.0

try:  # ZeroGPU on Hugging Face Spaces: borrow a GPU for the duration of a call.
    import spaces

    gpu = spaces.GPU
except ImportError:  # anywhere else, a no-op

    def gpu(fn):
        return fn


def explainer(method: str) -> str:
    path = ASSETS / f"{method}.md"
    return path.read_text() if path.is_file() else f"*No explainer yet for `{method}`.*"


def _control(p: Param, method: str) -> gr.components.Component:
    label = f"{p.name} — {p.help}"
    key = f"{method}-{p.name}"
    if p.type is bool:
        return gr.Checkbox(value=p.default, label=label, elem_id=key)
    if p.choices:
        return gr.Dropdown(list(p.choices), value=p.default, label=label, elem_id=key)
    if p.type in (int, float) and p.min is not None and p.max is not None and p.max - p.min <= 1000:
        step = 1 if p.type is int else 0.01
        return gr.Slider(p.min, p.max, value=p.default, step=step, label=label, elem_id=key)
    if p.type in (int, float):
        return gr.Number(
            value=p.default, label=label, precision=0 if p.type is int else None, elem_id=key
        )
    return gr.Textbox(value=str(p.default), label=label, elem_id=key)


# --- views of a trace -----------------------------------------------------------------------------


def step_views(trace: Trace, step: int | None) -> tuple[str, Any, Any, Any]:
    """Tokens, timeline, tokens-per-step and method panel as they stood at `step` (None = the end)."""
    upto = step if step is not None and step < trace.last_step else None
    at = trace.last_step if upto is None else upto
    method = trace.meta.get("method", "autoregressive")
    n_layers = int(trace.meta.get("n_layers", 30))
    return (
        token_spans_html(trace.events, trace.texts, upto, n_layers=n_layers),
        forward_timeline(trace.events, upto),
        tokens_per_step(trace.events, upto),
        method_panel(method, trace.events, trace.texts, at),
    )


def full_views(trace: Trace, status: str) -> tuple:
    tokens, timeline, per_step, panel = step_views(trace, None)
    return (
        tokens,
        metrics_html(trace.stats, trace.meta.get("lossless")),
        timeline,
        per_step,
        acceptance_panel(trace.stats),
        panel,
        gr.Slider(
            minimum=0,
            maximum=max(trace.last_step, 1),
            value=trace.last_step,
            step=1,
            interactive=True,
            label=f"Step (0–{trace.last_step})",
        ),
        trace,
        gr.DownloadButton(value=_export(trace), visible=True),
        status,
    )


def _export(trace: Trace) -> str:
    folder = Path(tempfile.mkdtemp(prefix="decoding-lab-"))
    path = folder / f"trace-{trace.meta.get('method', 'run')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(trace.to_json())
    return str(path)


def _message(text: str) -> str:
    return f"⚠️ **{text}**"


# --- the page -------------------------------------------------------------------------------------


def _warm_up_plotly() -> None:
    """Plotly builds its validators on first use (~0.4 s): pay that at start-up, not mid-stream."""
    events = [Forward(0, "prefill", 1, 1, 1.0), Commit(0, (1,), ("target",), (1.0,))]
    forward_timeline(events).to_json()
    tokens_per_step(events).to_json()


def build_demo() -> gr.Blocks:
    _warm_up_plotly()
    choices = model_choices()
    method_choices = [(m.title, name) for name, m in METHODS.items()]
    # One control per (method, parameter); only the selected method's group is visible.
    method_params = [(name, p) for name, m in METHODS.items() for p in m.params]

    with gr.Blocks(title="Decoding Lab") as demo:
        trace_state = gr.State(None)
        gr.Markdown(
            "# 🔭 Decoding Lab\nWatch a language model write — one token per step, or several. "
            "Pick a method, run it on a real model, then step through what happened."
        )
        with gr.Tabs():
            with gr.Tab("Run", id="run"):
                with gr.Row():
                    with gr.Column(scale=2, min_width=320):
                        prompt = gr.Textbox(
                            label="Prompt", lines=5, value=EXAMPLES[0][0], elem_id="prompt"
                        )
                        gr.Examples(EXAMPLES, [prompt], label="Examples")
                        model = gr.Dropdown(
                            choices,
                            value=choices[0][1],
                            label="Model",
                            allow_custom_value=ALLOW_ANY_MODEL,
                            elem_id="model",
                        )
                        method = gr.Dropdown(
                            method_choices, value="autoregressive", label="Method", elem_id="method"
                        )
                        max_new = gr.Slider(
                            1,
                            UI_MAX_NEW_TOKENS,
                            value=64,
                            step=1,
                            label="Max new tokens",
                            elem_id="max-new-tokens",
                        )
                        groups: dict[str, gr.Group] = {}
                        controls: list[gr.components.Component] = []
                        for name, m in METHODS.items():
                            with gr.Group(visible=name == "autoregressive") as groups[name]:
                                for p in m.params:
                                    controls.append(_control(p, name))
                        with gr.Accordion(
                            "Sampling (temperature 0 = greedy, lossless)", open=False
                        ):
                            temperature, top_p, seed = (
                                _control(p, "sampling") for p in SAMPLING_PARAMS
                            )
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                        status = gr.Markdown(elem_id="status")
                        with gr.Accordion("Trace file: export / import", open=False):
                            export_btn = gr.DownloadButton(
                                "Export trace (JSON)", visible=False, elem_id="export"
                            )
                            upload = gr.File(
                                label="Import a trace to replay (no model needed)",
                                file_types=[".json"],
                                type="filepath",
                                elem_id="import",
                            )
                    with gr.Column(scale=3):
                        tokens_html = gr.HTML(token_spans_html([], {}), elem_id="tokens")
                        metrics = gr.HTML(elem_id="metrics")
                        with gr.Row(equal_height=True):
                            prev_btn = gr.Button("◀ Prev", size="sm", elem_id="prev", min_width=60)
                            play_btn = gr.Button("▶ Play", size="sm", elem_id="play", min_width=60)
                            pause_btn = gr.Button(
                                "⏸ Pause", size="sm", elem_id="pause", min_width=60
                            )
                            next_btn = gr.Button("Next ▶", size="sm", elem_id="next", min_width=60)
                        step = gr.Slider(
                            0, 1, value=0, step=1, label="Step", interactive=False, elem_id="step"
                        )
                        timeline = gr.Plot(
                            label="Forward passes", elem_id="timeline", show_label=False
                        )
                        with gr.Row():
                            per_step = gr.Plot(
                                label="Tokens per step", elem_id="per-step", show_label=False
                            )
                            hist = gr.Plot(label="Acceptance", elem_id="hist", show_label=False)
                        panel = gr.Plot(label="Method panel", elem_id="panel", show_label=False)
                        with gr.Row():  # a method's further views (lookahead: window, pool)
                            extras = [
                                gr.Plot(visible=False, elem_id=f"panel{i}", show_label=False)
                                for i in (2, 3)
                            ]
                        with gr.Accordion("How this method works", open=False):
                            method_help = gr.Markdown(explainer("autoregressive"))
                timer = gr.Timer(0.6, active=False)

            with gr.Tab("Compare", id="compare"):
                with gr.Row():
                    with gr.Column(scale=2):
                        cmp_prompt = gr.Textbox(
                            label="Prompt", lines=4, value=EXAMPLES[0][0], elem_id="cmp-prompt"
                        )
                        cmp_methods = gr.CheckboxGroup(
                            method_choices, value=list(METHODS), label="Methods"
                        )
                        cmp_model = gr.Dropdown(
                            choices,
                            value=choices[0][1],
                            label="Model",
                            allow_custom_value=ALLOW_ANY_MODEL,
                        )
                        cmp_max_new = gr.Slider(
                            1, UI_MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens"
                        )
                        cmp_btn = gr.Button("Compare", variant="primary", elem_id="cmp-btn")
                        cmp_status = gr.Markdown()
                    with gr.Column(scale=3):
                        cmp_table = gr.Dataframe(
                            label="Results (greedy; autoregressive is the reference)",
                            interactive=False,
                            elem_id="cmp-table",
                        )
                        cmp_plot = gr.Plot(label="Speedup", elem_id="cmp-plot", show_label=False)
                        cmp_texts = gr.HTML()

            with gr.Tab("Learn", id="learn"):
                learn_method = gr.Radio(method_choices, value="autoregressive", label="Method")
                learn_md = gr.Markdown(explainer("autoregressive"))

        # --- handlers -----------------------------------------------------------------------------

        outputs = [
            tokens_html,
            metrics,
            timeline,
            per_step,
            hist,
            panel,
            step,
            trace_state,
            export_btn,
            status,
        ]

        @gpu
        def on_run(
            model_id, prompt_text, method_name, budget, temp, tp, sd, *values
        ) -> Iterator[tuple]:
            sampling = method_name in METHODS and METHODS[method_name].sampling
            params: dict[str, Any] = (
                {"temperature": temp, "top_p": tp, "seed": sd} if sampling else {}
            )
            params |= {
                p.name: v
                for (name, p), v in zip(method_params, values, strict=True)
                if name == method_name
            }
            # Clear the previous run's views at once, so what streams next is this run.
            yield (
                token_spans_html([], {}),
                "",
                *(gr.skip(),) * 7,
                "⏳ Loading model and starting…",
            )
            try:
                live_runs = run_live(
                    model_id, prompt_text, method_name, int(budget), params, every_s=TOKENS_EVERY_S
                )
                figures_at = 0.0
                for live in live_runs:
                    trace = live.trace
                    if live.done:
                        reason = trace.meta.get("finish_reason")
                        yield full_views(
                            trace, f"✅ Done: {len(trace.token_ids)} tokens ({reason})."
                        )
                        return
                    now = time.perf_counter()
                    redraw = now - figures_at >= FIGURES_EVERY_S
                    figures_at = now if redraw else figures_at
                    n = len(trace.token_ids)
                    stats = {
                        "tokens_per_s": n / live.elapsed_s if live.elapsed_s else None,
                        "new_tokens": n,
                    }
                    yield (
                        token_spans_html(
                            trace.events, trace.texts, n_layers=int(trace.meta["n_layers"])
                        ),
                        metrics_html(stats),
                        forward_timeline(trace.events) if redraw else gr.skip(),
                        tokens_per_step(trace.events) if redraw else gr.skip(),
                        gr.skip(),
                        gr.skip(),
                        gr.skip(),
                        gr.skip(),
                        gr.skip(),
                        f"⏳ Running… {n} tokens",
                    )
            except DecodingLabError as exc:
                yield (gr.skip(),) * 9 + (_message(str(exc)),)

        run_event = run_btn.click(
            on_run,
            [model, prompt, method, max_new, temperature, top_p, seed, *controls],
            outputs,
            api_name="run_stream",
            api_visibility="undocumented",  # scripts may stream it too (scripts/bench_ui.py)
            concurrency_id="decode",
            show_progress="hidden",  # our status line says it; animated overlays cost CPU
        )
        # Say "Stopped" only once the cancel has gone through, so no late update overwrites it.
        stop_btn.click(None, None, None, cancels=[run_event], api_visibility="private").then(
            lambda: "⏹ Stopped.", None, status, api_visibility="private"
        )

        def on_step(trace: Trace | None, s: float):
            if trace is None:
                return (gr.skip(),) * 4
            return step_views(trace, int(s))

        step.change(
            on_step,
            [trace_state, step],
            [tokens_html, timeline, per_step, panel],
            api_visibility="private",
            show_progress="hidden",
        )

        def on_panel(trace: Trace | None, s: float | None):
            """The extra views follow the main panel: same trace, same step."""
            if trace is None:
                return [gr.Plot(visible=False) for _ in extras]
            at = trace.last_step if s is None else min(int(s), trace.last_step)
            figures = extra_panels(trace.meta.get("method", ""), trace.events, trace.texts, at)
            return [
                gr.Plot(value=figures[i], visible=True)
                if i < len(figures)
                else gr.Plot(visible=False)
                for i in range(len(extras))
            ]

        panel.change(
            on_panel,
            [trace_state, step],
            extras,
            api_visibility="private",
            show_progress="hidden",
        )

        def nudge(delta: int):
            def fn(trace: Trace | None, s: float):
                if trace is None:
                    return gr.skip()
                return min(max(int(s) + delta, 0), trace.last_step)

            return fn

        prev_btn.click(nudge(-1), [trace_state, step], step, api_visibility="private")
        next_btn.click(nudge(+1), [trace_state, step], step, api_visibility="private")

        def play(trace: Trace | None, s: float):
            if trace is None:
                return gr.skip(), gr.skip()
            start = 0 if int(s) >= trace.last_step else int(s)
            return gr.Timer(active=True), start

        play_btn.click(play, [trace_state, step], [timer, step], api_visibility="private")
        pause_btn.click(lambda: gr.Timer(active=False), None, timer, api_visibility="private")

        def tick(trace: Trace | None, s: float):
            if trace is None or int(s) >= trace.last_step:
                return gr.Timer(active=False), gr.skip()
            return gr.skip(), int(s) + 1

        timer.tick(
            tick,
            [trace_state, step],
            [timer, step],
            api_visibility="private",
            show_progress="hidden",
        )

        def on_import(path: str | None):
            if not path:
                return (gr.skip(),) * 10
            try:
                if os.path.getsize(path) > MAX_TRACE_BYTES:
                    raise DecodingLabError(
                        f"trace file is larger than {MAX_TRACE_BYTES // 2**20} MiB"
                    )
                trace = Trace.from_json(Path(path).read_bytes())
            except (DecodingLabError, OSError) as exc:
                return (gr.skip(),) * 9 + (_message(f"Could not import the trace: {exc}"),)
            meta = trace.meta
            return full_views(
                trace,
                f"📂 Replaying an imported trace: {meta.get('method')} on "
                f"{meta.get('model')}, {len(trace.token_ids)} tokens.",
            )

        upload.upload(on_import, upload, outputs, api_visibility="private").then(
            lambda: None, None, upload, api_visibility="private"
        )  # clear the box, ready for another file

        def on_method(name: str):
            return [gr.Group(visible=n == name) for n in groups] + [explainer(name)]

        method.change(on_method, method, [*groups.values(), method_help], api_visibility="private")
        learn_method.change(explainer, learn_method, learn_md, api_visibility="private")

        @gpu
        def on_compare(model_id, prompt_text, methods, budget):
            try:
                for rows, traces in compare_methods(
                    model_id, prompt_text, list(methods), int(budget)
                ):
                    texts = "".join(
                        f"<h4 style='margin:10px 0 4px'>{name}</h4>"
                        + token_spans_html(t.events, t.texts, legend=False)
                        for name, t in traces.items()
                    )
                    yield (
                        rows_table(rows),
                        compare_chart(rows),
                        texts,
                        f"⏳ {len(traces)} of {len(set(methods) | {'autoregressive'})} methods done",
                    )
                yield gr.skip(), gr.skip(), gr.skip(), "✅ Done."
            except DecodingLabError as exc:
                yield gr.skip(), gr.skip(), gr.skip(), _message(str(exc))

        cmp_btn.click(
            on_compare,
            [cmp_model, cmp_prompt, cmp_methods, cmp_max_new],
            [cmp_table, cmp_plot, cmp_texts, cmp_status],
            api_visibility="private",
            concurrency_id="decode",
            show_progress="minimal",
        )

        # --- sharing: URL parameters pre-fill the page ---------------------------------------------

        def from_url(request: gr.Request):
            q = dict(request.query_params) if request else {}
            ids = [v for _, v in choices]
            out: list[Any] = [
                q["model"] if q.get("model") in ids else gr.skip(),
                q.get("prompt", gr.skip()),
                q["method"] if q.get("method") in METHODS else gr.skip(),
                _number(q.get("max_new_tokens"), gr.skip()),
                _number(q.get("temperature"), gr.skip()),
                _number(q.get("top_p"), gr.skip()),
                _number(q.get("seed"), gr.skip()),
            ]
            chosen = q.get("method", "autoregressive")
            extra = json.loads(q["params"]) if _is_json_object(q.get("params")) else {}
            for name, p in method_params:
                raw = extra.get(p.name, q.get(p.name)) if name == chosen else None
                out.append(
                    _number(raw, gr.skip()) if p.type in (int, float) else (raw or gr.skip())
                )
            return out

        demo.load(
            from_url,
            None,
            [model, prompt, method, max_new, temperature, top_p, seed, *controls],
            api_visibility="private",
        )

        # --- API for scripts (gradio_client) -------------------------------------------------------

        def run(
            prompt: str,
            method: str = "autoregressive",
            model: str = "",
            max_new_tokens: int = 64,
            params: str = "{}",
        ) -> tuple[str, dict, dict]:
            """Run one method. params: a JSON object of method parameters. Returns (text, stats, trace)."""
            try:
                values = json.loads(params or "{}")
                if not isinstance(values, dict):
                    raise DecodingLabError("params must be a JSON object")
                trace = run_to_end(model or None, prompt, method, int(max_new_tokens), values)
            except json.JSONDecodeError as exc:
                raise gr.Error(f"params is not valid JSON: {exc}") from None
            except DecodingLabError as exc:
                raise gr.Error(str(exc)) from None
            return (
                trace.meta["text"],
                {**trace.stats, "lossless": trace.meta.get("lossless")},
                json.loads(trace.to_json()),
            )

        def compare(
            prompt: str, methods: str = "autoregressive", model: str = "", max_new_tokens: int = 64
        ) -> dict:
            """Run several methods (comma-separated) greedily on one prompt. Returns rows and texts."""
            names = [m.strip() for m in methods.split(",") if m.strip()]
            try:
                *_, (rows, traces) = compare_methods(
                    model or None, prompt, names, int(max_new_tokens)
                )
            except DecodingLabError as exc:
                raise gr.Error(str(exc)) from None
            return {"rows": rows, "texts": {m: t.meta["text"] for m, t in traces.items()}}

        gr.api(gpu(run), api_name="run", concurrency_id="decode")
        gr.api(gpu(compare), api_name="compare", concurrency_id="decode")

    demo.queue(
        default_concurrency_limit=int(os.environ.get("DECODING_LAB_CONCURRENCY", "2")), max_size=64
    )
    return demo


def rows_table(rows: list[dict]) -> list[list]:
    header = ["method", "tokens/s", "speedup", "tokens/forward", "mean accept len", "lossless"]
    body = [
        [
            r["method"],
            round(r["tokens_per_s"], 1),
            f"{r['speedup']:.2f}×",
            r["tokens_per_target_forward"],
            r["mean_acceptance_length"] if r["mean_acceptance_length"] is not None else "—",
            r["lossless"],
        ]
        for r in rows
    ]
    return gr.Dataframe(value=body, headers=header)


def _number(raw: Any, default: Any) -> Any:
    try:
        return float(raw) if raw not in (None, "") else default
    except (TypeError, ValueError):
        return default


def _is_json_object(raw: str | None) -> bool:
    try:
        return isinstance(json.loads(raw), dict) if raw else False
    except json.JSONDecodeError:
        return False
