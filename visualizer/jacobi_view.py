"""Jacobi decoding's trajectory: the guessed block, iteration by iteration: which guesses the
last forward changed, which stood still, which converged (accepted), and where each row's fixed
point ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
from .text import escape, short_token, visible

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
        return escape(visible(text)[:limit])
    return short_token(text, limit - 1)  # the ellipsis takes the last place


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
    its = [e for e in events if isinstance(e, JacobiIteration) and e.step <= step]
    if not its:
        return _empty(
            title, "no Jacobi iteration yet: step 0 is the prefill, each later step one iteration"
        )
    verifies = {e.step: e for e in events if isinstance(e, Verify)}
    commits = {e.step: e for e in events if isinstance(e, Commit)}
    output = _committed_by_position(events, step)

    def start_of(it: JacobiIteration) -> int:
        if it.start >= 0:
            return it.start
        # Older traces: the block starts after everything committed before its step.
        return sum(len(c.tokens) for s, c in commits.items() if s < it.step)

    def n_accepted(it: JacobiIteration) -> int:
        v = verifies.get(it.step)
        return len(v.accepted) if v is not None and it.tokens else 0

    first = max(0, len(its) - MAX_ITERATIONS)
    shown = its[first:]
    hi = max(max(start_of(it) + len(it.tokens) for it in shown), start_of(shown[-1]) + 1)
    lo = 0 if hi <= 40 else max(0, start_of(shown[0]) - 1)
    lo = max(lo, hi - MAX_POSITIONS)
    plot_px = PHONE_PLOT_PX
    if width:
        plot_px = max(int(width) - MARGINS_PX, 100)
        block = max(len(it.tokens) for it in shown)
        lo = max(lo, hi - max(plot_px // CELL_PX, block + 1))
    columns = hi - lo
    code = _codes(JACOBI_STATUS)

    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    rows: list[float] = []
    ticks: list[str] = []
    bx: list[float | None] = []
    by: list[float | None] = []
    for it in shown:
        c, a = start_of(it), n_accepted(it)
        commit = commits.get(it.step)
        committed = len(commit.tokens) if commit is not None else 0
        y = float(it.iteration)
        rows.append(y)
        ticks.append(f"{it.iteration} (+{committed})")
        zr: list[int | None] = []
        tr: list[str] = []
        hr: list[str] = []
        for pos in range(lo, hi):
            i = pos - c
            if pos < c and pos < len(output):
                t, when = output[pos]
                status = "fixed"
                note = f"committed at step {when}: part of the fixed point"
            elif 0 <= i < len(it.tokens):
                t = it.tokens[i]
                changed = it.changed[i] if i < len(it.changed) else True
                status = (
                    "converged"
                    if i < a
                    else "wrong"
                    if i == a and it.step in verifies
                    else "changed"
                    if changed
                    else "unchanged"
                )
                note = {
                    "converged": "guess accepted by the target this iteration",
                    "wrong": "first wrong guess: the target's own token "
                    + (f"{_tok(texts, commit.tokens[a])} " if commit and a < committed else "")
                    + "is committed here instead",
                    "changed": "changed by the previous forward, not yet fixed",
                    "unchanged": "the same guess as the previous iteration, not yet fixed",
                }[status]
            else:
                zr.append(None)
                tr.append("")
                hr.append("")
                continue
            zr.append(code[status])
            tr.append(_cell_label(texts.get(t, "?"), columns, plot_px))
            hr.append(
                f"{_tok(texts, t)}<br>output position {pos} · iteration {it.iteration}<br>{note}"
            )
        z.append(zr)
        text.append(tr)
        hover.append(hr)
        if it.step in verifies and it.tokens and lo <= c + a <= hi:
            bx += [c + a - 0.5, c + a - 0.5, None]
            by += [y - 0.5, y + 0.5, None]

    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            z,
            JACOBI_STATUS,
            x=range(lo, hi),
            y=rows,
            text=text,
            hover=hover,
            name="trajectory",
            font_size=11 if columns <= 16 else 9,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=bx,
            y=by,
            mode="lines",
            line=dict(width=4, color=BOUNDARY_COLOUR),
            name="end of the converged guesses",
            hoverinfo="skip",
        )
    )
    used = {s for row in z for s in row if s is not None}
    for status, (colour, label) in JACOBI_STATUS.items():
        if code[status] in used:
            fig.add_trace(_swatch(colour, label))
    fig.update_xaxes(
        title_text="output position (0 = first new token)",
        dtick=1 if columns <= 12 else 2 if columns <= 30 else 5,
        range=[lo - 0.5, hi - 0.5],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        title_text="iteration (+fixed)",
        tickvals=rows,
        ticktext=ticks,
        autorange="reversed",  # the newest iteration at the bottom, like reading down a log
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    last = shown[-1]
    a = n_accepted(last)
    guessed = (
        f"{a} of {len(last.tokens)} guesses converged"
        if last.tokens
        else "no guesses (room for one token only)"
    )
    subtitle = (
        f"iteration {last.iteration}: {guessed}, {len(output)} tokens fixed"
        + (f"; the last {len(shown)} of {len(its)} iterations" if first else "")
        + (f"; positions {lo} to {hi - 1}" if lo > 0 else "")
    )
    legend = len(used) + 1
    # at least six rows' height: the y axis' title is longer than two or three rows are tall,
    # and ran up into the subtitle
    height = max(260, 120 + 30 * max(len(shown), 6) + 16 * legend)
    return _base_layout(fig, title, height=height, subtitle=subtitle)
