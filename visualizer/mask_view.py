"""The real attention pattern among one forward's new inputs, by branch (Lookahead's window and
verification branch, SPACE's mask groups, Mask-Predict's masks and kept fills). `mask_grid`
computes the cells (plain data), `attention_mask` draws them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from decoders.core.events import (
    AttentionMask,
    Draft,
    Event,
    LookaheadWindow,
)

from .cells import (
    INPUT_BRANCHES,
    MASK_BRANCH,
    MASK_NOTE,
    SEPARATOR_COLOUR,
    _at,
    _codes,
    _heatmap,
    _swatch,
    _tok,
)
from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .text import escape, short_token, wrap
from .tree_view import _root_token

# --- Lookahead: the attention mask ----------------------------------------------------------------

_LOOK = re.compile(r"^look L(\d+)")


def _branch(label: str) -> str:
    """Older traces name the branch only in the label."""
    if label == "x" or label.startswith("x "):
        return "x"
    if label.startswith("look"):
        return "lookahead"
    if label.startswith("verify"):
        return "verify"
    return "other"


def _input_tokens(events: Sequence[Event], step: int, n: int) -> list[int | None]:
    """Older traces without the inputs' ids: rebuild them as lookahead.py laid them out then,
    [x, *window level by level, *trie]; all None if that does not add up to the mask's size."""
    x_id, _ = _root_token(events, step)
    window = _at(events, LookaheadWindow, step)
    draft = _at(events, Draft, step)
    ids: list[int | None] = [x_id]
    if window is not None:
        ids += [t for level in window.levels for t in level]
    if draft is not None:
        ids += list(draft.tokens)
    return ids if len(ids) == n else [None] * n


@dataclass(frozen=True)
class MaskGrid:
    """What the attention-mask view shows at one step: the forward's new inputs (their labels,
    tokens and branches), the mask as branch codes (MASK_BRANCH; "masked" where a query does not
    see a key) with a hover per cell, and where lines part the branches and the window's levels."""

    step: int
    labels: list[str]
    ids: list[int | None]  # each input's token (None: none known, or a mask input)
    branches: list[str]  # each input's MASK_BRANCH key
    names: list[str]  # each input's axis label
    z: list[list[int]]  # row = query, column = key
    hover: list[list[str]]
    separators: list[tuple[int, str]]  # (input, "branch" or "level"): a line before that input


def _separators(labels: Sequence[str], branches: Sequence[str]) -> list[tuple[int, str]]:
    """Where a new branch starts, or a new level of Lookahead's window."""
    out: list[tuple[int, str]] = []
    for b in range(1, len(labels)):
        level_a, level_b = _LOOK.match(labels[b - 1]), _LOOK.match(labels[b])
        if branches[b] != branches[b - 1]:
            out.append((b, "branch"))
        elif level_a and level_b and level_a.group(1) != level_b.group(1):
            out.append((b, "level"))
    return out


def mask_grid(events: Sequence[Event], texts: Mapping[int, str], step: int) -> MaskGrid | None:
    """The attention mask at `step` as data (see `attention_mask`); None when not recorded."""
    ev = _at(events, AttentionMask, step)
    if ev is None or not ev.labels:
        return None
    labels = list(ev.labels)
    n = len(labels)
    # The event names each input's token and branch; older traces only label them.
    ids: list[int | None] = (
        list(ev.input_ids) if len(ev.input_ids) == n else _input_tokens(events, step, n)
    )
    branches = (
        [b if b in MASK_BRANCH and b != "masked" else "other" for b in ev.branches]
        if len(ev.branches) == n
        else [_branch(lb) for lb in labels]
    )
    # A mask input has no token of its own (SPACE feeds a learned embedding): name none.
    ids = [None if b == "mask" else t for t, b in zip(ids, branches, strict=True)]
    code = _codes(MASK_BRANCH)
    z: list[list[int]] = []
    hover: list[list[str]] = []
    for r in range(n):
        seen = {c for c in (ev.visible[r] if r < len(ev.visible) else ()) if 0 <= c < n}
        z.append([code[branches[r]] if c in seen else code["masked"] for c in range(n)])
        q = f"query {r}: {escape(labels[r])} {_tok(texts, ids[r])}"
        hover.append(
            [
                f"{q}<br>key {c}: {escape(labels[c])} {_tok(texts, ids[c])}"
                f"<br>{'visible' if c in seen else 'masked'}"
                for c in range(n)
            ]
        )
    names = [
        escape(lb) + (f" {short_token(texts.get(t, '?'), 6)}" if t is not None and n <= 64 else "")
        for lb, t in zip(labels, ids, strict=True)
    ]
    return MaskGrid(step, labels, ids, branches, names, z, hover, _separators(labels, branches))


def _separator_shapes(grid: MaskGrid) -> list[dict]:
    """Thick lines between branches, thin dashed ones between the window's levels."""
    n = len(grid.labels)
    shapes: list[dict] = []
    for b, kind in grid.separators:
        if kind == "branch":
            line = dict(color=SEPARATOR_COLOUR, width=2)
        else:
            line = dict(color="#90a4ae", width=1, dash="dot")
        shapes.append(dict(type="line", x0=b - 0.5, x1=b - 0.5, y0=-0.5, y1=n - 0.5, line=line))
        shapes.append(dict(type="line", x0=-0.5, x1=n - 0.5, y0=b - 0.5, y1=b - 0.5, line=line))
    return shapes


def _mask_axes(fig: go.Figure, grid: MaskGrid) -> None:
    """Keys along x, queries down y, each named (or, when too many, each branch's first)."""
    n, branches = len(grid.labels), grid.branches
    if n <= 32:
        tickvals, ticktext = list(range(n)), grid.names
    else:  # too many to label: name the first input of each branch
        tickvals = [i for i in range(n) if i == 0 or branches[i] != branches[i - 1]]
        ticktext = [grid.names[i] for i in tickvals]
    size = 10 if n <= 24 else 8
    fig.update_xaxes(
        title_text="key (the input attended to)",
        tickvals=tickvals,
        ticktext=ticktext,
        tickangle=-60,
        tickfont=dict(size=size),
        range=[-0.5, n - 0.5],
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    fig.update_yaxes(
        title_text="query (input)",
        tickvals=tickvals,
        ticktext=ticktext,
        tickfont=dict(size=size),
        autorange="reversed",  # row 0 (x) at the top
        showgrid=False,
        zeroline=False,
        automargin=True,
    )


def _branch_counts(branches: Sequence[str]) -> str:
    """Inputs per branch; Lookahead's three are named even when one is empty ("0 verify": no
    candidate)."""
    window = {"x", "lookahead", "verify"} if "lookahead" in branches else set()
    return " · ".join(
        f"{branches.count(b)} {b}"
        for b in INPUT_BRANCHES
        if b in branches or (b in window and window & set(branches))
    )


def attention_mask(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The attention mask the model really got at `step`, among the forward's new inputs: row =
    query, column = key, a coloured cell = visible. Cells take the colour of the query's branch (x,
    the lookahead window, the verification trie), with lines between the branches."""
    grid = mask_grid(events, texts, step)
    if grid is None:
        note = "step 0 is the prefill" if step == 0 else "recorded only with detail events on"
        return _empty(
            f"Attention mask at step {step}", f"no attention mask at step {step} ({note})"
        )
    n, branches = len(grid.labels), grid.branches
    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            grid.z, MASK_BRANCH, x=range(n), y=range(n), text=None, hover=grid.hover, name="mask"
        )
    )
    fig.data[0].update(xgap=1 if n <= 64 else 0, ygap=1 if n <= 64 else 0)
    # Set on the layout at once: Plotly re-validates every shape the figure holds on each add_shape.
    fig.update_layout(shapes=[*fig.layout.shapes, *_separator_shapes(grid)])
    # Lookahead's layout, or a mask model's (SPACE, Mask-Predict): each names its own inputs.
    masks = "mask" in branches
    for branch in (*INPUT_BRANCHES, "masked"):
        if branch == "masked" or branch in branches:
            colour, label = MASK_BRANCH[branch]
            if masks and branch == "verify":
                label = "guess being verified (last step's mask guesses)"
            fig.add_trace(_swatch(colour, label))
    _mask_axes(fig, grid)
    title = f"Step {step}: attention among {n} inputs"
    subtitle = wrap(f"{_branch_counts(branches)}; {MASK_NOTE}", SUBTITLE_CHARS)
    return _base_layout(fig, title, height=min(900, max(360, 20 * n + 280)), subtitle=subtitle)
