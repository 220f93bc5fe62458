"""The Medusa heads' guesses at one step (medusa, blockwise). Pure: events in, Figure out.

`heads_grid`: one row per head, one column per rank, each cell a head's candidate token. Head i
guesses the token i places after the root (the last committed token), so row i holds the tree's
nodes at depth i: cells the tree used are coloured by what verification made of them (accepted
green, compared and lost red, never checked grey), cells it left out stay white. A bar along each
cell's foot is the head's probability; an outline marks the target's own token after the
accepted path where a head had it among its candidates. `heads_data` holds what it shows (plain
data).

`blockwise_chain`: the chain blockwise decoding verified: x, then each head's top token, coloured
by the verdict, with the head's probability; the target's committed tokens underneath.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from decoders.core.events import Commit, Draft, Event, HeadProposals, Verify

from .figures import _base_layout, _empty, _token_row, legend_square, rank_axis
from .text import cut, escape, short_token, token_hover, visible
from .tokens import COLOURS, LABELS
from .tree_view import _root_token

# Cell status -> (fill, legend label), in legend order.
CELL_STYLE: dict[str, tuple[str, str]] = {
    "accepted": (COLOURS["draft"], "in the draft, accepted"),
    "rejected": (COLOURS["rejected"], "in the draft, rejected"),
    "not checked": (COLOURS["pending"], "in the draft, not checked"),
    "unused": ("#ffffff", "not in the draft"),
}
BAR_COLOUR = "#546e7a"
CELL_EDGE = "#90a4ae"
MAX_ROWS, MAX_COLUMNS = 16, 16  # drawn at most (a crafted trace cannot make the grid unbounded)
NARROWEST_PX = 320  # plot width on a 390 px phone: labels are cut to fit their column there
ROW_PX = 46
MARGINS_PX = 150


def cell_chars(columns: int, plot_px: int = NARROWEST_PX) -> int:
    """Characters a cell label may show when `columns` share a `plot_px` wide plot (the
    narrowest, a phone's, unless the page says its width; 10 px text)."""
    return max(2, min(10, int((plot_px / max(columns, 1) - 10) / 6.5)))


def _step_events(
    events: Sequence[Event], step: int, guesses: type[HeadProposals] = HeadProposals
) -> tuple[HeadProposals | None, Draft | None, Verify | None, Commit | None]:
    found: dict[type, Event] = {}
    for e in events:
        if isinstance(e, HeadProposals | Draft | Verify | Commit) and e.step == step:
            found.setdefault(type(e), e)
    return (
        found.get(guesses),  # type: ignore[return-value]
        found.get(Draft),
        found.get(Verify),
        found.get(Commit),
    )


def cell_status(
    heads: Sequence[Sequence[int]], draft: Draft | None, verify: Verify | None
) -> dict[tuple[int, int], str]:
    """(head row, rank) -> status, for the cells the draft's nodes use. A node at depth d is one of
    head d + 1's candidates (a chain: each head's top one); a cell several nodes share takes the
    best status among them (accepted, then rejected, then not checked)."""
    if draft is None or len(draft.parents) != len(draft.tokens):
        return {}
    accepted = set(verify.accepted) if verify is not None else set()
    order = ("not checked", "rejected", "accepted")
    out: dict[tuple[int, int], str] = {}
    depth: list[int] = []
    for i, (token, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        if not -1 <= parent < i:
            return {}  # malformed: parents come first
        d = 0 if parent == -1 else depth[parent] + 1
        depth.append(d)
        if d >= len(heads) or token not in heads[d]:
            continue
        if i in accepted:
            status = "accepted"
        elif verify is not None and (parent == -1 or parent in accepted):
            status = "rejected"  # compared with the target's choice and lost
        else:
            status = "not checked"
        key = (d, list(heads[d]).index(token))
        if key not in out or order.index(status) > order.index(out[key]):
            out[key] = status
    return out


@dataclass(frozen=True)
class HeadsData:
    """What the heads grid shows at one step: each head's candidates (rows = heads, columns =
    ranks, bounded), their probabilities, what the tree made of them and where the target's own
    token after the accepted path stood among them."""

    step: int
    heads: list[list[int]]
    probs: list[list[float]]
    status: dict[tuple[int, int], str]  # (row, rank) -> CELL_STYLE key, for the cells in the tree
    accepted: int
    target: tuple[int, int, str] | None  # (row, rank, origin) of the target's token, if guessed

    @property
    def cells(self) -> list[tuple[int, int]]:
        """Every cell's (row, rank), row by row."""
        return [(r, k) for r, row in enumerate(self.heads) for k in range(len(row))]


def heads_data(
    proposals: HeadProposals, draft: Draft | None, verify: Verify | None, commit: Commit | None
) -> HeadsData | None:
    """The heads grid's data from one step's events (see `heads_grid`); None when the guesses'
    tokens and probabilities differ in shape."""
    heads = [list(row[:MAX_COLUMNS]) for row in proposals.heads[:MAX_ROWS]]
    probs = [list(row[:MAX_COLUMNS]) for row in proposals.probs[:MAX_ROWS]]
    if (
        not heads
        or len(probs) != len(heads)
        or any(len(p) != len(h) for p, h in zip(probs, heads, strict=False))
    ):
        return None
    n_acc = len(verify.accepted) if verify is not None else 0
    # The target's own token after the accepted path: which head guessed that position, at what rank.
    target: tuple[int, int, str] | None = None
    if commit is not None and verify is not None and len(commit.tokens) > n_acc:
        token, origin = commit.tokens[n_acc], commit.origins[n_acc]
        if n_acc < len(heads) and token in heads[n_acc]:
            target = (n_acc, heads[n_acc].index(token), origin)
    return HeadsData(
        step=proposals.step,
        heads=heads,
        probs=probs,
        status=cell_status(heads, draft, verify),
        accepted=n_acc,
        target=target,
    )


def _no_guesses(events: Sequence[Event], step: int) -> str:
    """Why there are no head guesses at `step`."""
    if step == 0:
        return "step 0 is the prefill: it gives the heads their first features"
    if any(isinstance(e, HeadProposals) for e in events):
        return f"no guesses at step {step}: a plain target step"
    return "this trace has no head detail (recorded without it)"


def _hover_targets(
    fig: go.Figure, data: HeadsData, texts: Mapping[int, str], row: str = "head"
) -> None:
    """Hover targets at the cells' centres (invisible: the cells are shapes, sized with the plot)."""
    cells, status, target = data.cells, data.status, data.target
    hover = []
    for r, k in cells:
        t, st = data.heads[r][k], status.get((r, k), "unused")
        note = ""
        if target is not None and (r, k) == target[:2]:
            note = f"<br>the target's token here ({LABELS.get(target[2], target[2])})"
        hover.append(
            f"{token_hover(texts.get(t, '?'), t)}<br>{row} {r + 1}, rank {k + 1}: "
            f"p = {data.probs[r][k]:.3f}<br>{CELL_STYLE[st][1]}{note}"
        )
    fig.add_trace(
        go.Scatter(
            x=[k + 1 for _, k in cells],
            y=[r + 1 for r, _ in cells],
            mode="markers",
            marker=dict(symbol="square", size=24, opacity=0),
            customdata=[[r, k, status.get((r, k), "unused")] for r, k in cells],
            hovertext=hover,
            hoverinfo="text",
            name="cells",
            showlegend=False,
        )
    )


def _cell_shapes(data: HeadsData, r: int, k: int) -> list[dict]:
    """Cell (r, k)'s box, and a bar along its foot for the head's probability."""
    x, y = k + 1, r + 1
    shapes = [
        dict(
            type="rect",
            x0=x - 0.46,
            x1=x + 0.46,
            y0=y - 0.42,
            y1=y + 0.42,
            fillcolor=CELL_STYLE[data.status.get((r, k), "unused")][0],
            # Left out of the tree: a dotted edge (white and the pending grey are close).
            line=dict(
                width=1, color=CELL_EDGE, dash="dot" if (r, k) not in data.status else "solid"
            ),
            layer="below",
        )
    ]
    p = min(max(data.probs[r][k], 0.0), 1.0)
    if p > 0:
        shapes.append(
            dict(
                type="rect",
                x0=x - 0.46,
                x1=x - 0.46 + 0.92 * p,
                y0=y + 0.3,
                y1=y + 0.42,
                fillcolor=BAR_COLOUR,
                line=dict(width=0),
                layer="below",
            )
        )
    return shapes


def _target_outline(fig: go.Figure, target: tuple[int, int, str]) -> dict:
    """The outline around the target's own token (returned: a shape), and its legend entry."""
    r, k, origin = target
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            marker=dict(symbol="square-open", size=12, color=_outline(origin)),
            name=f"the target's token ({LABELS.get(origin, origin)})",
            hoverinfo="skip",
        )
    )
    return dict(
        type="rect",
        x0=k + 1 - 0.5,
        x1=k + 1 + 0.5,
        y0=r + 1 - 0.48,
        y1=r + 1 + 0.48,
        line=dict(width=3, color=_outline(origin)),
        fillcolor="rgba(0,0,0,0)",
        name="target's token",
    )


def _draw_cells(fig: go.Figure, data: HeadsData, texts: Mapping[int, str], limit: int) -> None:
    """Cells, bars and labels as plain dicts set once (adding hundreds one by one is quadratic)."""
    shapes: list[dict] = []
    labels: list[dict] = []
    for r, k in data.cells:
        shapes += _cell_shapes(data, r, k)
        labels.append(
            dict(
                x=k + 1,
                y=r + 1 - 0.06,
                text=short_token(texts.get(data.heads[r][k], "?"), limit),
                showarrow=False,
                font=dict(size=10, family="ui-monospace, SFMono-Regular, Menlo, monospace"),
                name=f"cell {r} {k}",
            )
        )
    if data.target is not None:
        shapes.append(_target_outline(fig, data.target))
    fig.update_layout(shapes=shapes, annotations=labels)


def heads_grid(
    events: Sequence[Event], texts: Mapping[int, str], step: int, width: int | None = None
) -> go.Figure:
    """Each head's top candidates at `step` (rows = heads, columns = ranks), coloured by what the
    tree made of them, with the head's probability as a bar. `width`: the figure's width in the
    page; labels hold as many characters as a column of it does (a phone's when not given)."""
    title = f"Step {step}: the heads' guesses"
    proposals, draft, verify, commit = _step_events(events, step)
    if proposals is None:
        return _empty(title, _no_guesses(events, step), 220)
    data = heads_data(proposals, draft, verify, commit)
    if data is None:
        return _empty(title, "malformed head guesses: tokens and probabilities differ in shape")
    fig = guesses_grid(data, texts, width, "head")
    after = _root_label(events, texts, step, "the root")
    subtitle = (
        f"row i: head i's guesses for the token i after {after}; "
        f"{len(data.status)} of {sum(map(len, data.heads))} cells in the tree, {data.accepted} "
        "accepted; bar: the head's probability"
    )
    height = min(900, MARGINS_PX + ROW_PX * len(data.heads))
    return _base_layout(fig, title, height=height, subtitle=subtitle)


def guesses_grid(
    data: HeadsData, texts: Mapping[int, str], width: int | None, row: str
) -> go.Figure:
    """The grid of `data` (rows named `row` 1, 2, ..), without title and layout: the Medusa heads'
    or the block drafter's positions (block_view.py)."""
    heads = data.heads
    columns = max(len(h) for h in heads)
    limit = cell_chars(columns, max(int(width) - 70, NARROWEST_PX) if width else NARROWEST_PX)
    fig = go.Figure()
    _hover_targets(fig, data, texts, row)
    for name, (fill, label) in CELL_STYLE.items():  # legend entries, for the statuses present
        if any(data.status.get(c, "unused") == name for c in data.cells):
            legend_square(fig, fill, label, CELL_EDGE)
    _draw_cells(fig, data, texts, limit)
    rank_axis(fig, columns, "rank")
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(1, len(heads) + 1)),
        ticktext=[f"{row} {r + 1}" for r in range(len(heads))],
        range=[len(heads) + 0.5, 0.5],  # row 1 on top
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )
    return fig


def _outline(origin: str) -> str:
    """A darker shade of the origin's colour: the correction orange, the bonus blue."""
    return {"correction": "#ef6c00", "bonus": "#1565c0"}.get(origin, "#37474f")


def blockwise_chain(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Blockwise's method panel: x, each head's top token (accepted green, first rejected red,
    never checked grey) with its probability, and the target's committed tokens underneath."""
    title = f"Step {step}: the heads' block"
    _, draft, verify, commit = _step_events(events, step)
    if draft is None or commit is None:
        if step == 0:
            return _empty(
                title, "step 0 is the prefill: it gives the heads their first features", 220
            )
        return _empty(title, f"no block at step {step}: a plain target step", 220)
    n = len(draft.tokens)
    n_acc = len(verify.accepted) if verify is not None else 0
    status = [
        "accepted" if i < n_acc else "rejected" if i == n_acc else "not checked" for i in range(n)
    ]
    colour = {"accepted": COLOURS["draft"], "rejected": COLOURS["rejected"]}
    target_p = verify.target_probs if verify is not None else ()
    hover = [
        f"{token_hover(texts.get(t, '?'), t)}<br>head {i + 1}'s top token: p = {_p(draft.probs, i)}"
        f"<br>target p = {_p(target_p, i)} · {s}"
        for i, (t, s) in enumerate(zip(draft.tokens, status, strict=True))
    ]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(  # the heads' probabilities, above their tokens
            x=list(range(1, n + 1)),
            y=["head p"] * n,
            mode="text",
            text=[_p(draft.probs, i, 2) for i in range(n)],
            textfont=dict(size=10, color="#546e7a"),
            hoverinfo="skip",
            name="head p",
        )
    )
    fig.add_trace(
        _token_row(
            draft.tokens, "heads", [colour.get(s, COLOURS["pending"]) for s in status], texts, hover
        )
    )
    fig.add_trace(
        _token_row(
            commit.tokens,
            "target",
            [COLOURS.get(o, COLOURS["target"]) for o in commit.origins],
            texts,
            [
                f"{token_hover(texts.get(t, '?'), t)} · {LABELS.get(o, o)} · p = {p:.3f}"
                for t, o, p in zip(commit.tokens, commit.origins, commit.probs, strict=False)
            ],
        )
    )
    width = max(n, len(commit.tokens), 3)
    fig.update_xaxes(
        title_text="head (the token that many after x)",
        tickmode="array",
        tickvals=list(range(1, width + 1)),
        range=[0.3, width + 0.7],
    )
    fig.update_yaxes(
        title_text="", categoryorder="array", categoryarray=["target", "heads", "head p"]
    )
    fig.update_layout(showlegend=False)
    after = _root_label(events, texts, step, "x")
    kept = f"accepted {n_acc} of {n}" + (
        f", +1 {commit.origins[-1]}" if len(commit.tokens) > n_acc else ""
    )
    subtitle = f"x = {after}; each head's top token; {kept}"
    return _base_layout(fig, title, height=250, subtitle=subtitle)


def _root_label(events: Sequence[Event], texts: Mapping[int, str], step: int, default: str) -> str:
    """The root token quoted, cut, escaped, its spaces unbreakable (a subtitle wraps at spaces)."""
    root, _ = _root_token(events, step)
    if root is None:
        return default
    return escape(cut(repr(visible(texts.get(root, "?"))), 14).replace(" ", "\u00a0"))


def _p(probs: Sequence[float], i: int, digits: int = 3) -> str:
    return f"{probs[i]:.{digits}f}" if 0 <= i < len(probs) else "—"
