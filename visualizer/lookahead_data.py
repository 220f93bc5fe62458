"""What Lookahead's grid views show, as plain data: the cells of the window (W > 1), of the window's
one column across steps (W = 1), and of the candidate n-grams verified at a step. No Plotly:
events and token texts in, cells and the facts the titles name out (lookahead_views draws them).

A cell is (status code, label, hover); the codes index WINDOW_STATUS or CANDIDATE_STATUS."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from decoders.core.events import Draft, Event, LookaheadWindow, NgramPool, Verify
from decoders.core.tree import depths, leaf_paths

from .cells import CANDIDATE_STATUS, WINDOW_STATUS, _at, _codes, _gram, _tok
from .jacobi_view import _cell_label
from .text import cut, escape
from .tree_view import _root_token

HISTORY_STEPS = 12  # W = 1: the window's single column at the last steps, side by side

Cell = tuple[int | None, str, str]  # status code (None: no cell), label, hover
EMPTY: Cell = (None, "", "")


@dataclass(frozen=True)
class Cells:
    """A heatmap's cells row by row (row 0 first): status codes (None: empty), labels, hovers."""

    z: list[list[int | None]]
    text: list[list[str]]
    hover: list[list[str]]


def _cells(rows: Sequence[Sequence[Cell]]) -> Cells:
    return Cells(
        z=[[c[0] for c in row] for row in rows],
        text=[[c[1] for c in row] for row in rows],
        hover=[[c[2] for c in row] for row in rows],
    )


@dataclass(frozen=True)
class WindowGrid:
    """Lookahead's 2D window at one step: the levels bottom-up, the new guesses on top."""

    step: int
    cells: Cells
    n_levels: int
    width: int  # W: window positions (columns)
    added: tuple[bool, ...]  # per column: its n-gram entered the pool this step
    note: str  # what a column is, or why none is an n-gram yet
    x_text: str  # x, the token the window follows, as a short label


@dataclass(frozen=True)
class HistoryGrid:
    """W = 1: the window's one column at each of the last steps up to `step`."""

    step: int
    cells: Cells
    steps: tuple[int, ...]  # the columns' steps
    depth: int  # levels of the deepest column (the new guess is row `depth`)
    added_steps: tuple[int, ...]  # the steps whose column n-gram entered the pool
    levels: int  # levels of the selected step's column
    n: int | None  # N, when the trace says it
    x_text: str


@dataclass(frozen=True)
class CandidateGrid:
    """The candidate n-grams verified at one step: one root-to-leaf path of the trie per row,
    x in column 0, then each token's verdict."""

    step: int
    cells: Cells
    depth: int  # the longest path's length
    accepted: int  # tokens accepted
    hits: int  # n-grams the pool supplied
    x_text: str


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
    text = texts.get(x_id, "?")
    shown = repr(text)
    return escape(shown if len(shown) <= limit else repr(cut(text, limit - 2)))  # quoted, cut


def _window_column(
    window: LookaheadWindow, i: int, added: set[tuple[int, ...]]
) -> tuple[tuple[int, ...], bool]:
    """Column i's n-gram (its history plus the new guess on top) and whether it entered the pool."""
    if i >= len(window.outputs):
        return (), False
    gram = (*(level[i] for level in window.levels if i < len(level)), window.outputs[i])
    return gram, gram in added


# --- the window (W > 1) ---------------------------------------------------------------------------


def _column_fate(gram: tuple[int, ...], added: bool, full: bool) -> str:
    """What became of a column's n-gram, for its cells' hover."""
    if added:
        return "added to the pool this step"
    if not gram:
        return "no n-gram (no output for this column)"
    if full:
        return "already in the pool (kept as its newest)"
    return "none yet: the window fills one level per step"


def _window_note(n: int | None, n_levels: int, added: set[tuple[int, ...]]) -> str:
    """The subtitle's word on the columns: n-grams, or the window still warming up."""
    if n is not None and n_levels + 1 < n:
        return f"warming up: {n_levels} of {n - 1} levels, one more per step"
    if n is None and not added:
        return "no n-grams yet: the window fills one level per step"
    return "column i + its new guess is an n-gram"


def window_grid(events: Sequence[Event], texts: Mapping[int, str], step: int) -> WindowGrid | None:
    """The 2D window at `step` as cells: level 0 (the oldest Jacobi guesses) in row 0, each level
    above it one iteration newer, the target's new guesses on top. None when the step has no
    window of two or more columns (W = 1 is drawn by `history_grid`)."""
    window = _at(events, LookaheadWindow, step)
    if window is None or not window.levels or len(window.levels[0]) < 2:
        return None
    pool = _at(events, NgramPool, step)
    added = set(pool.added) if pool is not None else set()
    levels = window.levels
    n_levels, w = len(levels), len(levels[0])
    n = _ngram_size(events)
    full = n == n_levels + 1 if n is not None else bool(added)
    code = _codes(WINDOW_STATUS)
    columns = [_window_column(window, i, added) for i in range(w)]
    fates = [_column_fate(gram, is_added, full) for gram, is_added in columns]
    rows: list[list[Cell]] = []
    for j, row in enumerate([*levels, tuple(window.outputs[:w])]):
        top = j == n_levels
        cells: list[Cell] = []
        for i in range(w):
            if i >= len(row):
                cells.append(EMPTY)
                continue
            t = row[i]
            where = (
                f"new guess for position x+{i + n_levels + 1} (the target's argmax on top of column {i})"
                if top
                else f"level {j} · column {i} · position x+{i + j + 1}"
            )
            hover = f"{_tok(texts, t)}<br>{where}<br>column n-gram {_gram(columns[i][0], texts)}: {fates[i]}"
            cells.append(
                (code["guess" if top else "history"], _cell_label(texts.get(t, "?"), w), hover)
            )
        rows.append(cells)
    return WindowGrid(
        step=step,
        cells=_cells(rows),
        n_levels=n_levels,
        width=w,
        added=tuple(a for _, a in columns),
        note=_window_note(n, n_levels, added),
        x_text=_x_text(events, texts, step),
    )


# --- the window's one column across steps (W = 1) -------------------------------------------------


def _history_column(
    wnd: LookaheadWindow,
    gram: tuple[int, ...],
    fate: str,
    depth: int,
    columns: int,
    texts: Mapping[int, str],
) -> list[Cell]:
    """One step's column, bottom-up: its levels, empty rows up to `depth`, the new guess on top."""
    code = _codes(WINDOW_STATUS)
    cells = [level[0] for level in wnd.levels] + list(wnd.outputs[:1])
    out: list[Cell] = []
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
            out.append(EMPTY)
            continue
        hover = (
            f"{_tok(texts, t)}<br>step {wnd.step} · {where}"
            f"<br>column n-gram {_gram(gram, texts)}: {fate}"
        )
        out.append((code[status], _cell_label(texts.get(t, "?"), columns), hover))
    return out


def history_grid(
    events: Sequence[Event], texts: Mapping[int, str], step: int
) -> HistoryGrid | None:
    """W = 1: the window's one column at each of the last HISTORY_STEPS steps up to `step`, side by
    side (cells column by column, then turned into rows). None when no step up to `step` has one."""
    windows = [
        e
        for e in events
        if isinstance(e, LookaheadWindow) and e.step <= step and e.levels and len(e.levels[0]) == 1
    ][-HISTORY_STEPS:]
    if not windows:
        return None
    pools = {e.step: e for e in events if isinstance(e, NgramPool)}
    n = _ngram_size(events)
    depth = max(len(wnd.levels) for wnd in windows)
    columns: list[list[Cell]] = []
    added_steps: list[int] = []
    for wnd in windows:
        pool = pools.get(wnd.step)
        gram, is_added = _window_column(wnd, 0, set(pool.added) if pool is not None else set())
        if is_added:
            added_steps.append(wnd.step)
        fate = (
            "added to the pool"
            if is_added
            else "already in the pool"
            if n is not None and len(gram) == n
            else "the window is still filling"
        )
        columns.append(_history_column(wnd, gram, fate, depth, len(windows), texts))
    return HistoryGrid(
        step=step,
        cells=_cells([[col[j] for col in columns] for j in range(depth + 1)]),
        steps=tuple(wnd.step for wnd in windows),
        depth=depth,
        added_steps=tuple(added_steps),
        levels=len(windows[-1].levels),
        n=n,
        x_text=_x_text(events, texts, step),
    )


# --- the candidates checked -----------------------------------------------------------------------


def _trie_paths(parents: Sequence[int]) -> list[list[int]]:
    """Root-to-leaf paths of the step's trie; none for a malformed parent array (imported trace)."""
    try:
        depths(parents)  # validates: parents come before children
    except ValueError:
        return []
    return leaf_paths(parents)


def _node_status(draft: Draft, verify: Verify | None, accepted: set[int]) -> list[str]:
    """Each trie node's verdict: accepted, rejected (compared and lost) or not checked."""
    return [
        "accepted"
        if i in accepted
        else "rejected"
        if verify is not None and (p == -1 or p in accepted)
        else "not checked"
        for i, p in enumerate(draft.parents)
    ]


def candidate_grid(
    events: Sequence[Event], texts: Mapping[int, str], step: int
) -> CandidateGrid | None:
    """The candidates the verification branch checked at `step` as cells: one row per path of the
    trie (shared prefixes are one node, verified once), x, then each token's verdict. None when
    the step has no pool, or no pool n-gram to verify."""
    pool = _at(events, NgramPool, step)
    draft = _at(events, Draft, step)
    verify = _at(events, Verify, step)
    paths = _trie_paths(draft.parents) if draft is not None else []
    if pool is None or draft is None or not paths:
        return None
    x_id, _ = _root_token(events, step)
    n = len(draft.tokens)
    accepted = [a for a in (verify.accepted if verify is not None else ()) if 0 <= a < n]
    status = _node_status(draft, verify, set(accepted))
    depth = max(len(p) for p in paths)
    code = _codes(CANDIDATE_STATUS)
    root: Cell = (
        code["root"],
        "x " + _cell_label(texts.get(x_id, "?"), depth + 1) if x_id is not None else "x",
        f"{_tok(texts, x_id)}<br>x: the last committed token",
    )
    rows: list[list[Cell]] = []
    for r, path in enumerate(paths):
        cells = [root]
        for d in range(1, depth + 1):
            if d > len(path):
                cells.append(EMPTY)
                continue
            node = path[d - 1]
            s, t = status[node], draft.tokens[node]
            hover = f"{_tok(texts, t)}<br>{s}<br>candidate {r + 1} · depth {d} · trie node {node}"
            cells.append((code[s], _cell_label(texts.get(t, "?"), depth + 1), hover))
        rows.append(cells)
    return CandidateGrid(
        step=step,
        cells=_cells(rows),
        depth=depth,
        accepted=len(accepted),
        hits=pool.hits,
        x_text=_x_text(events, texts, step),
    )
