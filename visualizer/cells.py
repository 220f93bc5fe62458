"""What the grid views share (Jacobi's trajectory, Lookahead's window and pool, the attention
mask, SPACE's relay, Mask-Predict's refinement, the exits): the event at a step, token labels,
heatmaps of coded cells with their legend swatches, and the colours of their states."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import plotly.graph_objects as go

from decoders.core.events import (
    Event,
)

from .text import cut, escape, token_hover, visible
from .tokens import COLOURS, LABELS

BOUNDARY_COLOUR = "#1b5e20"  # the accepted path / fixed-point boundary, as in the tree view
SEPARATOR_COLOUR = "#37474f"
MAX_ITERATIONS = 16  # Jacobi rows shown: the last ones up to the selected step
# Jacobi columns drawn at most: the last positions. The page validates imported traces, but a view
# must not loop over 10^9 positions because a start says so.
MAX_POSITIONS = 64

# status -> (colour, legend label); the index of a status is its heatmap code.
JACOBI_STATUS: dict[str, tuple[str, str]] = {
    "fixed": (COLOURS["target"], "fixed: committed earlier"),
    "converged": (COLOURS["draft"], "converged: accepted this iteration"),
    "wrong": (COLOURS["rejected"], "first wrong guess (the target's token replaces it)"),
    "changed": (COLOURS["correction"], "changed by the previous forward"),
    "unchanged": (COLOURS["pending"], "unchanged since the previous iteration"),
}
WINDOW_STATUS: dict[str, tuple[str, str]] = {
    "history": (COLOURS["target"], "Jacobi history (a level of the window)"),
    "guess": (COLOURS["bonus"], "new guess (the target's output on top)"),
}
ADDED_LABEL = "green frame: its n-gram joined the pool"
CANDIDATE_STATUS: dict[str, tuple[str, str]] = {
    "root": (COLOURS["target"], "x (the last committed token)"),
    "accepted": (COLOURS["draft"], LABELS["draft"]),
    "rejected": (COLOURS["rejected"], LABELS["rejected"]),
    "not checked": (COLOURS["pending"], "not checked (an ancestor was rejected)"),
}
MASK_BRANCH: dict[str, tuple[str, str]] = {
    "masked": ("#f5f5f5", "not visible"),
    "x": ("#78909c", "x (last committed token)"),
    "lookahead": ("#64b5f6", "lookahead branch (Jacobi window)"),
    "verify": ("#66bb6a", "verification branch (candidate n-grams)"),
    "mask": ("#ffb74d", "mask input (SPACE's groups, Mask-Predict's masks)"),
    "kept": ("#ba68c8", "kept fill (Mask-Predict: a real input)"),
    "committed": ("#b0bec5", "committed token entering the cache"),
    "other": ("#ce93d8", "other input"),
}
INPUT_BRANCHES = tuple(b for b in MASK_BRANCH if b != "masked")  # legend and count order
MASK_NOTE = "every input also sees the whole cached context (not drawn)"

E = TypeVar("E", bound=Event)


# --- helpers --------------------------------------------------------------------------------------


def _at(events: Sequence[Event], cls: type[E], step: int) -> E | None:
    return next(
        (e for e in events if isinstance(e, cls) and getattr(e, "step", None) == step), None
    )


def _tok(texts: Mapping[int, str], t: int | None) -> str:
    """A token for hover text: its repr, escaped for Plotly, and its id."""
    if t is None:
        return "? · id ?"
    return token_hover(texts.get(t, "?"), t)


def _gram(gram: Sequence[int], texts: Mapping[int, str], limit: int = 40) -> str:
    """An n-gram as one escaped label: token texts joined by '|', whitespace made visible."""
    return escape(cut("|".join(visible(texts.get(t, "?")) for t in gram), limit))


def _scale(colours: Sequence[str]) -> list[list]:
    """A stepped colour scale: integer code c (with zmin=-0.5, zmax=k-0.5) gets colours[c]."""
    k = len(colours)
    scale: list[list] = []
    for c, colour in enumerate(colours):
        scale += [[c / k, colour], [(c + 1) / k, colour]]
    return scale


def _swatch(colour: str, name: str) -> go.Scatter:
    """A legend entry for a heatmap colour (heatmaps have no per-category legend)."""
    return go.Scatter(
        x=[None],
        y=[None],
        mode="markers",
        marker=dict(symbol="square", size=12, color=colour, line=dict(width=1, color="#90a4ae")),
        name=name,
        hoverinfo="skip",
        showlegend=True,
    )


def _codes(styles: Mapping[str, tuple[str, str]]) -> dict[str, int]:
    return {name: i for i, name in enumerate(styles)}


def _heatmap(
    z: list[list[int | None]],
    styles: Mapping[str, tuple[str, str]],
    *,
    x: Sequence[float],
    y: Sequence[float],
    text: list[list[str]] | None,
    hover: list[list[str]],
    name: str,
    font_size: int = 11,
) -> go.Heatmap:
    colours = [c for c, _ in styles.values()]
    return go.Heatmap(
        x=list(x),
        y=list(y),
        z=z,
        text=text,
        texttemplate="%{text}" if text is not None else None,
        textfont=dict(size=font_size),
        customdata=hover,
        hovertemplate="%{customdata}<extra></extra>",
        hoverongaps=False,
        colorscale=_scale(colours),
        zmin=-0.5,
        zmax=len(colours) - 0.5,
        showscale=False,
        xgap=2,
        ygap=2,
        name=name,
    )
