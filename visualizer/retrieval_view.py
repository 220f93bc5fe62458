"""Where a retrieved or recycled draft came from (sam, recycling, token_tree's branches).

- `retrieval`: SAM-Decoding's source at a step. From the context: prompt lookup's context panel
  (the earlier occurrence of the matched suffix, in the prompt or the output, and what was copied).
  From the datastore: the matched suffix, how often the datastore holds it, and the retrieved
  continuations with their counts, coloured by the target's verdict.
- `adjacency`: the rows of Token Recycling's matrix a draft was read from (a row = a token and
  its successors as the target ranked them), the cells the draft used coloured by the verdict.
Pure: events in, Figure out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from decoders.core.events import CopySource, Draft, Event, Recycled, StoreMatch, Verify

from .figures import NOTE_LINE_PX, SUBTITLE_CHARS, _base_layout, _empty, legend_square, rank_axis
from .prompt_lookup_view import context_at, copy_source
from .text import cut, escape, short_token, token_hover, visible, wrap
from .tokens import COLOURS

STATUS = {  # fill, legend
    "accepted": (COLOURS["draft"], "drafted, accepted"),
    "rejected": (COLOURS["rejected"], "drafted, rejected"),
    "not checked": (COLOURS["pending"], "drafted, not checked"),
    "unused": ("#ffffff", "not drafted"),
}
EDGE = "#90a4ae"
MAX_ROWS = 12
NARROWEST_PX = 330  # the figure's width on a 390 px phone
SUFFIX_SHOWN = 8  # tokens of a long matched suffix shown (the rest is "…")
LABEL_CHARS = 22  # a drafted path's label, its end kept: fits beside its bar on a 390 px phone
ROW_PX = 40  # an adjacency row: a 34 px cell and its gap
MIN_CHARS = 4  # an adjacency cell's label below this many characters reads as letters, not a token


def _at(events: Sequence[Event], step: int, kind: type) -> Event | None:
    return next((e for e in events if isinstance(e, kind) and e.step == step), None)


def node_status(draft: Draft, verify: Verify | None) -> list[str]:
    """Each draft node's fate: accepted, rejected (compared with the target's token and lost),
    or not checked (an ancestor was rejected, or the output ended)."""
    accepted = set(verify.accepted) if verify is not None else set()
    out = []
    for i, parent in enumerate(draft.parents):
        if i in accepted:
            out.append("accepted")
        elif verify is not None and (parent == -1 or parent in accepted):
            out.append("rejected")
        else:
            out.append("not checked")
    return out


def retrieval(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Where the step's retrieved draft came from (see the module doc)."""
    copied = _at(events, step, CopySource)
    if copied is not None:
        fig = copy_source(events, texts, step)
        found = context_at(events, step)
        if found is not None and fig.layout.title.text:
            where = "prompt" if copied.start < found[1] else "output"
            fig.update_layout(title_text=f"Step {step}: from the {where}, a match of {copied.n}")
        return fig
    match = _at(events, step, StoreMatch)
    title = f"Step {step}: retrieval"
    if match is None:
        if step == 0:
            return _empty(title, "step 0 is the prefill: the automata read the prompt", 200)
        return _empty(
            title, "no match long enough in the context or the datastore: a plain target step", 200
        )
    draft = _at(events, step, Draft)
    found = context_at(events, step)
    if draft is None or found is None:
        return _empty(title, "this trace lacks the draft or the prompt", 200)
    context = found[0]
    nodes = range(match.first, min(len(draft.tokens), match.first + len(match.counts)))
    status = node_status(draft, _at(events, step, Verify))
    suffix = context[-match.n :]
    shown = suffix[-SUFFIX_SHOWN:]
    suffix_text = ("…" if len(suffix) > len(shown) else "") + "".join(
        visible(texts.get(t, "?")) for t in shown
    )

    def path_text(i: int) -> str:  # plain text: escaped once, where it is shown
        parts = []
        while i >= match.first:
            parts.append(cut(visible(texts.get(draft.tokens[i], "?")), 11))
            i = draft.parents[i]
        return " → ".join(reversed(parts))

    labels = [path_text(i) for i in nodes]
    counts = [match.counts[i - match.first] for i in nodes]
    fig = go.Figure()
    for name, (fill, legend) in STATUS.items():
        rows = [k for k, i in enumerate(nodes) if status[i] == name]
        if not rows:
            continue
        fig.add_trace(
            go.Bar(
                x=[counts[k] for k in rows],
                y=[k for k in rows],
                orientation="h",
                marker=dict(color=fill, line=dict(color=EDGE, width=1)),
                hovertext=[
                    f"{escape(labels[k])}<br>"
                    f"{token_hover(texts.get(draft.tokens[nodes[k]], '?'), draft.tokens[nodes[k]])}"
                    f"<br>continues the match {counts[k]} of {match.occurrences} times"
                    f"<br>{legend}"
                    for k in rows
                ],
                hoverinfo="text",
                name=legend,
            )
        )
    fig.update_yaxes(  # each path's label at its bar's left, its end kept (a phone's width)
        tickmode="array",
        tickvals=list(range(len(labels))),
        ticktext=[
            escape(label if len(label) <= LABEL_CHARS else "…" + label[1 - LABEL_CHARS :])
            for label in labels  # cut before escaping: an entity or a tag is never split
        ],
        tickfont=dict(size=10, family="ui-monospace, Menlo, monospace"),
        fixedrange=True,
        range=[len(labels) - 0.5, -0.5],
    )
    fig.update_xaxes(title_text="times continued this way", fixedrange=True)
    height = 150 + 26 * len(labels)
    subtitle = (
        f"the context's last {match.n} tokens «{escape(suffix_text)}» occur {match.occurrences}× "
        "in the datastore (the model's own writing); its most frequent continuations were drafted"
    )
    return _base_layout(fig, f"Step {step}: from the datastore", height=height, subtitle=subtitle)


@dataclass(frozen=True)
class AdjacencyGrid:
    """What the adjacency view shows at one step: the rows of Token Recycling's matrix the draft
    read (a token, then its successors best first) and each cell's verdict (a STATUS key)."""

    step: int
    rows: list[list[int]]
    status: list[list[str]]  # status[k][c]: successor c + 1 of row k ("unused": not drafted)
    fresh: list[bool]  # per row: rewritten by this run's forwards yet (empty: all of them)
    warm: bool  # the rows not yet rewritten hold the datastore's successors (else the token)
    drafted: int
    accepted: int


def adjacency_grid(events: Sequence[Event], step: int) -> AdjacencyGrid | None:
    """The rows a Token Recycling draft read at `step`, each cell with the verdict of the draft
    node read from it (the best, where several were); None without rows or a draft."""
    recycled = _at(events, step, Recycled)
    draft = _at(events, step, Draft)
    if recycled is None or draft is None:
        return None
    rows = [list(r) for r in recycled.rows[:MAX_ROWS] if len(r) >= 2]
    if not rows:
        return None
    index = {r[0]: k for k, r in enumerate(rows)}
    root = rows[0][0] if rows else None
    status = node_status(draft, _at(events, step, Verify))
    cell: dict[tuple[int, int], str] = {}
    order = ("unused", "not checked", "rejected", "accepted")
    for i, (token, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        row_token = root if parent == -1 else draft.tokens[parent]
        k = index.get(row_token)
        if k is None or token not in rows[k][1:]:
            continue
        key = (k, rows[k][1:].index(token))
        if order.index(status[i]) > order.index(cell.get(key, "unused")):
            cell[key] = status[i]
    return AdjacencyGrid(
        step=step,
        rows=rows,
        status=[
            [cell.get((k, c), "unused") for c in range(len(r) - 1)] for k, r in enumerate(rows)
        ],
        fresh=list(recycled.refreshed),
        warm=recycled.warm,
        drafted=len(draft.tokens),
        accepted=sum(s == "accepted" for s in status),
    )


def _no_adjacency(events: Sequence[Event], step: int) -> str:
    """Why there are no adjacency rows to draw at `step`."""
    if _at(events, step, Recycled) is None:
        if step == 0:
            return "step 0 is the prefill: the first token comes from the target"
        return "nothing recycled at this step: a plain target step"
    if _at(events, step, Draft) is None:
        return "this trace lacks the step's draft"
    return "this step's recorded rows are empty"


def _cell_sizes(width: int | None, columns: int) -> tuple[int, int]:
    """A cell's marker size and the characters its label holds, in a figure `width` px wide (a
    phone's when not given): the plot beside the row labels (about 120 px) shared by the columns."""
    cell_px = (max(int(width), NARROWEST_PX) if width else NARROWEST_PX) - 120
    cell_px = cell_px / max(columns, 1)
    size = max(14, min(34, int(cell_px) - 3))
    chars = max(2, min(6, int((cell_px - 4) / 6.5)))
    return size, chars


def _fit_columns(g: AdjacencyGrid, width: int | None) -> tuple[int, int, int]:
    """(columns drawn, cell size, label characters): every successor rank where a cell's label
    holds MIN_CHARS characters; on a narrower figure (a phone) only the ranks up to the last one
    the draft read (at least 3), so the labels stay words rather than two letters."""
    columns = max(len(r) - 1 for r in g.rows)
    size, chars = _cell_sizes(width, columns)
    if chars < MIN_CHARS:
        used = [c + 1 for row in g.status for c, st in enumerate(row) if st != "unused"]
        columns = min(columns, max(3, *used) if used else 3)
        size, chars = _cell_sizes(width, columns)
    return columns, size, chars


def _adjacency_cells(
    g: AdjacencyGrid, texts: Mapping[int, str], size: int, chars: int, columns: int
) -> go.Scatter:
    """Every row's successors (the first `columns` ranks) as squares filled by their verdict,
    labelled; where a label would hold fewer than MIN_CHARS characters only the drafted cells
    are (the hover, or a tap, names every cell's token)."""
    xs, ys, text, hover, fills = [], [], [], [], []
    for k, row in enumerate(g.rows):
        for c, t in enumerate(row[1 : columns + 1]):
            st = g.status[k][c]
            xs.append(c + 1)
            ys.append(k)
            labelled = chars >= MIN_CHARS or st != "unused"
            text.append(short_token(texts.get(t, "?"), chars) if labelled else "")
            fills.append(STATUS[st][0])
            hover.append(
                f"{token_hover(texts.get(t, '?'), t)}<br>successor {c + 1} of "
                f"{escape(visible(texts.get(row[0], '?')))}<br>{STATUS[st][1]}"
            )
    return go.Scatter(
        x=xs,
        y=ys,
        mode="markers+text",
        marker=dict(symbol="square", size=size, color=fills, line=dict(color=EDGE, width=1)),
        text=text,
        textfont=dict(size=10, family="ui-monospace, Menlo, monospace"),
        hovertext=hover,
        hoverinfo="text",
        showlegend=False,
    )


def adjacency(
    events: Sequence[Event], texts: Mapping[int, str], step: int, width: int | None = None
) -> go.Figure:
    """The adjacency rows a Token Recycling draft read, cells coloured by the verdict. `width`:
    the figure's width in the page; cells and their labels are sized to it (a phone's when not
    given)."""
    title = f"Step {step}: the adjacency rows read"
    g = adjacency_grid(events, step)
    if g is None:
        return _empty(title, _no_adjacency(events, step), 200)
    ranks = max(len(r) - 1 for r in g.rows)
    columns, size, chars = _fit_columns(g, width)
    fig = go.Figure()
    fig.add_trace(_adjacency_cells(g, texts, size, chars, columns))
    used = {s for row in g.status for s in row}
    for name, (fill, legend) in STATUS.items():
        if name != "unused" and name in used:
            legend_square(fig, fill, legend, EDGE)
    fresh = g.fresh or [True] * len(g.rows)
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(g.rows))),
        ticktext=[
            short_token(texts.get(r[0], "?"), 8)
            + ("" if k >= len(fresh) or fresh[k] else " ·warm" if g.warm else " ·empty")
            for k, r in enumerate(g.rows)
        ],
        range=[len(g.rows) - 0.5, -0.5],
        fixedrange=True,
        showgrid=False,
    )
    rank_axis(fig, columns, "successor rank")
    stale = sum(not f for f in fresh[: len(g.rows)])
    start = "the datastore's warm start (·warm)" if g.warm else "empty: the token itself (·empty)"
    subtitle = (
        f"row = a token, then the successors the target ranked likeliest after it when it last "
        f"saw it; {g.drafted} drafted, {g.accepted} accepted"
        + (f"; {stale} row(s) not yet rewritten by this run, still {start}" if stale else "")
        + (f"; ranks {columns + 1}–{ranks} (not drafted) not drawn" if columns < ranks else "")
    )
    subtitle = wrap(subtitle, SUBTITLE_CHARS)
    # the rows keep their pitch (a cell is a square) whatever the subtitle's lines take
    height = ROW_PX * len(g.rows) + 110 + NOTE_LINE_PX * (subtitle.count("<br>") + 1)
    return _base_layout(fig, title, height=height, subtitle=subtitle)
