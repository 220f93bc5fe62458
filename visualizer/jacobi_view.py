"""Jacobi decoding's trajectory: the guessed block, iteration by iteration: which guesses the
last forward changed, which stood still, which converged (accepted), and where each row's fixed
point ends. `jacobi_grid` computes the cells (plain data), `jacobi_trajectory` draws them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import plotly.graph_objects as go

from decoders.core.events import (
    Commit,
    Event,
    JacobiIteration,
    Verify,
)

from .cells import (
    BOUNDARY_COLOUR,
    JACOBI_STATUS,
    MAX_ITERATIONS,
    MAX_POSITIONS,
    _codes,
    _heatmap,
    _swatch,
    _tok,
)
from .figures import _base_layout, _empty
from .text import cut, escape, short_token, visible

# --- Jacobi ---------------------------------------------------------------------------------------


def _committed_by_position(events: Sequence[Event], step: int) -> list[tuple[int, int]]:
    """The output so far as (token, step that committed it), position 0 = the first new token."""
    out: list[tuple[int, int]] = []
    for e in events:
        if isinstance(e, Commit) and e.step <= step:
            out += [(t, e.step) for t in e.tokens]
    return out


def _frame_column(
    fig: go.Figure,
    x: int,
    top_row: int,
    colour: str = BOUNDARY_COLOUR,
    width: int = 3,
    inset: float = 0.5,
) -> None:
    """Frame heatmap column `x` over rows 0..`top_row` (green: its n-gram entered the pool)."""
    fig.add_shape(
        type="rect",
        x0=x - inset,
        x1=x + inset,
        y0=-inset,
        y1=top_row + inset,
        line=dict(color=colour, width=width),
        fillcolor="rgba(0,0,0,0)",
    )


PHONE_PLOT_PX = 300  # a 390 px screen's plot area: cell labels must fit there too


CELL_PX = 44  # a cell that shows a 6-character token
MARGINS_PX = 110  # the figure's y tick labels ("15 (+2)") and side margins


def _cell_label(text: str, columns: int, plot_px: int = PHONE_PLOT_PX) -> str:
    """A token inside a heatmap cell, as many characters as a cell of a `plot_px` wide plot holds
    (about 6 px each, none when too narrow; the hover has the whole token), with an ellipsis
    only where a cell has room for one."""
    limit = min(6, plot_px // max(columns, 1) // 6)
    if limit < 4:
        return escape(cut(visible(text), limit, tail=""))
    return short_token(text, limit - 1)  # the ellipsis takes the last place


@dataclass(frozen=True)
class JacobiGrid:
    """What the Jacobi trajectory shows up to one step: a row per iteration (the last ones), a
    column per output position from `lo` to `hi` - 1, each cell a status code (JACOBI_STATUS,
    None: no cell), its label and hover."""

    step: int
    z: list[list[int | None]]
    text: list[list[str]]
    hover: list[list[str]]
    rows: list[float]  # each row's iteration
    ticks: list[str]  # each row's label: the iteration (+ tokens it committed)
    boundary_x: list[float | None]  # the end of each row's converged guesses, as line segments
    boundary_y: list[float | None]
    lo: int
    hi: int
    iterations: int  # iterations up to the step (the rows are the last of them)
    skipped: int  # the older iterations not drawn
    last: JacobiIteration  # the newest iteration drawn
    last_accepted: int  # of its guesses, how many converged
    fixed: int  # tokens committed up to the step


class _Trace(NamedTuple):
    """The events a Jacobi row reads, by step, and the output so far."""

    verifies: dict[int, Verify]
    commits: dict[int, Commit]
    output: list[tuple[int, int]]

    def start_of(self, it: JacobiIteration) -> int:
        """The output position of the block's first guess."""
        if it.start >= 0:
            return it.start
        # Older traces: the block starts after everything committed before its step.
        return sum(len(c.tokens) for s, c in self.commits.items() if s < it.step)

    def n_accepted(self, it: JacobiIteration) -> int:
        """Of the block's guesses, how many the target accepted."""
        v = self.verifies.get(it.step)
        return len(v.accepted) if v is not None and it.tokens else 0


def _positions(
    trace: _Trace, shown: Sequence[JacobiIteration], width: int | None
) -> tuple[int, int, int]:
    """The output positions drawn, lo to hi - 1, and the plot's width in pixels: the last ones
    whose cells hold a 6-character token when the page says its width (at least the latest block
    and the token before it)."""
    hi = max(
        max(trace.start_of(it) + len(it.tokens) for it in shown), trace.start_of(shown[-1]) + 1
    )
    lo = 0 if hi <= 40 else max(0, trace.start_of(shown[0]) - 1)
    lo = max(lo, hi - MAX_POSITIONS)
    plot_px = PHONE_PLOT_PX
    if width:
        plot_px = max(int(width) - MARGINS_PX, 100)
        block = max(len(it.tokens) for it in shown)
        lo = max(lo, hi - max(plot_px // CELL_PX, block + 1))
    return lo, hi, plot_px


def _guess_status(trace: _Trace, it: JacobiIteration, i: int, a: int) -> str:
    """Guess `i` of the block: converged, the first wrong one, changed or unchanged."""
    changed = it.changed[i] if i < len(it.changed) else True
    if i < a:
        return "converged"
    if i == a and it.step in trace.verifies:
        return "wrong"
    return "changed" if changed else "unchanged"


def _committed(trace: _Trace, it: JacobiIteration) -> int:
    """Tokens the step of iteration `it` committed."""
    commit = trace.commits.get(it.step)
    return len(commit.tokens) if commit is not None else 0


def _cell(
    trace: _Trace, it: JacobiIteration, pos: int, texts: Mapping[int, str]
) -> tuple[int, str, str] | None:
    """Output position `pos` in iteration `it`'s row: (token, status, note), None if empty."""
    c, a = trace.start_of(it), trace.n_accepted(it)
    i = pos - c
    if pos < c and pos < len(trace.output):
        t, when = trace.output[pos]
        return t, "fixed", f"committed at step {when}: part of the fixed point"
    if not 0 <= i < len(it.tokens):
        return None
    status = _guess_status(trace, it, i, a)
    commit, committed = trace.commits.get(it.step), _committed(trace, it)
    note = {
        "converged": "guess accepted by the target this iteration",
        "wrong": "first wrong guess: the target's own token "
        + (f"{_tok(texts, commit.tokens[a])} " if commit and a < committed else "")
        + "is committed here instead",
        "changed": "changed by the previous forward, not yet fixed",
        "unchanged": "the same guess as the previous iteration, not yet fixed",
    }[status]
    return it.tokens[i], status, note


def _row(
    trace: _Trace, it: JacobiIteration, positions: range, plot_px: int, texts: Mapping[int, str]
) -> tuple[list[int | None], list[str], list[str]]:
    """Iteration `it`'s row over `positions`: status codes, cell labels, hovers."""
    code = _codes(JACOBI_STATUS)
    z: list[int | None] = []
    text: list[str] = []
    hover: list[str] = []
    for pos in positions:
        cell = _cell(trace, it, pos, texts)
        if cell is None:
            z.append(None)
            text.append("")
            hover.append("")
            continue
        t, status, note = cell
        z.append(code[status])
        text.append(_cell_label(texts.get(t, "?"), len(positions), plot_px))
        hover.append(
            f"{_tok(texts, t)}<br>output position {pos} · iteration {it.iteration}<br>{note}"
        )
    return z, text, hover


def jacobi_grid(
    events: Sequence[Event], texts: Mapping[int, str], step: int, width: int | None = None
) -> JacobiGrid | None:
    """The Jacobi trajectory up to `step` as cells (see `jacobi_trajectory`); None before the
    first iteration."""
    its = [e for e in events if isinstance(e, JacobiIteration) and e.step <= step]
    if not its:
        return None
    trace = _Trace(
        {e.step: e for e in events if isinstance(e, Verify)},
        {e.step: e for e in events if isinstance(e, Commit)},
        _committed_by_position(events, step),
    )
    first = max(0, len(its) - MAX_ITERATIONS)
    shown = its[first:]
    lo, hi, plot_px = _positions(trace, shown, width)
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    bx: list[float | None] = []
    by: list[float | None] = []
    for it in shown:
        zr, tr, hr = _row(trace, it, range(lo, hi), plot_px, texts)
        z.append(zr)
        text.append(tr)
        hover.append(hr)
        c, a, y = trace.start_of(it), trace.n_accepted(it), float(it.iteration)
        if it.step in trace.verifies and it.tokens and lo <= c + a <= hi:
            bx += [c + a - 0.5, c + a - 0.5, None]
            by += [y - 0.5, y + 0.5, None]
    return JacobiGrid(
        step=step,
        z=z,
        text=text,
        hover=hover,
        rows=[float(it.iteration) for it in shown],
        ticks=[f"{it.iteration} (+{_committed(trace, it)})" for it in shown],
        boundary_x=bx,
        boundary_y=by,
        lo=lo,
        hi=hi,
        iterations=len(its),
        skipped=first,
        last=shown[-1],
        last_accepted=trace.n_accepted(shown[-1]),
        fixed=len(trace.output),
    )


def _jacobi_axes(fig: go.Figure, grid: JacobiGrid) -> None:
    """Positions along x; iterations down y, each with the tokens it fixed."""
    columns = grid.hi - grid.lo
    fig.update_xaxes(
        title_text="output position (0 = first new token)",
        dtick=1 if columns <= 12 else 2 if columns <= 30 else 5,
        range=[grid.lo - 0.5, grid.hi - 0.5],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        title_text="iteration (+fixed)",
        tickvals=grid.rows,
        ticktext=grid.ticks,
        autorange="reversed",  # the newest iteration at the bottom, like reading down a log
        showgrid=False,
        zeroline=False,
        automargin=True,
    )


def _jacobi_subtitle(grid: JacobiGrid) -> str:
    """The newest iteration's verdict, and which iterations and positions are drawn."""
    last, a = grid.last, grid.last_accepted
    guessed = (
        f"{a} of {len(last.tokens)} guesses converged"
        if last.tokens
        else "no guesses (room for one token only)"
    )
    return (
        f"iteration {last.iteration}: {guessed}, {grid.fixed} tokens fixed"
        + (f"; the last {len(grid.rows)} of {grid.iterations} iterations" if grid.skipped else "")
        + (f"; positions {grid.lo} to {grid.hi - 1}" if grid.lo > 0 else "")
    )


def jacobi_trajectory(
    events: Sequence[Event], texts: Mapping[int, str], step: int, width: int | None = None
) -> go.Figure:
    """The Jacobi trajectory as the CLLM and Lookahead papers draw it: one row per iteration (the
    last 16 up to `step`), one column per ABSOLUTE output position. Each row is the sequence the
    forward saw: the tokens committed before it (grey: the fixed point so far), then the block of
    guesses: green where the target accepted them (converged), red for the first wrong guess (the
    target's own token is committed there instead), orange where the previous forward changed the
    guess, white where it stood still. Read down the rows, the fixed-point prefix grows.
    `width`: the figure's width in the page; the view then shows the last positions whose cells
    hold a 6-character token (at least the latest block and the token before it), so tokens read
    whole on a desktop and a phone shows the block, not 40 one-letter columns."""
    title = f"Step {step}: Jacobi trajectory"
    grid = jacobi_grid(events, texts, step, width)
    if grid is None:
        return _empty(
            title, "no Jacobi iteration yet: step 0 is the prefill, each later step one iteration"
        )
    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            grid.z,
            JACOBI_STATUS,
            x=range(grid.lo, grid.hi),
            y=grid.rows,
            text=grid.text,
            hover=grid.hover,
            name="trajectory",
            font_size=11 if grid.hi - grid.lo <= 16 else 9,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=grid.boundary_x,
            y=grid.boundary_y,
            mode="lines",
            line=dict(width=4, color=BOUNDARY_COLOUR),
            name="end of the converged guesses",
            hoverinfo="skip",
        )
    )
    code = _codes(JACOBI_STATUS)
    used = {s for row in grid.z for s in row if s is not None}
    for status, (colour, label) in JACOBI_STATUS.items():
        if code[status] in used:
            fig.add_trace(_swatch(colour, label))
    _jacobi_axes(fig, grid)
    legend = len(used) + 1
    # at least six rows' height: the y axis' title is longer than two or three rows are tall,
    # and ran up into the subtitle
    height = max(260, 120 + 30 * max(len(grid.rows), 6) + 16 * legend)
    return _base_layout(fig, title, height=height, subtitle=_jacobi_subtitle(grid))
