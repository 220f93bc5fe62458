"""The Learn tab: an overview first (the families, and a figure measured on this machine of why
each can be faster), then every method's explainer, one at a time, picked from a dropdown (a
phone's screen is not filled by 16 radio buttons), and the "why faster or slower" lab: the price
curve, the theory of a chain drafter with sliders, every method's real run on the same axes, and
real runs at a chosen (synthetic) acceptance rate. Then the glossary, every term the texts use
defined once (in the texts, each is marked where it first appears: hover or tap it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from decoders.core import costs, facts
from decoders.core.errors import DecodingLabError
from decoders.core.facts import fill
from decoders.core.prices import PriceTable
from visualizer.compare_views import why_faster
from visualizer.speed_lab import price_curve, speed_lab

from .common import explainer, gpu, message
from .glossary import annotate, glossary_markdown

OVERVIEW = "overview"
OVERVIEW_TEXT = Path(__file__).with_name("overview.md")
TRANSLATION = "translation"
TRANSLATION_TEXT = Path(__file__).resolve().parents[1] / "decoders" / "seq2seq" / "explainer.md"
LAB = "lab"
LAB_TEXT = Path(__file__).with_name("lab.md")
GLOSSARY = "glossary"
# Words the translation explainer uses in another sense than the glossary's: a reading order
# ("the first half forward"), the sentence being written, a flow's steps.
TRANSLATION_SENSES = ("forward", "target", "step", "steps")
SWEEP = (0.2, 0.4, 0.6, 0.8, 1.0)  # the synthetic runs' acceptance rates
SWEEP_TOKENS = 48  # each run's budget (the tour's)


def lab_table() -> tuple[PriceTable, str]:
    """The table the lab draws: this machine's when it is known (measured and stored), else the
    one the tour was recorded with (said in the figure's title)."""
    try:
        from .models import get_bundle

        table = costs.known_table(get_bundle(None))
    except DecodingLabError:
        table = None
    if table is not None:
        return table, "this machine"
    return facts.tour_prices(), "the tour's recording machine"


def eagle_price(table: PriceTable) -> float:
    return next((v for k, v in table.drafters.items() if k.startswith("eagle")), 0.05)


def lab_figure(
    acceptance: float,
    gamma: float,
    draft_cost: float,
    synthetic: list[dict] | None = None,
    table: PriceTable | None = None,
) -> go.Figure:
    """The theory on `table` (default: lab_table's), the tour's runs and the synthetic ones."""
    table = table or lab_table()[0]
    rows = [r for r in facts.tour_rows().values() if r["method"] != facts.REFERENCE]
    return speed_lab(
        table,
        float(acceptance),
        int(gamma),
        float(draft_cost),
        rows,
        synthetic or [],
        eagle_price(table),  # what the synthetic runs' drafter costs
    )


def sweep(prompt: str, gamma: int, model: str | None = None) -> Iterator[tuple[list[dict], str]]:
    """Speculative decoding with the EAGLE head at γ drafts a step, every draft token accepted
    with each SWEEP probability (synthetic acceptance: not exact), beside autoregressive, on
    this machine: (rows so far, status) after each run."""
    from decoders.specs import parse_method

    from .compare import compare_methods

    specs = [
        f"speculative:draft=eagle:schedule=fixed:gamma={int(gamma)}:synthetic={a}" for a in SWEEP
    ]
    for result in compare_methods(model, prompt, specs, SWEEP_TOKENS, rounds=1):
        rows = [
            {**r, "synthetic": a}
            for r in result.rows[1:]
            for a in [float(parse_method(r["method"])[1]["synthetic"])]
        ]
        yield (
            rows,
            f"⏳ {result.progress}…"
            if not result.done
            else (
                f"✅ {len(rows)} synthetic runs ({SWEEP_TOKENS} tokens each) beside autoregressive, "
                "on this machine: the crosses. Not exact: the coin, not the target, kept each draft."
            ),
        )


def overview_figure() -> go.Figure:
    """Tokens per forward against speedup, from the tour's recorded comparison."""
    from .tour import side_by_side

    return why_faster(side_by_side()["rows"])


def learn(choice: str) -> dict[str, Any]:
    """The text and (for the overview) the figure for one pick."""
    if choice == OVERVIEW:
        return {"text": annotate(fill(OVERVIEW_TEXT.read_text())), "figure": overview_figure()}
    if choice == TRANSLATION:
        text = annotate(fill(TRANSLATION_TEXT.read_text()), skip=TRANSLATION_SENSES)
        return {"text": text, "figure": None}
    if choice == LAB:
        return {"text": annotate(fill(LAB_TEXT.read_text())), "figure": None}
    if choice == GLOSSARY:
        return {"text": glossary_markdown(), "figure": None}
    return {"text": explainer(choice), "figure": None}


def build_learn_tab(method_choices: list[tuple[str, str]], first: str = OVERVIEW) -> None:
    """Call inside a `gr.Tab`: a chooser (the overview, then each method), its text and the
    overview's figure."""
    choices = [
        ("Overview: why several tokens per forward", OVERVIEW),
        ("Lab: why a method is faster or slower", LAB),
        *method_choices,
        ("Translation lab: non-autoregressive translation", TRANSLATION),
        ("Glossary: every term, defined once", GLOSSARY),
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

    # The lab's controls exist only while the lab is picked (a page that never picks it builds
    # none of them).
    @gr.render(inputs=[pick], show_progress="hidden")
    def draw_lab(choice: str) -> None:
        if choice == LAB:
            _lab()


def _lab() -> None:
    """The "why faster or slower" lab: this machine's price curve (the tour's until this
    machine's is known), the chain-drafter theory under three sliders, and real runs at
    synthetic acceptance rates."""
    with gr.Column(elem_id="learn-lab"):
        gr.Plot(price_curve(*lab_table()), elem_id="lab-prices", show_label=False)
        table = facts.tour_prices()
        with gr.Row():
            alpha = gr.Slider(
                0,
                1,
                0.7,
                step=0.05,
                label="acceptance rate α",
                elem_id="lab-alpha",
                interactive=True,
            )
            gamma = gr.Slider(
                1, 16, 4, step=1, label="draft length γ", elem_id="lab-gamma", interactive=True
            )
            cost = gr.Slider(
                0,
                1,
                round(eagle_price(table), 3),
                step=0.005,
                label="draft cost (of a one-token forward)",
                elem_id="lab-cost",
                interactive=True,
            )
        theory = gr.Plot(
            lab_figure(0.7, 4, eagle_price(table), table=table),
            elem_id="lab-theory",
            show_label=False,
        )
        prompt = gr.Textbox(
            "Write a short note thanking a colleague for their help.",
            label="prompt for the real runs",
            lines=1,
            elem_id="lab-prompt",
            interactive=True,
        )
        run = gr.Button("Run it for real: synthetic acceptance 20 %–100 %", elem_id="lab-run")
        status = gr.Markdown("", elem_id="lab-status")
        done = gr.State([])

    def on_lab_slide(a: float, g: float, c: float, rows: list[dict]) -> go.Figure:
        return lab_figure(a, g, c, [r for r in rows if r.get("gamma") == int(g)])

    sliders = [alpha, gamma, cost, done]
    for s in (alpha, gamma, cost):
        s.change(on_lab_slide, sliders, theory, api_visibility="private", show_progress="hidden")

    @gpu
    def on_lab_run(prompt_text: str, a: float, g: float, c: float) -> Iterator[tuple]:
        yield [], lab_figure(a, g, c), "⏳ Loading the model and the drafter…"
        try:
            for rows, said in sweep(prompt_text, int(g)):
                rows = [{**r, "gamma": int(g)} for r in rows]
                yield rows, lab_figure(a, g, c, rows), said
        except DecodingLabError as exc:
            yield [], lab_figure(a, g, c), message(str(exc))

    run.click(
        on_lab_run,
        [prompt, alpha, gamma, cost],
        [done, theory, status],
        api_visibility="private",
        concurrency_id="decode",
        show_progress="hidden",
    )
