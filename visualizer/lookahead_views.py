"""Lookahead decoding as Plotly figures. Pure: events + token texts in, Figure out.

- `lookahead_window`: Lookahead's 2D window (Jacobi levels × window positions) at one step, with
  the columns whose n-grams entered the pool.
- `ngram_pool`: the most-hit n-grams, and the candidate n-grams the verify branch checked.
- `lookahead_panel`: the step's window, as the method's main panel."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import (
    AttentionMask,
    Draft,
    Event,
    LookaheadWindow,
    NgramPool,
    Verify,
)
from decoders.core.tree import depths, leaf_paths

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
    _tok,
)
from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .jacobi_view import _cell_label, _frame_column
from .mask_view import attention_mask
from .text import escape, wrap
from .tree_view import _root_token

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


def lookahead_panel(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Lookahead's method panel: the step's attention mask when the trace has it, else the window."""
    if _at(events, AttentionMask, step) is not None:
        return attention_mask(events, texts, step)
    return lookahead_window(events, texts, step)
