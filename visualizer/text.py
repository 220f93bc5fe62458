"""Text inside the figures: token labels, escaping, wrapping, captions and the number formats.

Plotly renders text as a small HTML subset and does not wrap it, so every view shortens token
labels, escapes whatever came from the model and breaks long sentences itself; these helpers are
the one way each of those is done. Pure: strings in, strings out (add_caption edits a figure).

Plotly reads markup only where a `<` and a tag's name (a letter, or `/` and one) are closed by the
next `>` with no bracket between (and keeps the tag only when it is one of its own: br, b, i,
span, ...), and decodes an entity (`&lt;`, `&#60;`) wherever it sees one. So `escape` neutralises
exactly those: a `<` that starts a tag's name (its `>` too), and an `&` that starts an entity.
Everything else (`<=`, `x < 2 -> y`, `<|im_start|>`, a lone `<`) is left as written: Plotly shows
it as is, and a double escape showed "&lt;=". Escape a label once, after joining its pieces.

The chat template's tokens (`<|im_start|>`, a role name after it) are not the model's text; the
views spell them as markers (`Marker`, "⟨turn⟩"), which `cut` shortens inside their brackets and
`escape` draws muted (visualizer/tokens.py decides which tokens they are).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import plotly.graph_objects as go

from decoders.core.readings import fmt_rate, fmt_ratio, fmt_share, fmt_speedup  # noqa: F401  (one number format, charts included)

# Plotly does not wrap text: a caption line of at most this many characters (11 px) fits a figure
# on a 390 px phone as well as a 1440 px page.
CAPTION_CHARS = 52
CAPTION_FONT = dict(size=11, color="#455a64")
LINE_PX = 15  # one caption line at 11 px

MARK_OPEN, MARK_CLOSE = "⟨", "⟩"
MARK_INK = "#78909c"  # a marker's muted ink, in figures and in the token spans
MARKER_NOTE = "⟨…⟩: chat-template tokens, not the model's text"
_PAIR = re.compile(r"<(/?[A-Za-z][^<>]*)>")  # what Plotly would read as a tag
_OPENER = re.compile(r"<(?=[A-Za-z/])")  # a tag's `<` that no `>` closes here (a later one could)
_ENTITY = re.compile(r"&(?=#\d+;|#x[\da-fA-F]+;|[A-Za-z]+;)")
_MARKED = re.compile(f"{MARK_OPEN}[^{MARK_OPEN}{MARK_CLOSE}<>&]{{0,24}}{MARK_CLOSE}")
# The markup Plotly draws (its tags): a wrap never breaks inside one, and it takes no width.
_MARKUP = re.compile(r"</?(?:br|sup|sub|span|em|s|u|b|i|a)(?:\s[^<>]*)?/?>", re.IGNORECASE)
_ENTITY_TEXT = re.compile(r"&(?:#\d+|#x[\da-fA-F]+|[A-Za-z]+);")


class Marker(str):
    """A chat-template token as the views spell it ("⟨turn⟩"); `original` is its own text
    ("<|im_start|>"), which the hover still shows."""

    original: str

    def __new__(cls, shown: str, original: str) -> Marker:
        self = super().__new__(cls, shown)
        self.original = original
        return self


def is_marker(text: str) -> bool:
    """A label that is a marker's spelling ("⟨turn⟩", or one shortened inside its brackets)."""
    return len(text) >= 2 and text[0] == MARK_OPEN and text[-1] == MARK_CLOSE


def escape(text: str) -> str:
    """Model text for Plotly's HTML subset: what Plotly would read as markup or an entity is
    escaped, nothing else (see the module doc; quotes are left alone: Plotly shows &quot;
    literally), and every marker (⟨…⟩) is drawn in its muted ink."""
    text = _ENTITY.sub("&amp;", text)
    text = _PAIR.sub(lambda m: f"&lt;{m.group(1)}&gt;", text)
    text = _OPENER.sub("&lt;", text)
    return _MARKED.sub(lambda m: f'<span style="color:{MARK_INK}">{m.group()}</span>', text)


def shown_length(label: str) -> int:
    """The characters a Plotly label shows: its tags take no room, an entity one character."""
    return len(_ENTITY_TEXT.sub("x", _MARKUP.sub("", label.replace("\0", " "))))


def visible(text: str) -> str:
    """A token's newlines and tabs as visible marks (a label on one line must still show them),
    and a token of spaces only as ␣ each (it would be a blank cell or node otherwise)."""
    if text and text.strip(" ") == "":
        return "␣" * len(text)
    return text.replace("\n", "↵").replace("\t", "⇥")


def cut(text: str, limit: int, tail: str = "…") -> str:
    """At most `limit` characters, the last one(s) `tail` when something was cut; a marker is
    shortened inside its brackets ("⟨assi⟩"), so it still reads as one."""
    if len(text) <= limit:
        return text
    if is_marker(text):
        return text[: limit - 1] + MARK_CLOSE if limit >= 3 else (MARK_OPEN + MARK_CLOSE)[:limit]
    return text[: max(limit - len(tail), 0)] + tail


def short_token(text: str, limit: int) -> str:
    """A token's in-figure label: whitespace made visible, its first `limit` characters (then an
    ellipsis when it is longer), escaped."""
    shown = visible(text)
    if len(shown) > limit:  # a marker keeps its brackets in the ellipsis' place
        shown = cut(shown, limit + 1) if is_marker(shown) else shown[:limit] + "…"
    return escape(shown)


def token_hover(text: str, token_id: int | None) -> str:
    """A token for hover text: its repr (every character shown), escaped, and its id; a marker
    as its spelling and the template's own text."""
    tid = "?" if token_id is None else token_id
    if isinstance(text, Marker):
        return f"{escape(text)} (the chat template's {escape(repr(text.original))}) · id {tid}"
    return f"{escape(repr(text))} · id {tid}"


def wrap(text: str, width: int) -> str:
    """Break a sentence into <br>-separated lines of at most ~`width` shown characters, at spaces
    only (a word longer than `width` keeps a line of its own; a tag is never broken and takes no
    width). The text is not escaped here: callers pass either plain text through escape() first
    or labels they have already escaped."""
    protected = _MARKUP.sub(lambda m: m.group().replace(" ", "\0"), text)
    lines: list[str] = []
    for word in protected.split(" "):
        if lines and shown_length(lines[-1]) + 1 + shown_length(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines).replace("\0", " ")


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
