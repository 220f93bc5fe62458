"""Jacobi and Lookahead decoding as Plotly figures. Pure: events + token texts in, Figure out.

- `jacobi_trajectory`: the guessed block, iteration by iteration: which guesses the last forward
  changed, which stood still, which converged (accepted), and where each row's fixed point ends.
- `lookahead_window`: Lookahead's 2D window (Jacobi levels × window positions) at one step, with
  the columns whose n-grams entered the pool.
- `ngram_pool`: the most-hit n-grams, and the candidate n-grams the verify branch checked.
- `attention_mask`: the real attention pattern among one forward's new inputs, by branch.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from decoders.events import (
    AttentionMask,
    Commit,
    Draft,
    Event,
    JacobiIteration,
    LookaheadWindow,
    NgramPool,
    Verify,
)
from decoders.tree import depths, leaf_paths

from .figures import _base_layout, _empty
from .tokens import COLOURS, LABELS
from .tree_view import _label, _root_token

BOUNDARY_COLOUR = "#1b5e20"  # the accepted path / fixed-point boundary, as in the tree view
SEPARATOR_COLOUR = "#37474f"
MAX_ITERATIONS = 16  # Jacobi rows shown: the last ones up to the selected step

# status -> (colour, legend label); the index of a status is its heatmap code.
JACOBI_STATUS: dict[str, tuple[str, str]] = {
    "unchanged": (COLOURS["target"], "unchanged since the previous iteration"),
    "changed": (COLOURS["correction"], "changed by the previous forward"),
    "converged": (COLOURS["draft"], "converged: accepted by the target"),
}
WINDOW_STATUS: dict[str, tuple[str, str]] = {
    "history": (COLOURS["target"], "Jacobi history (a level of the window)"),
    "guess": (COLOURS["bonus"], "new guess (the target's output on top of a column)"),
    "added": (COLOURS["draft"], "column's n-gram added to the pool this step"),
}
CANDIDATE_STATUS: dict[str, tuple[str, str]] = {
    "root": (COLOURS["target"], "x (last committed token)"),
    "accepted": (COLOURS["draft"], LABELS["draft"]),
    "rejected": (COLOURS["rejected"], LABELS["rejected"]),
    "not checked": (COLOURS["pending"], "not checked (an ancestor was rejected)"),
}
MASK_BRANCH: dict[str, tuple[str, str]] = {
    "masked": ("#f5f5f5", "not visible"),
    "x": ("#78909c", "x (last committed token)"),
    "lookahead": ("#64b5f6", "lookahead branch (Jacobi window)"),
    "verify": ("#66bb6a", "verification branch (candidate n-grams)"),
    "other": ("#ce93d8", "other input"),
}
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
    return f"{html.escape(repr(texts.get(t, '?')), quote=False)} · id {t}"


def _gram(gram: Sequence[int], texts: Mapping[int, str], limit: int = 40) -> str:
    """An n-gram as one escaped label: token texts joined by '|', whitespace made visible."""
    shown = "|".join(texts.get(t, "?").replace("\n", "↵").replace("\t", "⇥") for t in gram)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=False)


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


def jacobi_trajectory(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The Jacobi block, one row per iteration (the last 16 up to `step`), one column per block
    position. A cell is the guess fed at that iteration: orange when it differs from the previous
    iteration's guess for the same position, grey when it stood still, green when the target
    accepted it (the converged prefix); a dark bar marks where each row's fixed point ends. After
    each commit the block re-anchors: position 0 is always the first token not yet committed."""
    title = f"Jacobi iterations up to step {step}"
    its = [e for e in events if isinstance(e, JacobiIteration) and e.step <= step]
    if not its:
        return _empty(
            title, "no Jacobi iteration yet: step 0 is the prefill, each later step one iteration"
        )
    verifies = {e.step: e for e in events if isinstance(e, Verify)}
    commits = {e.step: e for e in events if isinstance(e, Commit)}
    first = max(0, len(its) - MAX_ITERATIONS)
    shown = its[first:]
    m = max(1, *(len(it.tokens) for it in shown))
    code = _codes(JACOBI_STATUS)

    def n_accepted(it: JacobiIteration) -> int:
        v = verifies.get(it.step)
        return len(v.accepted) if v is not None and it.tokens else 0

    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    rows: list[float] = []
    ticks: list[str] = []
    bx: list[float | None] = []
    by: list[float | None] = []
    for k, it in enumerate(shown, start=first):
        a = n_accepted(it)
        commit = commits.get(it.step)
        committed = len(commit.tokens) if commit is not None else 0
        before = its[k - 1] if k > 0 else None
        # jacobi.py: the next block is the outputs after the committed ones, so the previous
        # iteration's guess for position i sat at position (its accepted count + 1 + i).
        shift = n_accepted(before) + 1 if before is not None else 0
        y = float(it.iteration)
        rows.append(y)
        ticks.append(f"iteration {it.iteration} · +{committed}")
        zr: list[int | None] = []
        tr: list[str] = []
        hr: list[str] = []
        for i in range(m):
            if i >= len(it.tokens):
                zr.append(None)
                tr.append("")
                hr.append("")
                continue
            t = it.tokens[i]
            changed = it.changed[i] if i < len(it.changed) else True
            status = "converged" if i < a else "changed" if changed else "unchanged"
            zr.append(code[status])
            tr.append(_label(texts.get(t, "?")))
            was = ""
            if changed and before is not None and shift + i < len(before.tokens):
                was = f" (was {_tok(texts, before.tokens[shift + i])})"
            hr.append(
                f"{_tok(texts, t)}<br>{status}{was}<br>iteration {it.iteration} · block position {i}"
                " (relative to the next uncommitted token)"
                f"<br>step {it.step}: {a} of {len(it.tokens)} guesses accepted, {committed} committed"
            )
        z.append(zr)
        text.append(tr)
        hover.append(hr)
        if it.step in verifies and it.tokens:
            bx += [a - 0.5, a - 0.5, None]
            by += [y - 0.5, y + 0.5, None]

    fig = go.Figure()
    fig.add_trace(
        _heatmap(
            z,
            JACOBI_STATUS,
            x=range(m),
            y=rows,
            text=text,
            hover=hover,
            name="guesses",
            font_size=11 if m <= 10 else 9 if m <= 16 else 7,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=bx,
            y=by,
            mode="lines",
            line=dict(width=4, color=BOUNDARY_COLOUR),
            name="fixed point ends (after the accepted prefix)",
            hoverinfo="skip",
        )
    )
    used = {s for row in z for s in row if s is not None}
    for status, (colour, label) in JACOBI_STATUS.items():
        if code[status] in used:
            fig.add_trace(_swatch(colour, label))
    fig.update_xaxes(
        title_text="block position (relative to the next uncommitted token; re-anchored after each commit)",
        tickvals=list(range(m)),
        range=[-0.5, m - 0.5],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickvals=rows,
        ticktext=ticks,
        autorange="reversed",  # the newest iteration at the bottom, like reading down a log
        showgrid=False,
        zeroline=False,
        automargin=True,
    )
    last = shown[-1]
    title = (
        f"Step {step}: Jacobi iteration {last.iteration} accepted {n_accepted(last)} of "
        f"{len(last.tokens)} guesses"
        + (f" (last {len(shown)} of {len(its)} iterations)" if first else "")
    )
    return _base_layout(fig, title, height=max(240, 110 + 32 * len(shown)))


jacobi_panel = jacobi_trajectory


# --- Lookahead: the window ------------------------------------------------------------------------


def _ngram_size(events: Sequence[Event]) -> int | None:
    """N, read off the n-grams any step added to the pool (a full window yields N-grams)."""
    for e in events:
        if isinstance(e, NgramPool) and e.added:
            return len(e.added[0])
    return None


def lookahead_window(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Lookahead's 2D window at `step`: level 0 (the oldest Jacobi guesses) at the bottom, each
    level above it one Jacobi iteration newer, and the target's new guesses on top. Read bottom to
    top, a column is a run of consecutive positions, so column i plus its new guess is an n-gram;
    the columns whose n-gram entered the pool this step are outlined green."""
    title = f"Lookahead window at step {step}"
    window = _at(events, LookaheadWindow, step)
    if window is None or not window.levels or not window.levels[0]:
        if _at(events, NgramPool, step) is not None:
            return _empty(title, "W = 0: no lookahead window, only n-gram verification")
        note = " (step 0 is the prefill)" if step == 0 else ""
        return _empty(title, f"no lookahead window at step {step}{note}")
    pool = _at(events, NgramPool, step)
    added = set(pool.added) if pool is not None else set()
    levels = window.levels
    n_levels, w = len(levels), len(levels[0])
    outputs = tuple(window.outputs[:w])
    n = _ngram_size(events)
    full = n == n_levels + 1 if n is not None else bool(added)
    x_id, _ = _root_token(events, step)
    code = _codes(WINDOW_STATUS)

    grams = [
        (*(level[i] for level in levels if i < len(level)), outputs[i]) if i < len(outputs) else ()
        for i in range(w)
    ]
    is_added = [bool(g) and g in added for g in grams]
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
            status = "added" if is_added[i] else "guess" if top else "history"
            zr.append(code[status])
            tr.append(_label(texts.get(t, "?")))
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
            fig.add_shape(
                type="rect",
                x0=i - 0.5,
                x1=i + 0.5,
                y0=-0.5,
                y1=n_levels + 0.5,
                line=dict(color=BOUNDARY_COLOUR, width=3),
                fillcolor="rgba(0,0,0,0)",
            )
    used = {s for row in z for s in row if s is not None}
    for status, (colour, label) in WINDOW_STATUS.items():
        if code[status] in used:
            fig.add_trace(_swatch(colour, label))
    ticks = ["level 0 (oldest)" if j == 0 else f"level {j}" for j in range(n_levels)] + [
        "new guesses"
    ]
    note = "column i: level 0 sits at position x+i+1, each level one position further"
    if n is not None and n_levels + 1 < n:
        note = f"warming up ({n_levels} of {n - 1} levels): the window fills one level per step"
    elif n is None and not added:
        note = "no n-grams yet: the window fills one level per step until it holds N − 1"
    fig.update_xaxes(
        title_text=f"window position<br>{note}",
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
    fig.update_layout(margin=dict(b=70))
    title = (
        f"Step {step}: window of {n_levels} level{'s' if n_levels != 1 else ''} × {w} after "
        f"x = {html.escape(repr(texts.get(x_id, '?')), quote=False) if x_id is not None else '?'}"
        f"; {sum(is_added)} new n-gram{'s' if sum(is_added) != 1 else ''} for the pool"
    )
    return _base_layout(fig, title, height=max(240, 150 + 40 * (n_levels + 1)))


# --- Lookahead: the n-gram pool and the candidates checked ----------------------------------------


def _trie_paths(parents: Sequence[int]) -> list[list[int]]:
    """Root-to-leaf paths of the step's trie; none for a malformed parent array (imported trace)."""
    try:
        depths(parents)  # validates: parents come before children
    except ValueError:
        return []
    return leaf_paths(parents)


def _note_in(fig: go.Figure, axis: str, text: str) -> None:
    """A grey note in the middle of an (empty) subplot: axis "" is the first, "2" the second."""
    xd, yd = fig.layout[f"xaxis{axis}"].domain, fig.layout[f"yaxis{axis}"].domain
    fig.add_annotation(
        text=text,
        xref="paper",
        yref="paper",
        x=(xd[0] + xd[1]) / 2,
        y=(yd[0] + yd[1]) / 2,
        showarrow=False,
        font=dict(color="#607d8b"),
    )


def ngram_pool(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Left: the pool's most-hit n-grams as bars (hit counts including this step's check). Right: the
    candidate n-grams the verification branch checked at `step`, one root-to-leaf path of the trie
    per row, each token green (accepted), red (compared and lost) or grey (never compared)."""
    title = f"n-gram pool at step {step}"
    pool = _at(events, NgramPool, step)
    if pool is None:
        note = " (step 0 is the prefill)" if step == 0 else ""
        return _empty(title, f"no n-gram pool at step {step}{note}")
    draft = _at(events, Draft, step)
    verify = _at(events, Verify, step)
    x_id, _ = _root_token(events, step)
    x_text = html.escape(repr(texts.get(x_id, "?")), quote=False) if x_id is not None else "?"

    top = sorted((e for e in pool.top if len(e) >= 2), key=lambda e: -e[0])
    paths = _trie_paths(draft.parents) if draft is not None else []
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        horizontal_spacing=0.2,
        subplot_titles=(
            "most-hit n-grams (hits so far)",
            f"candidates after x = {x_text}",
        ),
    )
    fig.update_annotations(font=dict(size=12, color="#455a64"))  # the subplot titles
    if top:
        fig.add_trace(
            go.Bar(
                x=[e[0] for e in top],
                y=list(range(len(top))),
                orientation="h",
                marker_color="#2e7d32",
                text=[str(e[0]) for e in top],
                textposition="auto",
                customdata=[
                    f"{_gram(e[1:], texts)}<br>ids {', '.join(map(str, e[1:]))}" for e in top
                ],
                hovertemplate="%{customdata}<br>%{x} hits<extra></extra>",
                name="hits",
                showlegend=False,
            ),
            row=1,
            col=1,
        )
        fig.update_yaxes(
            tickvals=list(range(len(top))),
            ticktext=[_gram(e[1:], texts, limit=24) for e in top],
            autorange="reversed",
            automargin=True,
            row=1,
            col=1,
        )
        fig.update_xaxes(
            title_text="hits",
            rangemode="tozero",
            dtick=1 if top[0][0] <= 10 else None,
            row=1,
            col=1,
        )
    else:
        _note_in(fig, "", "no n-gram<br>has been hit yet")  # wrapped: the panel can be narrow
        fig.update_xaxes(visible=False, row=1, col=1)
        fig.update_yaxes(visible=False, row=1, col=1)

    n_acc = 0
    if draft is not None and paths:
        n = len(draft.tokens)
        accepted = [a for a in (verify.accepted if verify is not None else ()) if 0 <= a < n]
        acc = set(accepted)
        n_acc = len(accepted)
        status = [
            "accepted"
            if i in acc
            else "rejected"
            if verify is not None and (p == -1 or p in acc)
            else "not checked"
            for i, p in enumerate(draft.parents)
        ]
        cells: dict[str, list[tuple[int, int, int | None, str, str]]] = {
            s: [] for s in CANDIDATE_STATUS
        }
        for r, path in enumerate(paths):
            cells["root"].append((0, r, x_id, "root", "x: the last committed token"))
            for d, node in enumerate(path, start=1):
                s = status[node]
                cells[s].append(
                    (d, r, draft.tokens[node], s, f"{s}<br>trie node {node} · depth {d}")
                )
        for s, (colour, label) in CANDIDATE_STATUS.items():
            if not cells[s]:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[c[0] for c in cells[s]],
                    y=[c[1] for c in cells[s]],
                    mode="markers+text",
                    marker=dict(
                        symbol="square", size=30, color=colour, line=dict(width=1, color="#90a4ae")
                    ),
                    text=[
                        _label(texts.get(c[2], "?")) if c[2] is not None else "x" for c in cells[s]
                    ],
                    textfont=dict(size=10),
                    hovertext=[f"{_tok(texts, c[2])}<br>{c[4]}" for c in cells[s]],
                    hoverinfo="text",
                    name=label,
                ),
                row=1,
                col=2,
            )
        depth = max(len(p) for p in paths)
        fig.update_xaxes(
            title_text="depth after x",
            dtick=1,
            range=[-0.6, depth + 0.6],
            showgrid=False,
            zeroline=False,
            row=1,
            col=2,
        )
        fig.update_yaxes(
            tickvals=list(range(len(paths))),
            ticktext=[f"candidate {r + 1}" for r in range(len(paths))],
            range=[len(paths) - 0.5, -0.5],
            showgrid=False,
            zeroline=False,
            automargin=True,
            row=1,
            col=2,
        )
    else:
        _note_in(fig, "2", "no pool n-gram starts with x:<br>nothing to verify")
        fig.update_xaxes(visible=False, row=1, col=2)
        fig.update_yaxes(visible=False, row=1, col=2)

    title = (
        f"Step {step}: pool holds {pool.size} n-grams; {pool.hits} candidate"
        f"{'s' if pool.hits != 1 else ''} checked, {n_acc} token{'s' if n_acc != 1 else ''} accepted"
    )
    rows = max(len(top), len(paths), 3)
    height = min(620, max(260, 140 + 34 * rows))
    _base_layout(fig, title, height=height)
    # Legend in its own strip under the title, the subplot titles under it (they would overlap).
    fig.update_layout(
        margin=dict(t=104),
        legend=dict(yref="container", y=1 - 30 / (height + 20), yanchor="top"),
    )
    return fig


# --- Lookahead: the attention mask ----------------------------------------------------------------

_LOOK = re.compile(r"^look L(\d+)")


def _branch(label: str) -> str:
    if label == "x" or label.startswith("x "):
        return "x"
    if label.startswith("look"):
        return "lookahead"
    if label.startswith("verify"):
        return "verify"
    return "other"


def _input_tokens(events: Sequence[Event], step: int, n: int) -> list[int | None]:
    """The step's inputs as lookahead.py lays them out: [x, *window level by level, *trie]; all
    None if that does not add up to the mask's size."""
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
    ids = _input_tokens(events, step, n)
    branches = [_branch(lb) for lb in labels]
    code = _codes(MASK_BRANCH)
    names = [
        html.escape(lb, quote=False)
        + (f" {_label(texts.get(t, '?'))}" if t is not None and n <= 64 else "")
        for lb, t in zip(labels, ids, strict=True)
    ]

    z: list[list[int]] = []
    hover: list[list[str]] = []
    for r in range(n):
        seen = {c for c in (ev.visible[r] if r < len(ev.visible) else ()) if 0 <= c < n}
        z.append([code[branches[r]] if c in seen else code["masked"] for c in range(n)])
        q = f"query {r}: {html.escape(labels[r], quote=False)} {_tok(texts, ids[r])}"
        hover.append(
            [
                f"{q}<br>key {c}: {html.escape(labels[c], quote=False)} {_tok(texts, ids[c])}"
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
    for branch in ("x", "lookahead", "verify", "other", "masked"):
        if branch == "masked" or branch in branches:
            fig.add_trace(_swatch(*MASK_BRANCH[branch]))
    if n <= 64:
        tickvals, ticktext = list(range(n)), names
    else:  # too many to label: name the first input of each branch
        tickvals = [i for i in range(n) if i == 0 or branches[i] != branches[i - 1]]
        ticktext = [names[i] for i in tickvals]
    size = 10 if n <= 24 else 8
    fig.update_xaxes(
        title_text=f"key (the input attended to) · {MASK_NOTE}",
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
    counts = {b: branches.count(b) for b in ("x", "lookahead", "verify")}
    title = (
        f"Step {step}: attention among the forward's {n} new inputs "
        f"({counts['x']} x · {counts['lookahead']} lookahead · {counts['verify']} verify)"
    )
    return _base_layout(fig, title, height=min(900, max(340, 20 * n + 240)))


def lookahead_panel(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Lookahead's method panel: the step's attention mask when the trace has it, else the window."""
    if _at(events, AttentionMask, step) is not None:
        return attention_mask(events, texts, step)
    return lookahead_window(events, texts, step)
