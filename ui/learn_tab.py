"""The Learn tab: every method's explainer, one at a time."""

from __future__ import annotations

import gradio as gr

from .common import explainer


def build_learn_tab(method_choices: list[tuple[str, str]], first: str) -> None:
    """Call inside a `gr.Tab`: a method picker and its explainer."""
    method = gr.Radio(method_choices, value=first, label="Method", elem_id="learn-method")
    text = gr.Markdown(explainer(first), elem_id="learn-text")
    method.change(explainer, method, text, api_visibility="private")
