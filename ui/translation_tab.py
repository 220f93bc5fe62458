"""The Translation lab tab: non-autoregressive translation on a task with several right answers.
Pick a difficulty and a source sentence (or type one); every shipped model translates it (the
models in decoders/seq2seq, trained by `python -m decoders.train seq2seq`), beside the
references, with Mask-Predict's iterations, FlowSeq's latents, the predicted length and
fertilities, the held-out metrics at that difficulty and quality against decoder passes."""

from __future__ import annotations

from functools import cache
from typing import Any

import gradio as gr

from decoders.seq2seq.lab import SourceError, example_sources, metrics, parse_source, translate_all
from visualizer.translation_views import (
    CSS,
    latents_html,
    lengths_html,
    mask_predict_html,
    metrics_html,
    outputs_html,
    quality_chart,
    references_html,
)

from .common import internal_error, message

TASK_LABELS = [
    ("control: one right translation", "control"),
    ("register: two (a- or b-words)", "register"),
    ("modes: four (register × word order)", "modes"),
    ("length: two, of different lengths", "length"),
]
FIRST_TASK = "modes"
INTRO = (
    "A toy translation task where a source has **several right translations**: each word has "
    "two synonyms (register a or b, one register for the whole sentence) and, at the `modes` "
    "difficulty, the words may also be written in reverse order. A model that writes every "
    "position at once, each on its own, tends to **mix** them — a-words and b-words, or half in "
    "each order — and produce no right translation at all. See how each remedy copes: "
    "distillation, iterations (Mask-Predict), a latent variable (FlowSeq), a dependency-aware "
    "decoder (DePA)."
)


def lab_outputs(task: str, text: str) -> dict[str, Any]:
    """Everything the tab shows for one source (or a message naming what is wrong)."""
    try:
        source = parse_source(text)
        lab = translate_all(task, source)
    except (SourceError, ValueError, FileNotFoundError) as exc:  # names the word, task or file
        return {"status": message(str(exc))}
    except Exception as exc:  # the boundary: a message, never a traceback
        return {"status": message(internal_error(exc))}
    return {
        "status": "",
        "references": references_html(lab),
        "outputs": outputs_html(lab),
        "mask_predict": mask_predict_html(lab),
        "latents": latents_html(lab),
        "lengths": lengths_html(lab),
    }


# What a translation fills, in the order of the tab's outputs.
SHOWN = ("status", "references", "outputs", "mask_predict", "latents", "lengths")


def shown_outputs(task: str, text: str) -> list[str]:
    """The tab's outputs for one source, in SHOWN's order. A message clears the last translation:
    left under it, the old outputs read as the new source's."""
    got = lab_outputs(task, text)
    return [got.get(k, "") for k in SHOWN]


def task_outputs(task: str) -> dict[str, Any]:
    """A difficulty's example sentences, and its recorded metrics (a message in their place when
    the cards cannot be read)."""
    try:
        rows = metrics(task)
        table, chart = metrics_html(rows, task), quality_chart(rows, task)
    except (ValueError, KeyError, OSError) as exc:  # a card that does not read
        table, chart = message(f"The held-out metrics could not be read: {exc}"), None
    return {"examples": example_sources(task), "metrics": table, "chart": chart}


@cache
def _start(source: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """What the tab opens with (the first difficulty and its first sentence, or `source`: the
    tour's translation stop's), computed once per sentence."""
    start_task = task_outputs(FIRST_TASK)
    return start_task, lab_outputs(FIRST_TASK, source or start_task["examples"][0])


def build_translation_tab(tab: gr.Tab) -> gr.State:
    """Call inside the `gr.Tab` it is: the lab is drawn the first time the tab is opened (a page
    that never opens it builds none of it). Returns the flag that opens it: True, or a source
    sentence to open on (the tour's stop sets it beside selecting the tab)."""
    opened = gr.State(False)
    tab.select(  # opened already: left as it is (a tab picked again redraws nothing)
        lambda on: on or True, opened, opened, api_visibility="private", show_progress="hidden"
    )

    @gr.render(inputs=[opened], triggers=[opened.change], show_progress="hidden")
    def draw(on: bool | str) -> None:
        if on:
            _draw(on if isinstance(on, str) else "")

    return opened


def _draw(source: str = "") -> None:
    gr.HTML(f"<style>{CSS}</style>", padding=False, container=False)
    gr.Markdown(INTRO, elem_id="tl-intro")
    start_task, start = _start(source)
    first_source = source or start_task["examples"][0]
    with gr.Row(equal_height=False):
        task = gr.Dropdown(
            TASK_LABELS, value=FIRST_TASK, label="Difficulty", elem_id="tl-task", interactive=True
        )
        pick = gr.Dropdown(
            start_task["examples"],
            value=first_source if first_source in start_task["examples"] else None,
            label="Held-out source sentence",
            allow_custom_value=False,
            elem_id="tl-pick",
            interactive=True,
        )
    with gr.Row(equal_height=False):
        typed = gr.Textbox(
            first_source,
            label="…or type one (5–9 words, w0 … w19)",
            elem_id="tl-source",
            interactive=True,
            scale=4,
        )
        go = gr.Button("Translate", variant="primary", elem_id="tl-go", scale=1)
    status = gr.Markdown(start["status"], elem_id="tl-status")
    references = gr.HTML(start.get("references", ""), elem_id="tl-references")
    gr.Markdown("### Every model's translation")
    outputs = gr.HTML(start.get("outputs", ""), elem_id="tl-outputs")
    with gr.Accordion("Mask-Predict's iterations", open=True):
        grid = gr.HTML(start.get("mask_predict", ""), elem_id="tl-grid")
    with gr.Accordion("FlowSeq's latents", open=True):
        latents = gr.HTML(start.get("latents", ""), elem_id="tl-latents")
    with gr.Accordion("Predicted length and fertilities", open=False):
        lengths = gr.HTML(start.get("lengths", ""), elem_id="tl-lengths")
    gr.Markdown("### Held-out metrics at this difficulty")
    chart = gr.Plot(start_task["chart"], show_label=False, elem_id="tl-chart")
    table = gr.HTML(start_task["metrics"], elem_id="tl-metrics")

    shown = [status, references, outputs, grid, latents, lengths]  # SHOWN's order

    def on_task(task_value: str) -> list:
        got = task_outputs(task_value)
        first = got["examples"][0]
        return [
            gr.Dropdown(choices=got["examples"], value=first),
            first,
            got["chart"],
            got["metrics"],
            *shown_outputs(task_value, first),
        ]

    task.change(on_task, task, [pick, typed, chart, table, *shown], api_visibility="private")
    pick.input(
        lambda t, s: [s, *shown_outputs(t, s)],
        [task, pick],
        [typed, *shown],
        api_visibility="private",
    )
    go.click(shown_outputs, [task, typed], shown, api_visibility="private")
    typed.submit(shown_outputs, [task, typed], shown, api_visibility="private")
