"""Jacobi and Lookahead decoding as Plotly figures. Pure: events + token texts in, Figure out.

- `jacobi_trajectory`: the guessed block, iteration by iteration: which guesses the last forward
  changed, which stood still, which converged (accepted), and where each row's fixed point ends.
- `lookahead_window`: Lookahead's 2D window (Jacobi levels × window positions) at one step, with
  the columns whose n-grams entered the pool.
- `ngram_pool`: the most-hit n-grams, and the candidate n-grams the verify branch checked.
- `attention_mask`: the real attention pattern among one forward's new inputs, by branch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

import plotly.graph_objects as go

from decoders.core.events import (
    AttentionMask,
    Commit,
    Draft,
    Event,
    JacobiIteration,
    LookaheadWindow,
    NgramPool,
    Verify,
)
from decoders.core.tree import depths, leaf_paths

from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .text import cut, escape, short_token, token_hover, visible, wrap
from .tokens import COLOURS, LABELS
from .tree_view import _root_token

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


def _cell_label(text: str, columns: int) -> str:
    """A token inside a heatmap cell, as many characters as a phone-wide cell holds (about 6 px
    each, none when too narrow; the hover has the whole token), with an ellipsis only where a
    cell has room for one."""
    limit = min(6, PHONE_PLOT_PX // max(columns, 1) // 6)
    if limit < 4:
        return escape(visible(text)[:limit])
    return short_token(text, limit - 1)  # the ellipsis takes the last place


def jacobi_trajectory(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The Jacobi trajectory as the CLLM and Lookahead papers draw it: one row per iteration (the
    last 16 up to `step`), one column per ABSOLUTE output position. Each row is the sequence the
    forward saw: the tokens committed before it (grey: the fixed point so far), then the block of
    guesses: green where the target accepted them (converged), red for the first wrong guess (the
    target's own token is committed there instead), orange where the previous forward changed the
    guess, white where it stood still. Read down the rows, the fixed-point prefix grows."""
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
            tr.append(_cell_label(texts.get(t, "?"), columns))
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
        title_text="iteration (+ tokens it fixed)",
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
        + (f"; positions {lo} to {hi - 1}" if columns == MAX_POSITIONS and lo > 0 else "")
    )
    legend = len(used) + 1
    height = max(260, 120 + 30 * len(shown) + 16 * legend)
    return _base_layout(fig, title, height=height, subtitle=subtitle)


jacobi_panel = jacobi_trajectory


# --- Lookahead: the window ------------------------------------------------------------------------

HISTORY_STEPS = 12  # W = 1: the window's single column at the last steps, side by side


def _ngram_size(events: Sequence[Event]) -> int | None:
    """N: recorded on every NgramPool event; older traces: read off an n-gram the pool gained."""
    for e in events:
        if isinstance(e, NgramPool) and e.n:
            return e.n
    for e in events:
        if isinstance(e, NgramPool) and e.added:
            return len(e.added[0])
    return None


def _x_text(events: Sequence[Event], texts: Mapping[int, str], step: int, limit: int = 12) -> str:
    x_id, _ = _root_token(events, step)
    if x_id is None:
        return "?"
    shown = repr(texts.get(x_id, "?"))
    return escape(shown if len(shown) <= limit else shown[: limit - 2] + "…'")  # keep the quote


def _window_column(
    window: LookaheadWindow, i: int, added: set[tuple[int, ...]]
) -> tuple[tuple[int, ...], bool]:
    """Column i's n-gram (its history plus the new guess on top) and whether it entered the pool."""
    if i >= len(window.outputs):
        return (), False
    gram = (*(level[i] for level in window.levels if i < len(level)), window.outputs[i])
    return gram, gram in added


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
    pool = _at(events, NgramPool, step)
    added = set(pool.added) if pool is not None else set()
    levels = window.levels
    n_levels, w = len(levels), len(levels[0])
    outputs = tuple(window.outputs[:w])
    n = _ngram_size(events)
    full = n == n_levels + 1 if n is not None else bool(added)
    code = _codes(WINDOW_STATUS)

    columns = [_window_column(window, i, added) for i in range(w)]
    grams = [g for g, _ in columns]
    is_added = [a for _, a in columns]
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    rows = [*levels, outputs]
    for j, row in enumerate(rows):
        zr: list[int | None] = []
        tr: list[str] = []
        hr: list[str] = []
        top = j == n_levels
        for i in range(w):
            if i >= len(row):
                zr.append(None)
                tr.append("")
                hr.append("")
                continue
            t = row[i]
            status = "guess" if top else "history"
            zr.append(code[status])
            tr.append(_cell_label(texts.get(t, "?"), w))
            where = (
                f"new guess for position x+{i + n_levels + 1} (the target's argmax on top of column {i})"
                if top
                else f"level {j} · column {i} · position x+{i + j + 1}"
            )
            if is_added[i]:
                fate = "added to the pool this step"
            elif not grams[i]:
                fate = "no n-gram (no output for this column)"
            elif full:
                fate = "already in the pool (kept as its newest)"
            else:
                fate = "none yet: the window fills one level per step"
            hr.append(
                f"{_tok(texts, t)}<br>{where}<br>column n-gram {_gram(grams[i], texts)}: {fate}"
            )
        z.append(zr)
        text.append(tr)
        hover.append(hr)

    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            z,
            WINDOW_STATUS,
            x=range(w),
            y=range(n_levels + 1),
            text=text,
            hover=hover,
            name="window",
            font_size=11 if w <= 8 else 9,
        )
    )
    for i in range(w):
        if is_added[i]:
            _frame_column(fig, i, n_levels)
    used = _legend(fig, z, any(is_added))
    ticks = ["level 0 (oldest)" if j == 0 else f"level {j}" for j in range(n_levels)] + [
        "new guesses"
    ]
    note = "column i + its new guess is an n-gram"
    if n is not None and n_levels + 1 < n:
        note = f"warming up: {n_levels} of {n - 1} levels, one more per step"
    elif n is None and not added:
        note = "no n-grams yet: the window fills one level per step"
    fig.update_xaxes(
        title_text="window position",
        tickvals=list(range(w)),
        range=[-0.5, w - 0.5],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickvals=list(range(n_levels + 1)),
        ticktext=ticks,
        range=[-0.5, n_levels + 0.5],
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    title = f"Step {step}: window of {n_levels} level{'s' if n_levels != 1 else ''} × {w}"
    k = sum(is_added)
    subtitle = (
        f"after x = {_x_text(events, texts, step)}; {note}; "
        f"{k} new n-gram{'s' if k != 1 else ''} for the pool"
    )
    height = max(260, 150 + 44 * (n_levels + 1) + 16 * used)
    return _base_layout(fig, title, height=height, subtitle=wrap(subtitle, SUBTITLE_CHARS))


def _window_history(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """W = 1: the window's one column at each of the last steps up to `step`, side by side."""
    windows = [
        e
        for e in events
        if isinstance(e, LookaheadWindow) and e.step <= step and e.levels and len(e.levels[0]) == 1
    ][-HISTORY_STEPS:]
    pools = {e.step: e for e in events if isinstance(e, NgramPool)}
    n = _ngram_size(events)
    depth = max(len(wnd.levels) for wnd in windows)
    code = _codes(WINDOW_STATUS)
    z: list[list[int | None]] = [[] for _ in range(depth + 1)]
    text: list[list[str]] = [[] for _ in range(depth + 1)]
    hover: list[list[str]] = [[] for _ in range(depth + 1)]
    added_steps: list[int] = []
    for wnd in windows:
        pool = pools.get(wnd.step)
        gram, is_added = _window_column(wnd, 0, set(pool.added) if pool is not None else set())
        if is_added:
            added_steps.append(wnd.step)
        cells = [level[0] for level in wnd.levels] + list(wnd.outputs[:1])
        for j in range(depth + 1):
            # Row `depth` is the new guess; the levels sit bottom-up below it.
            if j == depth:
                t: int | None = cells[-1] if len(cells) > len(wnd.levels) else None
                status = "guess"
                where = "new guess: the target's output on top of the column"
            elif j < len(wnd.levels):
                t, status = cells[j], "history"
                where = f"level {j} (position x+{j + 1})"
            else:
                t = None
            if t is None:
                z[j].append(None)
                text[j].append("")
                hover[j].append("")
                continue
            z[j].append(code[status])
            text[j].append(_cell_label(texts.get(t, "?"), len(windows)))
            fate = (
                "added to the pool"
                if is_added
                else "already in the pool"
                if n is not None and len(gram) == n
                else "the window is still filling"
            )
            hover[j].append(
                f"{_tok(texts, t)}<br>step {wnd.step} · {where}"
                f"<br>column n-gram {_gram(gram, texts)}: {fate}"
            )
    fig = go.Figure()
    steps = [wnd.step for wnd in windows]
    fig.add_trace(
        _heatmap(
            z,
            WINDOW_STATUS,
            x=steps,
            y=range(depth + 1),
            text=text,
            hover=hover,
            name="window",
            font_size=11 if len(windows) <= 8 else 9,
        )
    )
    _frame_column(fig, step, depth, colour=SEPARATOR_COLOUR)  # the selected step's window
    for added_step in added_steps:  # inset, inside the selected step's frame where they meet
        _frame_column(fig, added_step, depth, width=2, inset=0.45)
    used = _legend(fig, z, bool(added_steps))
    fig.update_xaxes(
        title_text="step (dark frame: this step)",
        tickvals=steps,
        range=[steps[0] - 0.5, steps[-1] + 0.5],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickvals=list(range(depth + 1)),
        ticktext=["level 0 (oldest)", *(f"level {j}" for j in range(1, depth)), "new guess"],
        range=[-0.5, depth + 0.5],
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    window = windows[-1]
    subtitle = (
        f"W = 1: one column of {len(window.levels)} Jacobi level"
        f"{'s' if len(window.levels) != 1 else ''} after x = {_x_text(events, texts, step)}. "
        "Each step the column climbs one level (tokens slide down) and, once full, "
        f"column + new guess is one {n or 'N'}-gram for the pool. The 'paper' preset (W = 15) "
        "shows a 2D window."
    )
    height = max(280, 170 + 40 * (depth + 1) + 16 * used)
    return _base_layout(
        fig,
        f"Step {step}: window of {len(window.levels)} level{'s' if len(window.levels) != 1 else ''} × 1",
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


def _trie_paths(parents: Sequence[int]) -> list[list[int]]:
    """Root-to-leaf paths of the step's trie; none for a malformed parent array (imported trace)."""
    try:
        depths(parents)  # validates: parents come before children
    except ValueError:
        return []
    return leaf_paths(parents)


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
    pool = _at(events, NgramPool, step)
    draft = _at(events, Draft, step)
    verify = _at(events, Verify, step)
    if pool is None:
        note = " (step 0 is the prefill)" if step == 0 else ""
        return _empty(title, f"no n-gram pool at step {step}{note}")
    x_id, _ = _root_token(events, step)
    title = f"Step {step}: candidates after x = {_x_text(events, texts, step)}"
    paths = _trie_paths(draft.parents) if draft is not None else []
    if draft is None or not paths:
        return _empty(title, "no pool n-gram starts with x: nothing to verify this step", 200)
    n = len(draft.tokens)
    accepted = [a for a in (verify.accepted if verify is not None else ()) if 0 <= a < n]
    acc = set(accepted)
    status = [
        "accepted"
        if i in acc
        else "rejected"
        if verify is not None and (p == -1 or p in acc)
        else "not checked"
        for i, p in enumerate(draft.parents)
    ]
    depth = max(len(p) for p in paths)
    code = _codes(CANDIDATE_STATUS)
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    for r, path in enumerate(paths):
        zr: list[int | None] = [code["root"]]
        tr = ["x " + _cell_label(texts.get(x_id, "?"), depth + 1) if x_id is not None else "x"]
        hr = [f"{_tok(texts, x_id)}<br>x: the last committed token"]
        for d in range(1, depth + 1):
            if d > len(path):
                zr.append(None)
                tr.append("")
                hr.append("")
                continue
            node = path[d - 1]
            s = status[node]
            zr.append(code[s])
            tr.append(_cell_label(texts.get(draft.tokens[node], "?"), depth + 1))
            hr.append(
                f"{_tok(texts, draft.tokens[node])}<br>{s}<br>candidate {r + 1} · depth {d}"
                f" · trie node {node}"
            )
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            z,
            CANDIDATE_STATUS,
            x=range(depth + 1),
            y=range(len(paths)),
            text=text,
            hover=hover,
            name="candidates",
        )
    )
    used = {s for row in z for s in row if s is not None}
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
        tickvals=list(range(len(paths))),
        ticktext=[f"candidate {r + 1}" for r in range(len(paths))],
        range=[len(paths) - 0.5, -0.5],
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    k = len(accepted)
    subtitle = (
        f"{pool.hits} n-gram{'s' if pool.hits != 1 else ''} from the pool, merged into a trie and "
        f"verified in the same forward; {k} token{'s' if k != 1 else ''} accepted"
    )
    height = min(620, max(240, 150 + 30 * len(paths) + 16 * len(used)))
    return _base_layout(fig, title, height=height, subtitle=wrap(subtitle, SUBTITLE_CHARS))


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


def attention_mask(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The attention mask the model really got at `step`, among the forward's new inputs: row =
    query, column = key, a coloured cell = visible. Cells take the colour of the query's branch (x,
    the lookahead window, the verification trie), with lines between the branches."""
    title = f"Attention mask at step {step}"
    ev = _at(events, AttentionMask, step)
    if ev is None or not ev.labels:
        note = "step 0 is the prefill" if step == 0 else "recorded only with detail events on"
        return _empty(title, f"no attention mask at step {step} ({note})")
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
    names = [
        escape(lb) + (f" {short_token(texts.get(t, '?'), 6)}" if t is not None and n <= 64 else "")
        for lb, t in zip(labels, ids, strict=True)
    ]

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

    fig = go.Figure()
    fig.add_trace(
        _heatmap(z, MASK_BRANCH, x=range(n), y=range(n), text=None, hover=hover, name="mask")
    )
    fig.data[0].update(xgap=1 if n <= 64 else 0, ygap=1 if n <= 64 else 0)
    # Separators: thick between branches, thin dashed between the window's levels.
    for b in range(1, n):
        level_a, level_b = _LOOK.match(labels[b - 1]), _LOOK.match(labels[b])
        if branches[b] != branches[b - 1]:
            line = dict(color=SEPARATOR_COLOUR, width=2)
        elif level_a and level_b and level_a.group(1) != level_b.group(1):
            line = dict(color="#90a4ae", width=1, dash="dot")
        else:
            continue
        fig.add_shape(type="line", x0=b - 0.5, x1=b - 0.5, y0=-0.5, y1=n - 0.5, line=line)
        fig.add_shape(type="line", x0=-0.5, x1=n - 0.5, y0=b - 0.5, y1=b - 0.5, line=line)
    # Lookahead's layout, or a mask model's (SPACE, Mask-Predict): each names its own inputs.
    masks = "mask" in branches
    for branch in (*INPUT_BRANCHES, "masked"):
        if branch == "masked" or branch in branches:
            colour, label = MASK_BRANCH[branch]
            if masks and branch == "verify":
                label = "guess being verified (last step's mask guesses)"
            fig.add_trace(_swatch(colour, label))
    if n <= 32:
        tickvals, ticktext = list(range(n)), names
    else:  # too many to label: name the first input of each branch
        tickvals = [i for i in range(n) if i == 0 or branches[i] != branches[i - 1]]
        ticktext = [names[i] for i in tickvals]
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
    # Lookahead's three branches are named even when one is empty ("0 verify": no candidate).
    window = {"x", "lookahead", "verify"} if "lookahead" in branches else set()
    counts = " · ".join(
        f"{branches.count(b)} {b}"
        for b in INPUT_BRANCHES
        if b in branches or (b in window and window & set(branches))
    )
    title = f"Step {step}: attention among {n} inputs"
    subtitle = wrap(f"{counts}; {MASK_NOTE}", SUBTITLE_CHARS)
    return _base_layout(fig, title, height=min(900, max(360, 20 * n + 280)), subtitle=subtitle)


def lookahead_panel(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Lookahead's method panel: the step's attention mask when the trace has it, else the window."""
    if _at(events, AttentionMask, step) is not None:
        return attention_mask(events, texts, step)
    return lookahead_window(events, texts, step)
