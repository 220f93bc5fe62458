"""Plotly figures drawn from trace events. Pure: events in, Figure out (no torch, no gradio)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from decoders.core.events import Commit, Event, Forward, TopK

from .draft_data import draft_rows
from .text import escape, short_token, wrap

# Every figure's theme, set as Plotly's default: a new figure takes the default template without
# validating it again, while `update_layout(template="plotly_white")` deep-copied and re-validated
# the whole template for each figure (50-80 ms of a view's drawing on these CPUs, 7x the rest).
pio.templates.default = "plotly_white"

# prefill is drawn in the target lane
LANES = ("target", "verify", "shallow", "sync", "draft", "oracle")
LANE_COLOURS = {
    "prefill": "#546e7a",
    "target": "#78909c",
    "verify": "#2e7d32",
    "draft": "#66bb6a",
    "shallow": "#b0bec5",  # FREE: the layers below the exit, every token
    "sync": "#f9a825",  # FREE's catch-up pass: held-back tokens through the deep layers
    "oracle": "#ce93d8",  # CALM's oracle peeking at the full model's token (not counted)
}
FONT = dict(family="Inter, system-ui, sans-serif", size=12)
# Plotly does not wrap text: a subtitle line of at most this many characters fits a figure on a
# 390 px phone (~340 px wide).
SUBTITLE_CHARS = 48
TITLE_CHARS = 44  # at the title's 14 px: ~310 px, clear of the toolbar on a 390 px phone
TITLE_LINE_PX = 19  # a title line at 14 px: a wrapped title grows the figure by its lines
TITLE_LINE_HEIGHT_PX = 18.2  # Plotly's line spacing (1.3) at the title's 14 px
TITLE_PAD_PX = 8
NOTE_LINE_PX = 16  # a subtitle line at 12 px


def _base_layout(fig: go.Figure, title: str, height: int = 260, subtitle: str = "") -> go.Figure:
    """The shared frame: a title (and an optional subtitle) in a top strip that pushes the plot
    down as far as it needs, the legend in a strip of its own at the bottom. Neither sits over
    the plot, and a legend that wraps on a narrow screen grows its strip instead of running into
    the title. A title longer than a 390 px phone's line wraps (never cut), and the figure grows
    by its extra lines, so the plot keeps its height."""
    if subtitle and "<br>" not in subtitle:
        subtitle = wrap(subtitle, SUBTITLE_CHARS)
    if "<br>" not in title:
        title = wrap(title, TITLE_CHARS)
    lines = title.count("<br>") + 1
    height += TITLE_LINE_PX * (lines - 1)
    # Plotly (6.x) sets a title of several lines with its last line where a one-line title's
    # would be, the others above the figure's top: the pad brings its first line down there.
    pad = TITLE_PAD_PX + (round(TITLE_LINE_HEIGHT_PX * lines) if lines > 1 else 0)
    fig.update_layout(
        title=dict(
            text=title,
            subtitle=dict(text=subtitle, font=dict(size=12, color="#546e7a")),
            x=0.01,
            xanchor="left",
            y=1,
            yanchor="top",
            yref="container",
            pad=dict(t=pad),
            automargin=True,
            font=dict(size=14),
        ),
        font=FONT,
        height=height + 20,
        margin=dict(l=60, r=20, t=24, b=10),
        # The toolbar shows on touch and hover at the top right: keep it to one narrow column
        # (download) so it never covers the title; hover is what these views are read with.
        modebar=dict(
            orientation="v",
            remove=[
                "zoom",
                "pan",
                "select",
                "lasso",
                "zoomIn",
                "zoomOut",
                "autoScale",
                "resetScale",
            ],
        ),
        legend=dict(
            orientation="h",
            yref="container",
            y=0,
            yanchor="bottom",
            xanchor="left",
            x=0.0,
            font=dict(size=11),
        ),
    )
    return fig


def add_note(fig: go.Figure, note: str) -> go.Figure:
    """One more line (already escaped) under a figure's subtitle, the figure grown by it."""
    subtitle = fig.layout.title.subtitle.text or ""
    fig.update_layout(title_subtitle_text=f"{subtitle}<br>{note}" if subtitle else note)
    if fig.layout.height:
        fig.update_layout(height=fig.layout.height + NOTE_LINE_PX * (note.count("<br>") + 1))
    return fig


def _empty(title: str, message: str, height: int = 260) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text=wrap(message, 44),
        showarrow=False,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        font=dict(size=13, color="#607d8b"),
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _base_layout(fig, title, height)


def forward_timeline(events: Sequence[Event], upto_step: int | None = None) -> go.Figure:
    """Every forward pass as a bar on a time axis, one lane per kind; hover: inputs, layers,
    tokens committed by that step. The lanes show where a method spends its time."""
    committed: dict[int, int] = defaultdict(int)
    for e in events:
        if isinstance(e, Commit):
            committed[e.step] += len(e.tokens)
    rows: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    clock = 0.0
    for e in events:
        if not isinstance(e, Forward):
            continue
        if upto_step is not None and e.step > upto_step:
            break
        kind = e.kind
        lane = "target" if kind == "prefill" else kind
        r = rows[kind]
        r["base"].append(clock)
        r["x"].append(e.wall_ms)
        r["y"].append(lane)
        r["text"].append(
            f"step {e.step} · {kind}<br>{e.n_input_tokens} input tokens · {e.layers} layers"
            f"<br>{e.wall_ms:.1f} ms · {committed.get(e.step, 0)} tokens committed this step"
        )
        clock += e.wall_ms
    if not rows:
        return _empty("Forward passes", "no forward passes yet")
    fig = go.Figure()
    for kind, r in rows.items():
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=r["base"],
                x=r["x"],
                y=r["y"],
                name=kind,
                marker=dict(
                    color=LANE_COLOURS.get(kind, "#90a4ae"), line=dict(width=0.5, color="white")
                ),
                hovertext=r["text"],
                hoverinfo="text",
            )
        )
    used = [lane for lane in LANES if any(lane in r["y"] for r in rows.values())]
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_xaxes(title_text="time since start (ms)")
    fig.update_yaxes(title_text="pass", categoryorder="array", categoryarray=list(reversed(used)))
    return _base_layout(
        fig,
        "Forward passes over time",
        height=140 + 45 * len(used),
        subtitle="one bar per forward pass; hover for its inputs",
    )


def tokens_per_step(events: Sequence[Event], upto_step: int | None = None) -> go.Figure:
    """Tokens committed by each step, coloured by origin: the 'several tokens per step' picture."""
    per_step: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        if isinstance(e, Commit) and (upto_step is None or e.step <= upto_step):
            for o in e.origins:
                per_step[e.step][o] += 1
    if not per_step:
        return _empty("Tokens per step", "no tokens yet")
    from .tokens import COLOURS, LABELS

    steps = sorted(per_step)
    fig = go.Figure()
    for origin in ("target", "draft", "relaxed", "correction", "bonus", "mask", "exit"):
        ys = [per_step[s].get(origin, 0) for s in steps]
        if any(ys):
            fig.add_trace(
                go.Bar(
                    x=steps,
                    y=ys,
                    name=LABELS.get(origin, origin),
                    marker_color=COLOURS.get(origin, "#ce93d8"),
                    marker_line=dict(width=0.5, color="#90a4ae"),
                )
            )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="step")
    peak = max(sum(counts.values()) for counts in per_step.values())
    fig.update_yaxes(title_text="tokens", rangemode="tozero", dtick=_whole_dtick(peak))
    return _base_layout(
        fig,
        "Tokens committed per step",
        height=240 + 20 * len(fig.data),  # each origin's legend row gets room; the plot keeps it
        subtitle="coloured by where each token came from",
    )


def _whole_dtick(peak: float) -> int:
    """A whole-number tick step that labels a count axis up to `peak` with at most ~5 ticks."""
    return max(1, math.ceil(peak / 5))


def acceptance_histogram(stats: Mapping[str, Any]) -> go.Figure:
    hist = stats.get("acceptance_histogram") or []
    if not hist:
        return _empty("Acceptance histogram", "no drafts: each step commits one target token")
    fig = go.Figure(
        go.Bar(
            x=list(range(len(hist))),
            y=hist,
            marker_color="#2e7d32",
            hovertemplate="%{y} steps accepted %{x} drafts<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="drafts accepted in a step", dtick=1)
    fig.update_yaxes(title_text="verify steps", dtick=_whole_dtick(max(hist)))  # counts: whole
    return _base_layout(fig, "Acceptance histogram")


def acceptance_by_position(stats: Mapping[str, Any]) -> go.Figure:
    rates = stats.get("acceptance_by_position") or []
    if not rates:
        return _empty("Acceptance rate by draft position", "no drafts in this method")
    fig = go.Figure(
        go.Bar(
            x=list(range(1, len(rates) + 1)),
            y=rates,
            marker_color="#43a047",
            hovertemplate="position %{x}: %{y:.0%} accepted<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(title_text="acceptance rate", range=[0, 1], tickformat=".0%")
    return _base_layout(fig, "Acceptance rate by draft position")


def _nothing_verified(stats: Mapping[str, Any]) -> str:
    """Why there is no acceptance to draw: no drafts at all, or guesses kept unverified."""
    unverified = sorted(o for o in (stats.get("origins") or {}) if o not in ("target", "prefill"))
    if unverified:  # Mask-Predict's mask fills, an early exit's tokens: nothing checked them
        return f"nothing verified: {', '.join(unverified)} tokens are kept unchecked (lossy)"
    return "no drafts: each step commits one target token"


def acceptance_panel(stats: Mapping[str, Any]) -> go.Figure:
    """Both acceptance views, one above the other (each full width, so ten draft positions stay
    readable on a phone): how many drafts each step kept, and how often each draft position
    survives (where the drafter stops agreeing with the target). What each bar counts is said in
    the subplot's title, so no axis title sits between the two plots."""
    from plotly.subplots import make_subplots

    if not stats.get("acceptance_histogram"):
        return _empty("Acceptance", _nothing_verified(stats))
    fig = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.3,
        subplot_titles=(
            "steps, by drafts accepted in the step",
            "acceptance rate, by draft position",
        ),
    )
    fig.update_annotations(font=dict(size=12, color="#455a64"), xanchor="left", x=0)
    for row, part in enumerate((acceptance_histogram(stats), acceptance_by_position(stats)), 1):
        for trace in part.data:
            fig.add_trace(trace, row=row, col=1)
        fig.update_xaxes(part.layout.xaxis, row=row, col=1)
        fig.update_yaxes(part.layout.yaxis, row=row, col=1)
        fig.update_yaxes(title_text="", row=row, col=1)
        fig.update_xaxes(tickfont=dict(size=11), row=row, col=1)
    fig.update_layout(showlegend=False)
    _base_layout(fig, "Acceptance", height=400)
    fig.update_layout(margin=dict(t=64))  # the first subplot's title sits under the main title
    return fig


def topk_panel(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Autoregressive's method panel: the target's top-k candidates at this step, the chosen one dark."""
    top = next((e for e in events if isinstance(e, TopK) and e.step == step), None)
    chosen = next((e.tokens[0] for e in events if isinstance(e, Commit) and e.step == step), None)
    if top is None:
        return _empty(
            f"Top candidates at step {step}", "this trace has no top-k detail for this step"
        )
    # A number in brackets beside a bar read as a count: the id says what it is.
    labels = [f"{escape(repr(texts.get(t, '?')))}<br>token id {t}" for t in top.tokens]
    colours = ["#2e7d32" if t == chosen else "#b0bec5" for t in top.tokens]
    fig = go.Figure(
        go.Bar(
            x=list(top.probs),
            y=labels,
            orientation="h",
            marker_color=colours,
            hovertemplate="%{y}<br>target probability %{x:.1%}<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="target probability", range=[0, 1], tickformat=".0%")
    fig.update_yaxes(title_text="", autorange="reversed", automargin=True, tickfont=dict(size=11))
    return _base_layout(
        fig,
        f"Step {step}: top-{len(top.tokens)} candidates",
        height=300,
        subtitle="the target's likeliest tokens; chosen: dark green",
    )


def draft_panel(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """A chain draft at one step: draft tokens on top (accepted green, first rejected red, never
    checked grey), the tokens the target committed underneath (orange correction, blue bonus)."""
    rows = draft_rows(events, texts, step)
    if rows is None:
        return _empty(
            f"Draft at step {step}", f"no draft at step {step}: a plain target step", height=220
        )
    fig = go.Figure()
    names = ["target", "draft"]
    for row in (rows.draft, rows.target, rows.own):
        if row is None:
            continue
        trace = _token_row(row.tokens, row.name, list(row.colours), texts, list(row.hover))
        if row.positions:
            trace.x = list(row.positions)
        fig.add_trace(trace)
    if rows.own is not None:
        names = [rows.own.name, *names]
    fig.update_xaxes(title_text="draft position", dtick=1, range=[0.3, rows.width + 0.7])
    fig.update_yaxes(title_text="", categoryorder="array", categoryarray=names)
    fig.update_layout(showlegend=False)
    title = f"Step {step}: {rows.source}"  # wrapped by the frame, never cut
    drafted = len(rows.draft.tokens)
    subtitle = f"drafted {drafted}, accepted {rows.accepted}; the target's tokens below"
    if rows.relaxed:
        subtitle = (
            f"drafted {drafted}, accepted {rows.accepted}, {rows.relaxed} of them (teal) only "
            "by the relaxed rule"
            + ("; the target's own choice at the bottom" if rows.own is not None else "")
        )
    return _base_layout(fig, title, height=290 if rows.own is not None else 230, subtitle=subtitle)


def _token_row(
    tokens: Sequence[int], row: str, colours: list[str], texts: Mapping[int, str], hover: list[str]
) -> go.Scatter:
    """One row of token boxes at draft positions 1..n (the draft panel's building block)."""
    return go.Scatter(
        x=list(range(1, len(tokens) + 1)),
        y=[row] * len(tokens),
        mode="markers+text",
        marker=dict(symbol="square", size=34, color=colours, line=dict(width=1, color="#90a4ae")),
        text=[short_token(texts.get(t, "?"), 5) for t in tokens],  # 34 px boxes: 6 characters
        textfont=dict(size=11),
        hovertext=hover,
        hoverinfo="text",
        name=row,
    )


def rank_axis(fig: go.Figure, columns: int, title: str) -> None:
    """An x axis of ranks 1..columns, one tick each (a grid of candidates: Medusa's heads, Token
    Recycling's adjacency rows)."""
    fig.update_xaxes(
        title_text=title,
        tickmode="array",
        tickvals=list(range(1, columns + 1)),
        range=[0.5, columns + 0.5],
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )


def legend_square(fig: go.Figure, fill: str, name: str, edge: str) -> None:
    """A legend entry alone: a filled square (the cells of a grid drawn as shapes or markers)."""
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            marker=dict(symbol="square", size=12, color=fill, line=dict(width=1, color=edge)),
            name=name,
            hoverinfo="skip",
        )
    )
