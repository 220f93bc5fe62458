"""Lookahead decoding as Plotly figures. Pure: events + token texts in, Figure out.

- `lookahead_window`: Lookahead's 2D window (Jacobi levels × window positions) at one step, with
  the columns whose n-grams entered the pool.
- `ngram_pool`: the most-hit n-grams, and the candidate n-grams the verify branch checked.
- `lookahead_panel`: the step's window, as the method's main panel.

What the grids show is computed in lookahead_data (plain data); this module draws it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import AttentionMask, Event, LookaheadWindow, NgramPool

from .cells import (
    ADDED_LABEL,
    BOUNDARY_COLOUR,
    CANDIDATE_STATUS,
    SEPARATOR_COLOUR,
    WINDOW_STATUS,
    _at,
    _codes,
    _gram,
    _heatmap,
    _swatch,
)
from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .jacobi_view import _frame_column
from .lookahead_data import (
    CandidateGrid,
    WindowGrid,
    _ngram_size,
    _x_text,
    candidate_grid,
    history_grid,
    window_grid,
)
from .mask_view import attention_mask
from .text import wrap

# --- Lookahead: the window ------------------------------------------------------------------------


def lookahead_window(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Lookahead's 2D window at `step`: level 0 (the oldest Jacobi guesses) at the bottom, each
    level above it one Jacobi iteration newer, and the target's new guesses on top. Read bottom to
    top, a column is a run of consecutive positions, so column i plus its new guess is an n-gram;
    the columns whose n-gram entered the pool this step are outlined green. With W = 1 the window
    is a single column, so the figure lines up that column at the last steps instead: the Jacobi
    history of one trajectory, each token sliding down a level per step."""
    title = f"Step {step}: lookahead window"
    window = _at(events, LookaheadWindow, step)
    if window is None or not window.levels or not window.levels[0]:
        if _at(events, NgramPool, step) is not None:
            return _empty(title, "W = 0: no lookahead window, only n-gram verification")
        note = " (step 0 is the prefill)" if step == 0 else ""
        return _empty(title, f"no lookahead window at step {step}{note}")
    if len(window.levels[0]) == 1:
        return _window_history(events, texts, step)
    grid = window_grid(events, texts, step)
    assert grid is not None  # a window of two or more columns
    return _draw_window(grid)


def _draw_window(g: WindowGrid) -> go.Figure:
    """The 2D window's heatmap, the added columns framed, the legend and the level ticks."""
    n_levels, w = g.n_levels, g.width
    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            g.cells.z,
            WINDOW_STATUS,
            x=range(w),
            y=range(n_levels + 1),
            text=g.cells.text,
            hover=g.cells.hover,
            name="window",
            font_size=11 if w <= 8 else 9,
        )
    )
    for i, added in enumerate(g.added):
        if added:
            _frame_column(fig, i, n_levels)
    used = _legend(fig, g.cells.z, any(g.added))
    ticks = ["level 0 (oldest)" if j == 0 else f"level {j}" for j in range(n_levels)]
    _grid_axes(
        fig,
        "window position",
        list(range(w)),
        [-0.5, w - 0.5],
        n_levels,
        [*ticks, "new guesses"],
    )
    title = f"Step {g.step}: window of {n_levels} level{'s' if n_levels != 1 else ''} × {w}"
    k = sum(g.added)
    subtitle = f"after x = {g.x_text}; {g.note}; {k} new n-gram{'s' if k != 1 else ''} for the pool"
    height = max(260, 150 + 44 * (n_levels + 1) + 16 * used)
    return _base_layout(fig, title, height=height, subtitle=wrap(subtitle, SUBTITLE_CHARS))


def _grid_axes(
    fig: go.Figure,
    x_title: str,
    x_ticks: list[int],
    x_range: list[float],
    top_row: int,
    y_ticks: list[str],
) -> None:
    """The window's axes: a tick per column, a named tick per row 0..`top_row`, no grid."""
    fig.update_xaxes(
        title_text=x_title,
        tickvals=x_ticks,
        range=x_range,
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickvals=list(range(top_row + 1)),
        ticktext=y_ticks,
        range=[-0.5, top_row + 0.5],
        showgrid=False,
        zeroline=False,
        automargin=True,
    )


def _window_history(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """W = 1: the window's one column at each of the last steps up to `step`, side by side."""
    g = history_grid(events, texts, step)
    assert g is not None  # the caller found a one-column window at `step`
    depth, steps = g.depth, list(g.steps)
    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            g.cells.z,
            WINDOW_STATUS,
            x=steps,
            y=range(depth + 1),
            text=g.cells.text,
            hover=g.cells.hover,
            name="window",
            font_size=11 if len(steps) <= 8 else 9,
        )
    )
    _frame_column(fig, step, depth, colour=SEPARATOR_COLOUR)  # the selected step's window
    for added_step in g.added_steps:  # inset, inside the selected step's frame where they meet
        _frame_column(fig, added_step, depth, width=2, inset=0.45)
    used = _legend(fig, g.cells.z, bool(g.added_steps))
    _grid_axes(
        fig,
        "step (dark frame: this step)",
        steps,
        [steps[0] - 0.5, steps[-1] + 0.5],
        depth,
        ["level 0 (oldest)", *(f"level {j}" for j in range(1, depth)), "new guess"],
    )
    levels = f"{g.levels} level{'s' if g.levels != 1 else ''}"
    subtitle = (
        f"W = 1: one column of {g.levels} Jacobi level"
        f"{'s' if g.levels != 1 else ''} after x = {g.x_text}. "
        "Each step the column climbs one level (tokens slide down) and, once full, "
        f"column + new guess is one {g.n or 'N'}-gram for the pool. The 'paper' preset (W = 15) "
        "shows a 2D window."
    )
    height = max(280, 170 + 40 * (depth + 1) + 16 * used)
    return _base_layout(
        fig,
        f"Step {step}: window of {levels} × 1",
        height=height,
        subtitle=wrap(subtitle, SUBTITLE_CHARS),
    )


def _legend(fig: go.Figure, z: list[list[int | None]], outlined: bool) -> int:
    """Legend entries for the window's cell colours in use, and the green outline; their count."""
    code = _codes(WINDOW_STATUS)
    used = {s for row in z for s in row if s is not None}
    count = 0
    for status, (colour, label) in WINDOW_STATUS.items():
        if code[status] in used:
            fig.add_trace(_swatch(colour, label))
            count += 1
    if outlined:
        fig.add_trace(_swatch("rgba(0,0,0,0)", ADDED_LABEL))
        fig.data[-1].marker.line = dict(width=2, color=BOUNDARY_COLOUR)
        count += 1
    return count


# --- Lookahead: the n-gram pool and the candidates checked ----------------------------------------


def ngram_pool(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The pool's most-hit n-grams as bars (hit counts so far, this step's check included): which
    continuations the window's Jacobi guesses (and the prompt and output) keep supplying."""
    title = f"Step {step}: n-gram pool"
    pool = _at(events, NgramPool, step)
    if pool is None:
        note = " (step 0 is the prefill)" if step == 0 else ""
        return _empty(title, f"no n-gram pool at step {step}{note}")
    n = pool.n or _ngram_size(events)
    title = f"Step {step}: pool holds {pool.size} n-grams"
    subtitle = (
        f"{'N = ' + str(n) + '; ' if n else ''}most-hit n-grams so far "
        "(a hit: a verified candidate was at least partly accepted)"
    )
    top = sorted((e for e in pool.top if len(e) >= 2), key=lambda e: -e[0])
    if not top:
        fig = _empty(title, "no n-gram has been hit yet")
        return _base_layout(fig, title, height=200, subtitle=wrap(subtitle, SUBTITLE_CHARS))
    fig = go.Figure(
        go.Bar(
            x=[e[0] for e in top],
            y=list(range(len(top))),
            orientation="h",
            marker_color="#2e7d32",
            text=[str(e[0]) for e in top],
            textposition="auto",
            customdata=[f"{_gram(e[1:], texts)}<br>ids {', '.join(map(str, e[1:]))}" for e in top],
            hovertemplate="%{customdata}<br>%{x} hits<extra></extra>",
            name="hits",
            showlegend=False,
        )
    )
    fig.update_yaxes(
        tickvals=list(range(len(top))),
        ticktext=[_gram(e[1:], texts, limit=24) for e in top],
        autorange="reversed",
        automargin=True,
    )
    fig.update_xaxes(
        title_text="hits so far", rangemode="tozero", dtick=1 if top[0][0] <= 10 else None
    )
    height = min(560, max(220, 130 + 28 * len(top)))
    return _base_layout(fig, title, height=height, subtitle=wrap(subtitle, SUBTITLE_CHARS))


def pool_candidates(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The candidate n-grams the verification branch checked at `step`, one root-to-leaf path of
    the trie per row (shared prefixes are one node, verified once): x, then each token green
    (accepted), red (compared with the target's choice and lost) or grey (never compared)."""
    title = f"Step {step}: candidates after x"
    if _at(events, NgramPool, step) is None:
        note = " (step 0 is the prefill)" if step == 0 else ""
        return _empty(title, f"no n-gram pool at step {step}{note}")
    grid = candidate_grid(events, texts, step)
    if grid is None:
        title = f"Step {step}: candidates after x = {_x_text(events, texts, step)}"
        return _empty(title, "no pool n-gram starts with x: nothing to verify this step", 200)
    return _draw_candidates(grid)


def _draw_candidates(g: CandidateGrid) -> go.Figure:
    """The candidates' heatmap (a row per path), the verdicts' legend, the depth ticks."""
    depth, rows = g.depth, len(g.cells.z)
    code = _codes(CANDIDATE_STATUS)
    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            g.cells.z,
            CANDIDATE_STATUS,
            x=range(depth + 1),
            y=range(rows),
            text=g.cells.text,
            hover=g.cells.hover,
            name="candidates",
        )
    )
    used = {s for row in g.cells.z for s in row if s is not None}
    for s, (colour, label) in CANDIDATE_STATUS.items():
        if code[s] in used:
            fig.add_trace(_swatch(colour, label))
    fig.update_xaxes(
        title_text="depth after x",
        tickvals=list(range(depth + 1)),
        ticktext=["x", *map(str, range(1, depth + 1))],
        range=[-0.5, max(depth, 6) + 0.5],  # short candidates keep square-ish cells
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickvals=list(range(rows)),
        ticktext=[f"candidate {r + 1}" for r in range(rows)],
        range=[rows - 0.5, -0.5],
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    title = f"Step {g.step}: candidates after x = {g.x_text}"
    k = g.accepted
    subtitle = (
        f"{g.hits} n-gram{'s' if g.hits != 1 else ''} from the pool, merged into a trie and "
        f"verified in the same forward; {k} token{'s' if k != 1 else ''} accepted"
    )
    height = min(620, max(240, 150 + 30 * rows + 16 * len(used)))
    return _base_layout(fig, title, height=height, subtitle=wrap(subtitle, SUBTITLE_CHARS))


def lookahead_panel(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Lookahead's method panel: the step's attention mask when the trace has it, else the window."""
    if _at(events, AttentionMask, step) is not None:
        return attention_mask(events, texts, step)
    return lookahead_window(events, texts, step)
