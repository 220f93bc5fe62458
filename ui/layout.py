"""The page: the Run, Compare and Learn tabs composed, plus the `run` and `compare` API.

Each tab has its own builder (ui/run_tab.py, ui/learn_tab.py; Compare below until ui/compare_tab.py
takes it over); engine calls live in ui/session.py (no gradio), drawing in visualizer/. Every
handler catches the project's errors and shows them as a message, never a traceback.
"""

from __future__ import annotations

import json
import os

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.events import Commit, Forward
from visualizer import compare_chart, forward_timeline, token_spans_html, tokens_per_step

from .common import gpu
from .common import message as _message
from .learn_tab import build_learn_tab
from .run_tab import CSS, DEFAULT_METHOD, build_run_tab
from .session import (
    ALLOW_ANY_MODEL,
    EXAMPLE_PROMPTS,
    UI_MAX_NEW_TOKENS,
    compare_methods,
    model_choices,
    run_to_end,
)

EXAMPLES = [[p] for p in EXAMPLE_PROMPTS]


def _warm_up_plotly() -> None:
    """Plotly builds its validators on first use (~0.4 s): pay that at start-up, not mid-stream."""
    events = [Forward(0, "prefill", 1, 1, 1.0), Commit(0, (1,), ("target",), (1.0,))]
    forward_timeline(events).to_json()
    tokens_per_step(events).to_json()


def build_demo() -> gr.Blocks:
    _warm_up_plotly()
    choices = model_choices()
    method_choices = [(m.title, name) for name, m in METHODS.items()]

    with gr.Blocks(title="Decoding Lab") as demo:
        gr.HTML(f"<style>{CSS}</style>", padding=False, container=False, elem_id="dl-style")
        gr.Markdown(
            "# 🔭 Decoding Lab\nWatch a language model write — one token per step, or several. "
            "Pick a method, run it on a real model, then step through what happened."
        )
        with gr.Tabs():
            with gr.Tab("Run", id="run"):
                build_run_tab(demo)
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
                build_learn_tab(method_choices, DEFAULT_METHOD)

        # --- Compare's handler (moved as-is; ui/compare_tab.py will own it) ------------------------

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
