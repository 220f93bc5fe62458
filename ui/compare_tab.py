"""The Compare tab and the `compare` API: method specs, one per line, run greedily on one prompt
with autoregressive first (the speed and lossless reference); a headline that answers "which is
fastest, and is every output the same?", the table, the speedup bars, the race, and each run's
coloured text.

Every handler returns a `{component: value}` dict. Project errors become a message in the status
line and clear the views they would have made stale. The work is in ui/compare.py (no gradio).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from decoders import DecodingLabError
from decoders.core.readings import fmt_speedup
from visualizer import quality_chart, race_chart, speedup_chart, token_spans_html

from .common import api, budget_slider, gpu, message, model_picker
from .compare import (
    DEFAULT_PRESET,
    MAX_ROUNDS,
    PRESETS,
    ROUNDS,
    TABLE_HEADERS,
    Comparison,
    compare_methods,
    prices_line,
    remeasure_prices,
    table_rows,
)
from .traces import EXAMPLE_PROMPTS

SPECS_HELP = (
    "Method specs, one per line: NAME or NAME:KEY=VALUE[:KEY=VALUE] "
    "(e.g. token_tree:draft=eagle:lookup=3). Autoregressive always runs first, as the reference."
)


@dataclass
class CompareTab:
    """The tab's components, kept by name so handlers can say what they update."""

    prompt: Any
    preset: Any
    specs: Any
    model: Any
    max_new: Any
    rounds: Any
    button: Any
    status: Any
    headline: Any
    table: Any
    chart: Any
    race: Any
    texts: Any
    quality: Any
    prices: Any

    @property
    def views(self) -> list[Any]:
        return [
            self.status,
            self.headline,
            self.table,
            self.chart,
            self.quality,
            self.race,
            self.texts,
            self.prices,
        ]

    def cleared(self, status: str) -> dict:
        return {
            self.status: status,
            self.headline: "",
            self.table: gr.Dataframe(value=[], headers=TABLE_HEADERS),
            self.chart: None,
            self.race: None,
            self.texts: "",
            self.quality: gr.Plot(value=None, visible=False),
            self.prices: "",
        }

    def shown(self, result: Comparison, status: str) -> dict:
        return {
            self.status: status,
            self.headline: f"**{html.escape(result.headline())}**",
            self.prices: prices_line(result.prices),
            self.table: gr.Dataframe(value=table_rows(result.rows), headers=TABLE_HEADERS),
            self.chart: speedup_chart(result.rows),
            self.race: race_chart(race_runs(result)),
            self.texts: texts_html(result),
            # drawn when a lossy method ran: its quality against its speed
            self.quality: gr.Plot(
                value=quality_chart(result.rows) if any(r["lossy"] for r in result.rows) else None,
                visible=any(r["lossy"] for r in result.rows),
            ),
        }


def race_runs(result: Comparison) -> list[tuple[str, list, list[float] | None]]:
    """(label, events, commit times) per finished run; the label carries its speedup."""
    return [
        (
            f"{row['method']} · {fmt_speedup(row['speedup'])}",
            result.traces[row["method"]].events,
            result.traces[row["method"]].meta.get("commit_s"),
        )
        for row in result.rows
    ]


def texts_html(result: Comparison) -> str:
    """Each run's output, coloured by where each token came from (the legend once, on top)."""
    parts = []
    for i, row in enumerate(result.rows):
        trace = result.traces[row["method"]]
        parts.append(
            f"<h4 style='margin:12px 0 4px;overflow-wrap:anywhere'>{html.escape(row['method'])}"
            f" <small style='font-weight:normal'>{html.escape(row['lossless'])}</small></h4>"
            + token_spans_html(trace.events, trace.texts, legend=i == 0)
        )
    return "".join(parts)


def preset_value(name: str) -> Any:
    """The specs box's new value for a preset; an unknown name (a cleared dropdown) leaves the
    box as it is (an empty update would be read as its new value)."""
    return "\n".join(PRESETS[name]) if name in PRESETS else gr.skip()


def build_compare_tab(choices: list[tuple[str, str]]) -> CompareTab:
    """Call inside a `gr.Tab` (within the page's gr.Blocks): lays the tab out, wires its handlers."""
    with gr.Row(elem_id="cmp-row"):
        with gr.Column(scale=2, min_width=320):
            prompt = gr.Textbox(
                label="Prompt", lines=4, value=EXAMPLE_PROMPTS[0], elem_id="cmp-prompt"
            )
            gr.Examples([[p] for p in EXAMPLE_PROMPTS], [prompt], label="Examples")
            preset = gr.Dropdown(
                list(PRESETS),
                value=DEFAULT_PRESET,
                label="Preset (fills the specs below)",
                elem_id="cmp-preset",
            )
            specs = gr.Textbox(
                value="\n".join(PRESETS[DEFAULT_PRESET]),
                label="Method specs",
                info=SPECS_HELP,
                lines=6,
                max_lines=16,
                elem_id="cmp-specs",
            )
            with gr.Row():
                model = model_picker(choices, "cmp-model")
                max_new = budget_slider("cmp-max-new", min_width=200)
            rounds = gr.Slider(
                1,
                MAX_ROUNDS,
                value=ROUNDS,
                step=1,
                label="Rounds: each spec runs this often, autoregressive in every round; a "
                "speedup is the median of its rounds, with their range",
                elem_id="cmp-rounds",
            )
            button = gr.Button("Compare", variant="primary", elem_id="cmp-btn")
            status = gr.Markdown(elem_id="cmp-status")
        with gr.Column(scale=3, min_width=320):
            headline = gr.Markdown(elem_id="cmp-headline")
            table = gr.Dataframe(
                headers=TABLE_HEADERS,
                label="Results: greedy, autoregressive first as the speed and lossless reference "
                "(a busy machine makes speeds noisy: more rounds steady them)",
                interactive=False,
                # Long cells wrap (a spec between its settings, a verdict between words) in
                # columns of fixed widths that fit the results column at 1440 px (shares would
                # squeeze a phone's cells to a letter a line); on a phone the numbers scroll
                # beside the pinned spec. Tall enough for the presets' 15 rows.
                wrap=True,
                column_widths=[
                    "132px",
                    "74px",
                    "92px",
                    "96px",
                    "64px",
                    "74px",
                    "64px",
                    "64px",
                    "56px",
                ],
                pinned_columns=1,
                max_height=1000,
                elem_id="cmp-table",
            )
            with gr.Row(equal_height=False):
                prices = gr.Markdown(elem_id="cmp-prices")
                remeasure = gr.Button(
                    "Re-measure this machine's prices",
                    size="sm",
                    scale=0,
                    min_width=120,
                    elem_id="cmp-remeasure",
                )
            chart = gr.Plot(label="Speedup", elem_id="cmp-plot", show_label=False)
            quality = gr.Plot(
                label="Quality against speed",
                elem_id="cmp-quality",
                show_label=False,
                visible=False,
            )
            race = gr.Plot(label="Race", elem_id="cmp-race", show_label=False)
            texts = gr.HTML(elem_id="cmp-texts")

    tab = CompareTab(
        prompt,
        preset,
        specs,
        model,
        max_new,
        rounds,
        button,
        status,
        headline,
        table,
        chart,
        race,
        texts,
        quality,
        prices,
    )

    def on_remeasure(model_id: str) -> Iterator[str]:
        yield "⏳ measuring this machine's prices (a few seconds; runs wait for it)…"
        try:
            yield f"Re-measured. {prices_line(remeasure_prices(model_id))}"
        except DecodingLabError as exc:
            yield message(str(exc))

    remeasure.click(on_remeasure, model, prices, api_visibility="private", concurrency_id="decode")

    def on_preset(name: str) -> dict:
        return {tab.specs: preset_value(name)}

    preset.change(on_preset, preset, specs, api_visibility="private")

    @gpu
    def on_compare(
        model_id: str, prompt_text: str, spec_text: str, budget: float, n_rounds: float
    ) -> Iterator[dict]:
        yield tab.cleared("⏳ Checking the specs and loading the model…")
        try:
            runs = compare_methods(model_id, prompt_text, spec_text, budget, rounds=n_rounds)
            for result in runs:
                if result.done:
                    model_used = result.traces[result.specs[0].label].meta["model"]
                    yield tab.shown(
                        result,
                        f"✅ Done. {result.runs_total} runs ({len(result.rows)} specs) on "
                        f"{model_used}.",
                    )
                else:
                    yield tab.shown(result, f"⏳ {result.progress}…")
        except DecodingLabError as exc:
            yield tab.cleared(message(str(exc)))

    button.click(
        on_compare,
        [model, prompt, specs, max_new, rounds],
        tab.views,
        api_visibility="private",
        concurrency_id="decode",
        show_progress="hidden",  # the status line says where it is
    )
    return tab


def compare(
    prompt: str,
    methods: str = "autoregressive",
    model: str = "",
    max_new_tokens: int = 64,
    rounds: int = ROUNDS,
) -> dict:
    """Run several method specs (comma-separated; NAME or NAME:KEY=VALUE[:KEY=VALUE]) greedily on
    one prompt, autoregressive first and in every round; a speedup is the median of `rounds`.
    Returns rows (one per spec), texts (by spec) and the headline."""
    try:
        *_, result = compare_methods(model or None, prompt, methods, max_new_tokens, rounds=rounds)
    except DecodingLabError as exc:
        raise gr.Error(str(exc)) from None
    return {
        "rows": result.rows,
        "texts": {label: t.meta["text"] for label, t in result.traces.items()},
        "headline": result.headline(),
        "prices": result.prices.to_dict() if result.prices else None,
    }


def register_compare_api() -> None:
    """Call inside the page's gr.Blocks: the `/compare` endpoint for gradio_client."""
    api(gpu(compare), "compare", ["comparison"], concurrency_id="decode")
