"""The page: the Run, Compare and Learn tabs composed, plus the `run` and `compare` API.

Each tab has its own builder (ui/run_tab.py, ui/compare_tab.py, ui/learn_tab.py); engine calls
live in ui/models.py, ui/live.py, ui/links.py, ui/traces.py and ui/compare.py (no gradio), drawing in visualizer/. Every handler
catches the project's errors and shows them as a message, never a traceback.
"""

from __future__ import annotations

import json
import os

import gradio as gr

from decoders import METHODS, DecodingLabError
from decoders.core.events import Commit, Forward
from visualizer import forward_timeline, tokens_per_step

from .common import api, gpu, internal_error
from .compare_tab import build_compare_tab, register_compare_api
from .glossary import GLOSSARY_CSS
from .learn_tab import build_learn_tab
from .links import check_budget
from .live import run_to_end
from .models import model_choices
from .run_tab import build_run_tab
from .run_tab import forget as forget_run
from .style import CSS
from .tour import forget as forget_tour
from .tour_show import KEYS as TOUR_KEYS
from .tour_show import lesson_minutes
from .tour_tab import CSS as TOUR_CSS
from .tour_tab import TOUR_WIDTH_ESTIMATE, build_tour_tab, wire_live, wire_tour_link
from .traces import EXAMPLE_PROMPTS
from .translation_tab import build_translation_tab

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
        gr.HTML(
            f"<style>{CSS}{TOUR_CSS}{GLOSSARY_CSS}</style>",
            padding=False,
            container=False,
            elem_id="dl-style",
        )
        gr.Markdown(
            "# 🔭 Decoding Lab\nWatch a language model write — one token per step, or "
            "several. Pick a method, run it on a real model, then step through what happened.",
            elem_id="dl-title",
        )
        take_tour = gr.Button(
            f"🧭 New here? Take the tour ({len(TOUR_KEYS)} stops, or a {lesson_minutes():g}-minute "
            "lesson)",
            variant="secondary",
            size="sm",
            elem_id="take-tour",
        )
        with gr.Tabs() as tabs:
            with gr.Tab("Run", id="run"):
                run_tab = build_run_tab(demo)
            with gr.Tab("Tour", id="tour") as tour:
                # drawn when first opened; its Run it live fills the tabs built below
                tour_opened, tour_width, tour_start = build_tour_tab(
                    tour, tabs, lambda t: wire_live(*live(t))
                )
            with gr.Tab("Compare", id="compare"):
                compare_tab = build_compare_tab(choices)
            with gr.Tab("Learn", id="learn"):
                build_learn_tab(method_choices)
            # last: on a phone it is the one behind the tab bar's "⋯"
            with gr.Tab("Translation lab", id="translation") as translation_tab:
                translation_opened = build_translation_tab(translation_tab)

        def live(tour_tab):
            return tour_tab, run_tab, compare_tab, tabs, translation_opened

        take_tour.click(
            lambda w: (gr.Tabs(selected="tour"), True, w),
            tour_width,
            [tabs, tour_opened, tour_width],
            js=f"(...a) => [{TOUR_WIDTH_ESTIMATE}]",
            api_visibility="private",
        )

        def on_close(request: gr.Request) -> None:
            """The page's per-session entries (Stop, width, replaced views, a tour stop's live
            run) go with it, so a long-lived server keeps nothing for pages long closed."""
            session = getattr(request, "session_hash", None)
            forget_run(session)
            forget_tour(session)

        demo.unload(on_close)
        wire_tour_link(demo, tabs, tour_opened, tour_width, tour_start)

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
                budget = check_budget(max_new_tokens)  # 2.7 or NaN: a message, not int()'s guess
                trace = run_to_end(model or None, prompt, method, budget, values)
            except json.JSONDecodeError as exc:
                raise gr.Error(f"params is not valid JSON: {exc}") from None
            except DecodingLabError as exc:
                raise gr.Error(str(exc)) from None
            except Exception as exc:  # the boundary: a message, never a traceback
                raise gr.Error(internal_error(exc)) from None
            return (
                trace.meta["text"],
                {**trace.stats, "lossless": trace.meta.get("lossless")},
                json.loads(trace.to_json()),
            )

        api(gpu(run), "run", ["text", "stats", "trace"], concurrency_id="decode")
        register_compare_api()

    demo.queue(
        default_concurrency_limit=int(os.environ.get("DECODING_LAB_CONCURRENCY", "2")), max_size=64
    )
    return demo
