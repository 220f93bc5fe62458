"""Text inside the figures: token labels, escaping, wrapping, captions and the number formats.

Plotly renders text as a small HTML subset and does not wrap it, so every view shortens token
labels, escapes whatever came from the model and breaks long sentences itself; these helpers are
the one way each of those is done. Pure: strings in, strings out (add_caption edits a figure).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go

from decoders.core.readings import fmt_rate, fmt_ratio, fmt_share, fmt_speedup  # noqa: F401  (one number format, charts included)

# Plotly does not wrap text: a caption line of at most this many characters (11 px) fits a figure
# on a 390 px phone as well as a 1440 px page.
CAPTION_CHARS = 52
CAPTION_FONT = dict(size=11, color="#455a64")
LINE_PX = 15  # one caption line at 11 px


def escape(text: str) -> str:
    """Escape for Plotly's HTML subset (quotes are left alone: Plotly shows &quot; literally)."""
    return html.escape(text, quote=False)


def visible(text: str) -> str:
    """A token's newlines and tabs as visible marks (a label on one line must still show them),
    and a token of spaces only as ␣ each (it would be a blank cell or node otherwise)."""
    if text and text.strip(" ") == "":
        return "␣" * len(text)
    return text.replace("\n", "↵").replace("\t", "⇥")


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, the last one an ellipsis when something was cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def short_token(text: str, limit: int) -> str:
    """A token's in-figure label: whitespace made visible, its first `limit` characters (then an
    ellipsis when it is longer), escaped."""
    shown = visible(text)
    return escape(shown[:limit] + ("…" if len(shown) > limit else ""))


def token_hover(text: str, token_id: int | None) -> str:
    """A token for hover text: its repr (every character shown), escaped, and its id."""
    return f"{escape(repr(text))} · id {'?' if token_id is None else token_id}"


def wrap(text: str, width: int) -> str:
    """Break a sentence into <br>-separated lines of at most ~`width` characters, at spaces only
    (a word longer than `width` keeps a line of its own). The text is not escaped here: callers
    pass either plain text through escape() first or labels they have already escaped."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def add_caption(
    fig: go.Figure,
    sentences: Sequence[str],
    height: int,
    *,
    gap_px: int = 6,
    below_px: int = 30,
    from_figure_edge: bool = False,
) -> go.Figure:
    """Plain sentences as a wrapped caption under the plot, in a bottom margin sized to hold it.

    `height` is the plot's height before the caption, `gap_px` the space between the plot's
    bottom and the caption (room for tick labels), `below_px` the margin besides the caption's
    lines (a legend row under it, if any). With `from_figure_edge` the caption starts at the
    figure's left edge instead of the plot's, so it has the full width to wrap in."""
    lines = "<br>".join(wrap(escape(s), CAPTION_CHARS) for s in sentences if s)
    n_lines = lines.count("<br>") + 1
    left = fig.layout.margin.l if fig.layout.margin.l is not None else 60
    fig.add_annotation(
        text=lines,
        x=0.0,
        xref="paper",
        xanchor="left",
        xshift=8 - left if from_figure_edge else 0,
        y=0.0,
        yref="paper",
        yanchor="top",
        yshift=-gap_px,
        align="left",
        showarrow=False,
        font=CAPTION_FONT,
    )
    fig.update_layout(
        height=height + 20 + LINE_PX * n_lines, margin=dict(b=below_px + LINE_PX * n_lines)
    )
    return fig
