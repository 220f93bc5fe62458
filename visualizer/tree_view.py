"""The draft token tree of one decoding step, as a Plotly figure. Pure: events in, Figure out.
What it shows is computed in tree_data; this module lays it out and draws it.

A tree drafter proposes many continuations at once; the picture shows which branch the target
took (bold green path, ending in its own correction or bonus token), which siblings it compared
and turned down (red), and which nodes were never checked because an ancestor lost (grey).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import plotly.graph_objects as go

from decoders.core.events import Event

from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .text import escape, short_token, token_hover, visible, wrap
from .tokens import COLOURS, LABELS

# The data helpers stay importable from here, as before.
from .tree_data import MAX_NODES as MAX_NODES
from .tree_data import TreeData, TreeNode, check_parents, tree_data
from .tree_data import _p as _p
from .tree_data import _root_token as _root_token
from .tree_data import copied_chain as copied_chain
from .tree_data import drawn_nodes as drawn_nodes
from .tree_data import override_said as override_said
from .tree_data import which_branch_won as which_branch_won

EDGE_COLOUR = "#b0bec5"
PATH_COLOUR = "#1b5e20"
COPY_COLOUR = "#8e24aa"  # the outline of a node on the chain copied from the context
# Legend order and wording; the colour keys are the shared colour language in tokens.py.
STATUS_STYLE: dict[str, tuple[str, str]] = {  # status -> (COLOURS key, legend label)
    "root": ("target", "root (last committed token)"),
    "accepted": ("draft", LABELS["draft"]),
    "relaxed": ("relaxed", LABELS["relaxed"]),
    "rejected": ("rejected", LABELS["rejected"]),
    "not checked": ("pending", "not checked (an ancestor was rejected)"),
    "after the end": ("pending", "never written (after the accepted end token)"),
    "correction": ("correction", LABELS["correction"]),
    "bonus": ("bonus", LABELS["bonus"]),
}
PX_PER_LEAF = 28  # a node's box is ~20 px tall: leaves never touch
MARGINS_PX = 150  # title strip on top, the depth axis and the legend below
MIN_HEIGHT, MAX_HEIGHT = 280, 1600
# Node labels: ~6.5 px a character at the 10 px monospace font, plus the box's padding and a gap.
CHAR_PX, BOX_PX = 6.5, 24
LABEL_MIN, LABEL_MAX = 3, 16  # a label is cut to fit, never below 3 characters, never above 16
PLOT_MARGINS_PX = 40  # the figure's left and right margins around the plot area (20 px each)
DEFAULT_WIDTH_PX = 330  # plot width when the page has not said (a 390 px phone's)


def tree_layout(parents: Sequence[int]) -> list[tuple[float, float]]:
    """(x, y) for the root (first entry) and then each node of a parent array.

    x is the depth (root 0), so a branch reads left to right like text; leaves take y = 0, 1, 2, …
    in depth-first order (children in index order) and each internal node sits at the mean y of
    its children, so no two subtrees overlap and every parent is level with its family.
    """
    n = len(parents)
    check_parents(parents)
    children: list[list[int]] = [[] for _ in range(n + 1)]  # slot 0 is the root, node i is i + 1
    depth = [0] * (n + 1)
    for i, p in enumerate(parents):
        children[p + 1].append(i + 1)
        depth[i + 1] = depth[p + 1] + 1
    y = [0.0] * (n + 1)
    next_leaf = 0
    stack = [0]
    while stack:  # iterative pre-order walk: deep chains cannot hit the recursion limit
        v = stack.pop()
        if not children[v]:
            y[v] = float(next_leaf)
            next_leaf += 1
        stack.extend(reversed(children[v]))
    for v in range(n, -1, -1):  # children have larger indices than their parents
        if children[v]:
            y[v] = sum(y[c] for c in children[v]) / len(children[v])
    return [(float(d), yy) for d, yy in zip(depth, y, strict=True)]


def column_layout(lengths: Sequence[int], width_px: int) -> tuple[int, list[float], float]:
    """Size the depth columns to their labels: `lengths[d]` is the longest label (in characters)
    at depth d. Returns the characters a label may show (as many as the widest needs when every
    column fits in `width_px`, the figure's width, else the most that fits), each column's centre
    and the columns' total width, in pixels of a plot as wide as its columns."""
    room = max(width_px - PLOT_MARGINS_PX, 1)

    def need(limit: int) -> list[float]:
        return [min(n, limit) * CHAR_PX + BOX_PX for n in lengths]

    limit = min(LABEL_MAX, max(lengths, default=LABEL_MIN))
    while limit > LABEL_MIN and sum(need(limit)) > room:
        limit -= 1
    widths = need(max(limit, LABEL_MIN))
    centres, left = [], 0.0
    for w in widths:
        centres.append(left + w / 2)
        left += w
    return max(limit, LABEL_MIN), centres, left


class TreeGeometry(NamedTuple):
    """Where the nodes go: each slot's (x in pixels, y in leaves) and depth, the characters a
    label may show, each depth column's centre and the columns' total width (pixels)."""

    pos: list[tuple[float, float]]
    depth: list[int]
    limit: int
    centres: list[float]
    span: float
    n_leaves: int


def _node_label(texts: Mapping[int, str], token: int | None) -> str:
    """A node's whole label, before any cut."""
    return visible(texts.get(token, "?")) if token is not None else "root"


def _tree_geometry(data: TreeData, texts: Mapping[int, str], width: int | None) -> TreeGeometry:
    """Lay the tree out; each depth's column as wide as its longest label (whole tokens where
    the width allows)."""
    pos = tree_layout(data.parents)
    depth_of = [int(d) for d, _ in pos]
    lengths = [0] * (max(depth_of) + 1)
    for r in data.nodes:
        lengths[depth_of[r.slot]] = max(lengths[depth_of[r.slot]], len(_node_label(texts, r.token)))
    limit, centres, span = column_layout(lengths, width or DEFAULT_WIDTH_PX)
    pos = [(centres[d], y) for d, (_, y) in zip(depth_of, pos, strict=True)]
    n_leaves = int(max(y for _, y in pos)) + 1  # leaves sit at y = 0, 1, …; parents in between
    return TreeGeometry(pos, depth_of, limit, centres, span, n_leaves)


def _tree_height(data: TreeData, n_leaves: int, width: int | None) -> tuple[int, int]:
    """The figure's height and the labels' font size."""
    height = min(MAX_HEIGHT, max(MIN_HEIGHT, PX_PER_LEAF * n_leaves + MARGINS_PX))
    if (width or DEFAULT_WIDTH_PX) < 500:  # a phone: the legend takes a row per entry, and the
        # subtitle wraps onto more lines; without room for them the tree was squashed to 90 px
        legend = len({r.status for r in data.nodes}) + bool(data.copied)
        height += 20 * legend + 40
    font = 10 if (height - MARGINS_PX) / n_leaves >= 20 else 8  # a huge tree hit the height cap
    return height, font


def _edge_traces(fig: go.Figure, data: TreeData, pos: Sequence[tuple[float, float]]) -> None:
    """The tree's edges, then the accepted path over them."""
    ex: list[float | None] = []
    ey: list[float | None] = []
    for child, parent in enumerate(data.parents):
        ex += [pos[parent + 1][0], pos[child + 1][0], None]
        ey += [pos[parent + 1][1], pos[child + 1][1], None]
    fig.add_trace(
        go.Scatter(
            x=ex,
            y=ey,
            mode="lines",
            line=dict(width=1, color=EDGE_COLOUR),
            hoverinfo="skip",
            showlegend=False,
            name="edges",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[pos[s][0] for s in data.path],
            y=[pos[s][1] for s in data.path],
            mode="lines",
            line=dict(width=4, color=PATH_COLOUR),
            hoverinfo="skip",
            showlegend=False,
            name="accepted path",
        )
    )


def _node_hover(data: TreeData, r: TreeNode, texts: Mapping[int, str], depth: int) -> str:
    """Token, id, status (and what else is known of it), draft p, target p, depth."""
    text = texts.get(r.token, "?") if r.token is not None else "?"
    note = ""
    if r.status in ("accepted", "relaxed") and data.accepted.index(r.index) >= data.committed:
        note = " (not committed: the length budget or EOS came first)"
    if r.index in data.copied:
        note += " · copied from the context"
    if r.index in data.preferred:
        own = escape(repr(texts.get(data.preferred[r.index], "?")))
        note += f" · the target's own choice: {own}"
    where = "" if r.index < 0 else f" · node {r.index}" if r.index < data.n else " · target's token"
    return (
        f"{token_hover(text, r.token)}"
        f"<br>{r.status}{note}<br>draft p: {r.draft_p} · target p: {r.target_p}"
        f"<br>depth {depth}" + where
    )


def _node_box(
    data: TreeData,
    r: TreeNode,
    xy: tuple[float, float],
    text: str,
    hover: str,
    fill: str,
    font: int,
) -> dict:
    """A node's box: an annotation, which Plotly sizes to its text."""
    on_path, copied = r.slot in data.path, r.index in data.copied
    edge = COPY_COLOUR if copied else PATH_COLOUR if on_path else "#90a4ae"
    return dict(
        x=xy[0],
        y=xy[1],
        text=text,
        showarrow=False,
        bgcolor=fill,
        bordercolor=edge,
        borderwidth=3 if copied else 2 if on_path else 1,
        borderpad=3,
        font=dict(size=font, family="ui-monospace, SFMono-Regular, Menlo, monospace"),
        hovertext=hover,
        name=f"node {r.index}",
    )


def _node_traces(
    fig: go.Figure, data: TreeData, geo: TreeGeometry, texts: Mapping[int, str], font: int
) -> None:
    """One trace per status (legend entry, hover target and data of its nodes), and each node's
    box, set on the layout at once: Plotly re-validates every annotation the figure holds on each
    add_annotation, so adding them one by one costs the square of their number (a 200-node tree
    took 10 s to draw)."""
    boxes: list[dict] = []
    for st, (colour_key, label) in STATUS_STYLE.items():
        rows = [r for r in data.nodes if r.status == st]
        if not rows:
            continue
        hover = [_node_hover(data, r, texts, geo.depth[r.slot]) for r in rows]
        labels = [
            short_token(texts.get(r.token, "?"), geo.limit) if r.token is not None else "root"
            for r in rows
        ]
        fig.add_trace(
            go.Scatter(
                x=[geo.pos[r.slot][0] for r in rows],
                y=[geo.pos[r.slot][1] for r in rows],
                mode="markers",
                marker=dict(symbol="square", size=12, color=COLOURS[colour_key]),
                text=labels,
                customdata=[r.index for r in rows],  # node index: -1 root, n the target's token
                hovertext=hover,
                hoverinfo="text",
                name=label,
            )
        )
        for r, text, h in zip(rows, labels, hover, strict=True):
            boxes.append(_node_box(data, r, geo.pos[r.slot], text, h, COLOURS[colour_key], font))
    fig.update_layout(annotations=[*fig.layout.annotations, *boxes])


def _tree_titles(data: TreeData) -> tuple[str, str]:
    """The title names the drafter (wrapped by the frame on a phone, never cut); anything grafted
    on and the verdict go in the subtitle. Where a long match won outright, the title says the
    copy is the whole tree and the subtitle opens with the match and the threshold it reached."""
    first, *rest = data.source.split(" + ")
    if data.override:
        title = f"Step {data.step}: the copied chain is the whole tree (the drafter skipped)"
        rest = [data.override]
    else:
        title = f"Step {data.step}: token tree from {first}"
    n = data.n
    verdict = f"{n} node{'s' if n != 1 else ''}, accepted {len(data.accepted)}" + (
        f", +1 {data.nodes[-1].status}" if data.extra else ""
    )
    if data.drawn < n:
        verdict += f"; {data.drawn} drawn (the first ones and the accepted path)"
    if data.won:
        verdict += f"; {data.won}"
    source = " + ".join(rest)
    return title, wrap(f"{source}; {verdict}" if source else verdict, SUBTITLE_CHARS)


def token_tree(
    events: Sequence[Event],
    texts: Mapping[int, str],
    step: int,
    width: int | None = None,
) -> go.Figure:
    """The draft tree at `step`, laid out by depth, nodes coloured by what verification made of
    them, the accepted path bold. Hover: token, id, status, draft p, target p, depth. `width`:
    the figure's width in the page, in pixels; each depth's column is as wide as its labels, and
    labels are cut only when the columns would not fit (a phone's width when not given)."""
    data = tree_data(events, step)
    if isinstance(data, str):
        return _empty(f"Token tree at step {step}", data)
    geo = _tree_geometry(data, texts, width)
    height, font = _tree_height(data, geo.n_leaves, width)
    fig = go.Figure()
    _edge_traces(fig, data, geo.pos)
    _node_traces(fig, data, geo, texts, font)
    if data.copied:  # the outline's legend entry
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                # an open symbol is drawn in the marker's colour, not its line's
                marker=dict(symbol="square-open", size=12, color=COPY_COLOUR, line=dict(width=3)),
                name="copied from the context (outline)",
            )
        )
    fig.update_xaxes(
        title_text="depth",
        tickvals=geo.centres,
        ticktext=[str(d) for d in range(len(geo.centres))],
        range=[0, geo.span],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(visible=False, range=[geo.n_leaves - 0.5, -0.5])  # first leaf on top
    title, subtitle = _tree_titles(data)
    fig = _base_layout(fig, title, height=height, subtitle=subtitle)
    return fig.update_layout(margin=dict(l=PLOT_MARGINS_PX - 20))  # no y axis: room for columns
