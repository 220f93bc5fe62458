"""The Learn tab: an overview first (the families, and a figure measured on this machine of why
each can be faster), then every method's explainer, one at a time, picked from a dropdown (a
phone's screen is not filled by 16 radio buttons)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from visualizer.compare_views import why_faster

from .common import explainer

OVERVIEW = "overview"
OVERVIEW_TEXT = Path(__file__).with_name("overview.md")
TRANSLATION = "translation"
TRANSLATION_TEXT = Path(__file__).resolve().parents[1] / "decoders" / "seq2seq" / "explainer.md"


def overview_figure() -> go.Figure:
    """Tokens per forward against speedup, from the tour's recorded comparison."""
    from .tour import side_by_side

    return why_faster(side_by_side()["rows"])


def learn(choice: str) -> dict[str, Any]:
    """The text and (for the overview) the figure for one pick."""
    if choice == OVERVIEW:
        return {"text": OVERVIEW_TEXT.read_text(), "figure": overview_figure()}
    if choice == TRANSLATION:
        return {"text": TRANSLATION_TEXT.read_text(), "figure": None}
    return {"text": explainer(choice), "figure": None}


def build_learn_tab(method_choices: list[tuple[str, str]], first: str = OVERVIEW) -> None:
    """Call inside a `gr.Tab`: a chooser (the overview, then each method), its text and the
    overview's figure."""
    choices = [
        ("Overview: why several tokens per forward", OVERVIEW),
        *method_choices,
        ("Translation lab: non-autoregressive translation", TRANSLATION),
    ]
    pick = gr.Dropdown(choices, value=first, label="Read about", elem_id="learn-method")
    start = learn(first)
    figure = gr.Plot(
        start["figure"],
        visible=start["figure"] is not None,
        elem_id="learn-figure",
        show_label=False,
    )
    text = gr.Markdown(start["text"], elem_id="learn-text")

    def on_pick(choice: str) -> dict:
        got = learn(choice)
        return {
            text: got["text"],
            figure: gr.Plot(got["figure"], visible=got["figure"] is not None),
        }

    pick.change(on_pick, pick, [text, figure], api_visibility="private")
