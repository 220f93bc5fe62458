"""The "why faster or slower" lab's figures: this machine's price curve (what a forward of n
inputs and each drafter's forward cost, in one-token forwards), and the theory of a chain drafter
on that table (acceptance rate, draft length and draft cost in, tokens per forward and speedup
out: PriceTable.chain_speedup) with every method's real run as a point on the same axes, and the
synthetic-acceptance runs that show measured speed following the curve. Pure: a table and rows
in, Figures out (no torch, no gradio); `speed_lab_data` holds what the theory figure shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from decoders.core.prices import PriceTable

from .compare_views import LOSSY_COLOUR, PALETTE, REFERENCE_COLOUR, _layout
from .text import fmt_ratio, fmt_speedup

THEORY_COLOUR = "#ef6c00"
ALPHAS = [i / 50 for i in range(51)]  # the curve's acceptance rates


def price_curve(table: PriceTable, whose: str) -> go.Figure:
    """A forward's cost against its inputs (the table's measured widths, and the line the
    modelled speedups interpolate), with each drafter's forward as a mark at one input."""
    fig = go.Figure()
    widest = max(table.widths)
    ns = list(range(1, widest + 1))
    fig.add_trace(
        go.Scatter(
            x=ns,
            y=[table.inputs(n) for n in ns],
            mode="lines",
            line=dict(color=PALETTE[0]),
            name="a target forward of n inputs",
            hovertemplate="%{x} inputs: %{y:.2f} one-token forwards<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=list(table.widths),
            y=list(table.curve),
            mode="markers",
            marker=dict(size=8, color=PALETTE[0]),
            name="measured (medians of the rounds)",
            hovertemplate="%{x} inputs: %{y:.3f}<extra>measured</extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=ns,
            y=ns,
            mode="lines",
            line=dict(dash="dot", color=REFERENCE_COLOUR),
            name="n one-token forwards",
            hoverinfo="skip",
        )
    )
    if table.drafters:
        names = list(table.drafters)
        fig.add_trace(
            go.Scatter(
                x=[1] * len(names),
                y=[table.drafters[k] for k in names],
                mode="markers",
                marker=dict(size=8, symbol="diamond", color=THEORY_COLOUR),
                hovertext=[f"{k}: {table.drafters[k]:.3f} of a one-token forward" for k in names],
                hoverinfo="text",
                name="a drafter's forward (hover: each)",
            )
        )
    fig.update_xaxes(title_text="inputs in one forward", range=[0.5, widest + 0.5])
    fig.update_yaxes(
        title_text="cost (one-token forwards)",
        range=[0, max(table.curve) * 1.25],
        rangemode="tozero",
    )
    return _layout(fig, f"What a forward costs ({whose})", height=360, top=70)


@dataclass(frozen=True)
class SpeedLabData:
    """What the lab's theory figure shows: the chain theory's curve (tokens per forward, speedup)
    over ALPHAS, the slider's point on it, the real runs by kind, the synthetic-acceptance runs
    with the theory at their draft cost, and the axes' reach."""

    gamma: int
    draft_cost: float
    acceptance: float
    curve: list[tuple[float, float]]
    here: tuple[float, float]
    runs: list[tuple[bool, list[Mapping[str, Any]]]]  # (lossy, its runs), lossless first
    synthetic: list[Mapping[str, Any]]
    synthetic_cost: float | None
    synthetic_curve: list[tuple[float, float]] | None  # the theory at `synthetic_cost`
    x_top: float
    y_high: float


def speed_lab_data(
    table: PriceTable,
    acceptance: float,
    gamma: int,
    draft_cost: float,
    rows: Sequence[Mapping[str, Any]] = (),
    synthetic: Sequence[Mapping[str, Any]] = (),
    synthetic_cost: float | None = None,
) -> SpeedLabData:
    """The theory figure's data (see `speed_lab`): the runs without tokens per forward are left
    out, and so is the synthetic runs' curve without them or their draft cost."""
    curve = [table.chain_speedup(a, gamma, draft_cost) for a in ALPHAS]
    points = [r for r in rows if r.get("tokens_per_target_forward")]
    runs = [
        (lossy, [r for r in points if bool(r.get("lossy")) == lossy]) for lossy in (False, True)
    ]
    theirs = None
    if synthetic and synthetic_cost is not None:
        theirs = [table.chain_speedup(a, gamma, synthetic_cost) for a in ALPHAS]
    top = max([gamma + 1.0, *(float(r["tokens_per_target_forward"]) for r in points)]) * 1.08
    high = max(
        [y for _, y in curve]
        + [float(r["speedup"]) for r in [*points, *synthetic]]
        + [float(r.get("modelled_speedup") or 0) for r in points]
        + [1.2]
    )
    return SpeedLabData(
        gamma=gamma,
        draft_cost=draft_cost,
        acceptance=acceptance,
        curve=curve,
        here=table.chain_speedup(acceptance, gamma, draft_cost),
        runs=[(lossy, group) for lossy, group in runs if group],
        synthetic=list(synthetic),
        synthetic_cost=synthetic_cost,
        synthetic_curve=theirs,
        x_top=top,
        y_high=high,
    )


def _theory_traces(fig: go.Figure, data: SpeedLabData) -> None:
    """The theory curve, and the slider's acceptance rate on it."""
    curve = data.curve
    fig.add_trace(
        go.Scatter(
            x=[x for x, _ in curve],
            y=[y for _, y in curve],
            mode="lines",
            line=dict(color=THEORY_COLOUR, width=3),
            name=f"theory: γ = {data.gamma}, draft cost {data.draft_cost:.2f}",
            hovertext=[
                f"acceptance {a:.0%}: {fmt_ratio(x)} tokens per forward, {fmt_speedup(y)}"
                for a, (x, y) in zip(ALPHAS, curve, strict=True)
            ],
            hoverinfo="text",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[data.here[0]],
            y=[data.here[1]],
            mode="markers+text",
            marker=dict(size=14, color=THEORY_COLOUR, symbol="star"),
            text=[f"α = {data.acceptance:.0%}: {fmt_speedup(data.here[1])}"],
            textposition="top left",
            name="the slider's acceptance rate",
        )
    )


def _run_traces(fig: go.Figure, lossy: bool, group: Sequence[Mapping[str, Any]]) -> None:
    """The methods' runs of one kind: measured filled, modelled hollow."""
    colour = LOSSY_COLOUR if lossy else PALETTE[0]
    kind = "lossy" if lossy else "lossless"
    fig.add_trace(
        go.Scatter(
            x=[r["tokens_per_target_forward"] for r in group],
            y=[r["speedup"] for r in group],
            mode="markers",
            marker=dict(size=9, color=colour),
            hovertext=[
                f"{r['method']}: {fmt_ratio(r['tokens_per_target_forward'])} tokens per "
                f"forward, measured {fmt_speedup(r['speedup'])}, modelled "
                f"{fmt_speedup(r.get('modelled_speedup'))}"
                for r in group
            ],
            hoverinfo="text",
            name=f"a method's run, measured ({kind}; hover: each)",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[r["tokens_per_target_forward"] for r in group if r.get("modelled_speedup")],
            y=[r["modelled_speedup"] for r in group if r.get("modelled_speedup")],
            mode="markers",
            marker=dict(size=9, color=colour, symbol="circle-open"),
            hoverinfo="skip",
            name=f"… its modelled speedup ({kind})",
        )
    )


def _synthetic_traces(fig: go.Figure, data: SpeedLabData) -> None:
    """The theory at the synthetic runs' draft cost (dashed), and the runs themselves."""
    if data.synthetic_curve is not None:
        fig.add_trace(
            go.Scatter(
                x=[x for x, _ in data.synthetic_curve],
                y=[y for _, y in data.synthetic_curve],
                mode="lines",
                line=dict(color=THEORY_COLOUR, width=1.5, dash="dash"),
                name=f"theory at the runs' draft cost ({data.synthetic_cost:.2f})",
                hoverinfo="skip",
            )
        )
    synthetic = data.synthetic
    if synthetic:
        fig.add_trace(
            go.Scatter(
                x=[r["tokens_per_target_forward"] for r in synthetic],
                y=[r["speedup"] for r in synthetic],
                mode="markers+text",
                marker=dict(size=11, color="#37474f", symbol="x"),
                text=[f"{float(r['synthetic']):.0%}" for r in synthetic],
                textposition="bottom right",
                hovertext=[
                    f"synthetic acceptance {float(r['synthetic']):.0%} (not exact): "
                    f"{fmt_ratio(r['tokens_per_target_forward'])} tokens per forward, measured "
                    f"{fmt_speedup(r['speedup'])}, modelled {fmt_speedup(r.get('modelled_speedup'))}"
                    for r in synthetic
                ],
                hoverinfo="text",
                name="synthetic acceptance, run here (not exact)",
            )
        )


def speed_lab(
    table: PriceTable,
    acceptance: float,
    gamma: int,
    draft_cost: float,
    rows: Sequence[Mapping[str, Any]] = (),
    synthetic: Sequence[Mapping[str, Any]] = (),
    synthetic_cost: float | None = None,
) -> go.Figure:
    """Tokens per target forward (x) against speedup (y): the theory curve of a chain drafter
    drafting `gamma` tokens at `draft_cost` as its acceptance rate runs 0 to 1, the slider's
    rate marked on it; each method's real run (`rows`: measured filled, modelled hollow, lossy
    ones in their colour) and each synthetic-acceptance run (`synthetic`, marked not exact),
    with the theory at the draft cost they ran at (`synthetic_cost`) dashed beside them."""
    data = speed_lab_data(table, acceptance, gamma, draft_cost, rows, synthetic, synthetic_cost)
    fig = go.Figure()
    _theory_traces(fig, data)
    for lossy, group in data.runs:
        _run_traces(fig, lossy, group)
    _synthetic_traces(fig, data)
    fig.add_hline(y=1.0, line=dict(color="#cfd8dc", width=1))
    fig.update_xaxes(title_text="tokens per target forward", range=[0.9, data.x_top])
    fig.update_yaxes(title_text="speedup over autoregressive (×)", range=[0, data.y_high * 1.1])
    return _layout(fig, "Theory against real runs", height=480, top=70)
