"""Decoding Lab web app (minimal first version): stream a method's output on the embedded model.

Thin by design: the engine lives in `decoders/`, drawing will live in `visualizer/`.
Set DECODING_LAB_MODEL to serve another model id (e.g. tiny-random in tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import gradio as gr

from decoders import METHODS, DecodingLabError, load_model, stream
from decoders.events import Commit, Done

MODEL_ID = os.environ.get("DECODING_LAB_MODEL") or None
MAX_NEW_TOKENS = int(os.environ.get("DECODING_LAB_UI_MAX_NEW_TOKENS", "512"))


def run(prompt: str, method: str, max_new_tokens: float) -> Iterator[tuple[str, dict[str, Any]]]:
    """Stream the generated text token by token, then the run's stats."""
    try:
        bundle = load_model(MODEL_ID)
        events = stream(bundle, prompt, method, int(max_new_tokens))
    except DecodingLabError as exc:
        raise gr.Error(str(exc)) from None
    tokens: list[int] = []
    for event in events:
        if isinstance(event, Commit):
            tokens.extend(event.tokens)
            yield bundle.decode(tokens), {}
        elif isinstance(event, Done):
            yield bundle.decode(tokens), {"finish_reason": event.finish_reason, **event.stats}


def build_demo() -> gr.Blocks:
    with gr.Blocks(title="Decoding Lab") as demo:
        gr.Markdown(
            "# Decoding Lab\nSee how a language model writes, step by step. "
            f"Model: **{MODEL_ID or 'SmolLM2-135M-Instruct (embedded)'}**."
        )
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(label="Prompt", lines=4, value="Write a haiku about the sea.")
                with gr.Row():
                    method = gr.Dropdown(list(METHODS), value="autoregressive", label="Method")
                    budget = gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens")
                with gr.Row():
                    go = gr.Button("Run", variant="primary")
                    stop = gr.Button("Stop")
            with gr.Column(scale=3):
                output = gr.Textbox(label="Output", lines=10)
                stats = gr.JSON(label="Stats")
        event = go.click(run, [prompt, method, budget], [output, stats], api_name="run")
        stop.click(None, cancels=[event])
    demo.queue(default_concurrency_limit=2)
    return demo


demo = build_demo()

if __name__ == "__main__":
    load_model(MODEL_ID)  # load before serving, so the first visitor does not wait
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
