"""How a tour stop's figure points: `mark` dims what the stop does not ask to look at (readable
on a projector), `question` paints over a stop's answer until the class has predicted it. Pure:
a Plotly figure in, one out (no gradio, no model)."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from visualizer.cells import BOUNDARY_COLOUR
from visualizer.tokens import COLOURS

DIM_INK = "#37474f"  # a dimmed part's text: 9:1 on white, readable on a projector


def _faded(colour: str, share: float = 0.55) -> str:
    """`colour` (#rrggbb) mixed with white: a dimmed box, its text kept dark on it."""
    if not (isinstance(colour, str) and re.fullmatch(r"#[0-9a-fA-F]{6}", colour)):
        return colour
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * share):02x}" for c in rgb)


def mark(fig: go.Figure, focus: Sequence[str]) -> go.Figure:
    """Dim what the stop does not ask to look at: every legend entry whose name contains none of
    `focus` (its markers and lines half faded, outlined, its text kept dark), and the boxes
    (annotations) filled in a dimmed entry's colour (the fill faded, the text kept dark). What
    is dimmed stays readable on a projector: its text at 9:1, its shapes outlined."""
    if not focus:
        return fig
    dimmed: set[str] = set()
    for tr in fig.data:
        name = tr.name or ""
        if any(f in name for f in focus):
            continue
        marker = getattr(tr, "marker", None)
        colour = getattr(marker, "color", None)
        if marker is not None and "markers" in (getattr(tr, "mode", "") or ""):
            marker.opacity = 0.5
            marker.line = dict(color="#78909c", width=1)
        else:
            tr.opacity = 0.5
        if getattr(tr, "textfont", None) is not None:
            tr.textfont.color = DIM_INK
        if isinstance(colour, str):
            dimmed.add(colour)
    for a in fig.layout.annotations:
        if a.bgcolor in dimmed:
            a.bgcolor = _faded(a.bgcolor)
            a.font.color = DIM_INK
    return fig


# Predict, then reveal: the colours that say what happened to a guess (kept, rejected, corrected,
# a bonus, not checked), painted over in a stop's question state with one colour that says "?".
VERDICT_COLOURS = frozenset(
    COLOURS[k] for k in ("draft", "rejected", "correction", "pending", "relaxed")
)
UNKNOWN = "#e8eaf6"
COUNTED = re.compile(r"\(\+\d+\)")  # a row's committed count in a tick label ("2 (+3)")
TOLD = re.compile(r"\b(accepted|kept|rejected) \d+")  # an outcome counted in a note


def _painted(colour: Any) -> tuple[Any, bool]:
    """A marker's colour (one, or one per point) with every verdict colour painted over."""
    if isinstance(colour, str):
        return (UNKNOWN, True) if colour in VERDICT_COLOURS else (colour, False)
    if isinstance(colour, (list, tuple)) and all(isinstance(c, str) for c in colour):
        new = [UNKNOWN if c in VERDICT_COLOURS else c for c in colour]
        return new, new != list(colour)
    return colour, False


def question(fig: go.Figure, conceal: Sequence[str] = ()) -> go.Figure:
    """A stop's figure before its answer (a copy; `fig` is left as it is): the verdict colours
    painted over, the legend entries named in `conceal` hidden with the legend swatches that
    named a verdict, lines in a verdict colour and outlines (a highlight that points at the
    answer) removed, the subtitle that counts the outcome, the counts in tick labels and notes
    replaced by "?". The figure's tokens stay: they are the clue."""
    q = go.Figure(copy.deepcopy(fig.to_dict()))
    for tr in q.data:
        if any(c in (tr.name or "") for c in conceal):
            tr.visible = False
            continue
        marker = getattr(tr, "marker", None)
        if marker is not None and marker.color is not None:
            marker.color, painted = _painted(marker.color)
            if painted:  # its hover would say the verdict
                tr.hoverinfo, tr.hovertext, tr.hovertemplate = "skip", None, None
            if painted and tr.showlegend and tr.x is not None and all(x is None for x in tr.x):
                tr.visible = False  # a legend swatch for a verdict: the verdict itself
        line = getattr(tr, "line", None)
        if line is not None and line.color in VERDICT_COLOURS | {BOUNDARY_COLOUR}:
            tr.visible = False
        if tr.type == "heatmap" and tr.colorscale:
            tr.colorscale = [(v, UNKNOWN if c in VERDICT_COLOURS else c) for v, c in tr.colorscale]
    for a in q.layout.annotations:
        if a.bgcolor in VERDICT_COLOURS:
            a.bgcolor, a.hovertext = UNKNOWN, None
        if a.text:
            a.text = TOLD.sub(lambda m: f"{m.group(1)} ?", a.text)
    kept = []
    for shape in q.layout.shapes:
        fill = shape.fillcolor
        if fill is None or fill in ("rgba(0,0,0,0)", "transparent"):
            continue  # an outline that points at the answer
        kept.append(shape.update(fillcolor=UNKNOWN) if fill in VERDICT_COLOURS else shape)
    q.layout.shapes = kept
    q.layout.title.subtitle.text = "? the outcome is hidden until the reveal"
    for axis in (q.layout.yaxis, q.layout.xaxis):
        if axis.ticktext:
            axis.ticktext = [COUNTED.sub("(+?)", str(t)) for t in axis.ticktext]
    return q
