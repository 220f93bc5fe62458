"""The draft token tree of one decoding step, as a Plotly figure. Pure: events in, Figure out.

A tree drafter proposes many continuations at once; the picture shows which branch the target
took (bold green path, ending in its own correction or bonus token), which siblings it compared
and turned down (red), and which nodes were never checked because an ancestor lost (grey).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import Commit, Draft, Event, Prefill, Verify

from .figures import SUBTITLE_CHARS, TITLE_CHARS, _base_layout, _empty
from .text import cut, short_token, token_hover, visible, wrap
from .tokens import COLOURS, LABELS

EDGE_COLOUR = "#b0bec5"
PATH_COLOUR = "#1b5e20"
COPY_COLOUR = "#8e24aa"  # the outline of a node on the chain copied from the context
# Legend order and wording; the colour keys are the shared colour language in tokens.py.
STATUS_STYLE: dict[str, tuple[str, str]] = {  # status -> (COLOURS key, legend label)
    "root": ("target", "root (last committed token)"),
    "accepted": ("draft", LABELS["draft"]),
    "relaxed": ("relaxed", LABELS["relaxed"]),
    "rejected": ("rejected", LABELS["rejected"]),
    "not checked": ("pending", "not checked (an ancestor was rejected)"),
    "after the end": ("pending", "never written (after the accepted end token)"),
    "correction": ("correction", LABELS["correction"]),
    "bonus": ("bonus", LABELS["bonus"]),
}
PX_PER_LEAF = 28  # a node's box is ~20 px tall: leaves never touch
MARGINS_PX = 150  # title strip on top, the depth axis and the legend below
MIN_HEIGHT, MAX_HEIGHT = 280, 1600
# Nodes drawn at most (each is a Plotly annotation: thousands make the page crawl): the first ones
# in index order (parents come first, so they form a tree) and the accepted path.
MAX_NODES = 200
# Node labels: ~6.5 px a character at the 10 px monospace font, plus the box's padding and a gap.
CHAR_PX, BOX_PX = 6.5, 24
LABEL_MIN, LABEL_MAX = 3, 16  # a label is cut to fit, never below 3 characters, never above 16
PLOT_MARGINS_PX = 40  # the figure's left and right margins around the plot area (20 px each)
DEFAULT_WIDTH_PX = 330  # plot width when the page has not said (a 390 px phone's)


def check_parents(parents: Sequence[int]) -> None:
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent must come before its child (or be -1)")


def drawn_nodes(
    parents: Sequence[int], accepted: Sequence[int], limit: int = MAX_NODES
) -> list[int]:
    """The nodes to draw, in index order: all of them, or for a big tree the first `limit` and
    the accepted path with its ancestors (a valid parent array stays a tree: parents come first)."""
    if len(parents) <= limit:
        return list(range(len(parents)))
    keep = set(range(limit))
    for a in accepted:
        while a >= 0 and a not in keep:
            keep.add(a)
            a = parents[a]
    return sorted(keep)


def tree_layout(parents: Sequence[int]) -> list[tuple[float, float]]:
    """(x, y) for the root (first entry) and then each node of a parent array.

    x is the depth (root 0), so a branch reads left to right like text; leaves take y = 0, 1, 2, …
    in depth-first order (children in index order) and each internal node sits at the mean y of
    its children, so no two subtrees overlap and every parent is level with its family.
    """
    n = len(parents)
    check_parents(parents)
    children: list[list[int]] = [[] for _ in range(n + 1)]  # slot 0 is the root, node i is i + 1
    depth = [0] * (n + 1)
    for i, p in enumerate(parents):
        children[p + 1].append(i + 1)
        depth[i + 1] = depth[p + 1] + 1
    y = [0.0] * (n + 1)
    next_leaf = 0
    stack = [0]
    while stack:  # iterative pre-order walk: deep chains cannot hit the recursion limit
        v = stack.pop()
        if not children[v]:
            y[v] = float(next_leaf)
            next_leaf += 1
        stack.extend(reversed(children[v]))
    for v in range(n, -1, -1):  # children have larger indices than their parents
        if children[v]:
            y[v] = sum(y[c] for c in children[v]) / len(children[v])
    return [(float(d), yy) for d, yy in zip(depth, y, strict=True)]


def column_layout(lengths: Sequence[int], width_px: int) -> tuple[int, list[float], float]:
    """Size the depth columns to their labels: `lengths[d]` is the longest label (in characters)
    at depth d. Returns the characters a label may show (as many as the widest needs when every
    column fits in `width_px`, the figure's width, else the most that fits), each column's centre
    and the columns' total width, in pixels of a plot as wide as its columns."""
    room = max(width_px - PLOT_MARGINS_PX, 1)

    def need(limit: int) -> list[float]:
        return [min(n, limit) * CHAR_PX + BOX_PX for n in lengths]

    limit = min(LABEL_MAX, max(lengths, default=LABEL_MIN))
    while limit > LABEL_MIN and sum(need(limit)) > room:
        limit -= 1
    widths = need(max(limit, LABEL_MIN))
    centres, left = [], 0.0
    for w in widths:
        centres.append(left + w / 2)
        left += w
    return max(limit, LABEL_MIN), centres, left


def _p(probs: Sequence[float], i: int) -> str:
    return f"{probs[i]:.3f}" if 0 <= i < len(probs) else "—"


def copied_chain(draft: Draft) -> tuple[list[int], list[int]]:
    """The copied branch: (the nodes the drafter had proposed too, the copy's own nodes)."""
    own = list(draft.copied)
    shared: list[int] = []
    node = draft.parents[own[0]] if own else -1
    while node >= 0:
        shared.append(node)
        node = draft.parents[node]
    return shared[::-1], own


def which_branch_won(draft: Draft, accepted: Sequence[int]) -> str:
    """Which branch the target took, when the tree holds a copied chain: the copy, the drafter's,
    or both (the drafter had proposed the copied tokens it accepted)."""
    if not draft.copied:
        return ""
    shared, own = copied_chain(draft)
    took_own = [a for a in accepted if a in set(own)]
    took_shared = [a for a in accepted if a in set(shared)]
    if len(own) == len(draft.tokens):
        return (
            f"the copied chain alone (the drafter skipped): {len(took_own)} of {len(own)} accepted"
        )
    if took_own:
        n = len(took_own) + len(took_shared)
        return f"the copied branch won: {n} accepted token{'s' if n != 1 else ''} copied from the context"
    if took_shared:
        return f"the drafter and the copy agreed on {len(took_shared)} accepted"
    if not accepted:
        return "neither branch's first token was accepted"
    return "the drafter's branch won; the copied branch was rejected"


def _root_token(events: Sequence[Event], step: int) -> tuple[int | None, str]:
    """The token the tree hangs from: the last one committed before `step`, else the prompt's last.
    Returns (token id or None, its target probability as text)."""
    root: tuple[int | None, str] = (None, "—")
    for e in events:
        if isinstance(e, Prefill) and e.prompt_ids and root[0] is None:
            root = (e.prompt_ids[-1], "—")
    for e in events:
        if isinstance(e, Commit) and e.step < step and e.tokens:
            root = (e.tokens[-1], _p(e.probs, len(e.tokens) - 1))
    return root


def token_tree(
    events: Sequence[Event],
    texts: Mapping[int, str],
    step: int,
    width: int | None = None,
) -> go.Figure:
    """The draft tree at `step`, laid out by depth, nodes coloured by what verification made of
    them, the accepted path bold. Hover: token, id, status, draft p, target p, depth. `width`:
    the figure's width in the page, in pixels; each depth's column is as wide as its labels, and
    labels are cut only when the columns would not fit (a phone's width when not given)."""
    title = f"Token tree at step {step}"
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    commit = next((e for e in events if isinstance(e, Commit) and e.step == step), None)
    if draft is None:
        # No room left in the budget, or (size=cost) no node whose chance paid for its input.
        return _empty(title, f"no tree at step {step}: a plain target step")
    if verify is None:
        return _empty(title, f"the draft at step {step} has not been verified (yet)")

    n = len(draft.tokens)
    if len(draft.parents) != n:
        return _empty(title, f"malformed draft: {n} tokens but {len(draft.parents)} parents")
    accepted = [a for a in verify.accepted if 0 <= a < n]
    accepted_set = set(accepted)
    relaxed = set(getattr(verify, "relaxed", ()))
    # An accepted end token ended the output: nothing below it was compared (no correction).
    end = accepted[-1] if accepted and verify.correction is None else None
    status: list[str] = []
    for i, p in enumerate(draft.parents):
        if i in accepted_set:
            status.append("relaxed" if i in relaxed else "accepted")
        elif end is not None and p == end:
            status.append("after the end")
        elif p == -1 or p in accepted_set:
            status.append("rejected")  # compared with the target's choice and lost
        else:
            status.append("not checked")

    # The target's own token after the accepted path, unless the budget/EOS cut the commit short.
    extra: tuple[int, str, str] | None = None  # (token, origin, target p)
    if commit is not None and len(commit.tokens) > len(accepted):
        origin = commit.origins[-1] if commit.origins else "correction"
        extra = (commit.tokens[-1], origin, _p(commit.probs, len(commit.tokens) - 1))
    try:
        check_parents(draft.parents)
    except ValueError as exc:
        return _empty(title, f"malformed draft tree: {exc}")
    # A big tree is drawn in part; slot k + 1 in the layout is node shown[k].
    shown = drawn_nodes(draft.parents, accepted)
    slot = {i: k + 1 for k, i in enumerate(shown)}
    m = len(shown)
    extra_parent = accepted[-1] if accepted else -1
    parents = [slot.get(draft.parents[i], 0) - 1 for i in shown]
    parents += [slot.get(extra_parent, 0) - 1] if extra else []
    pos = tree_layout(parents)

    root_id, root_p = _root_token(events, step)
    # One row per drawn node: (slot in `pos`, node index, token id, status, draft p, target p).
    nodes: list[tuple[int, int, int | None, str, str, str]] = [
        (0, -1, root_id, "root", "—", root_p)
    ]
    for i in shown:
        t = draft.tokens[i]
        nodes.append((slot[i], i, t, status[i], _p(draft.probs, i), _p(verify.target_probs, i)))
    if extra:
        kind = extra[1] if extra[1] in ("correction", "bonus") else "correction"
        nodes.append((m + 1, n, extra[0], kind, "—", extra[2]))
    # Each depth's column as wide as its longest label: whole tokens where the width allows.
    depth_of = [int(d) for d, _ in pos]
    lengths = [0] * (max(depth_of) + 1)
    for r in nodes:
        shown_text = visible(texts.get(r[2], "?")) if r[2] is not None else "root"
        lengths[depth_of[r[0]]] = max(lengths[depth_of[r[0]]], len(shown_text))
    limit, centres, span = column_layout(lengths, width or DEFAULT_WIDTH_PX)
    pos = [(centres[d], y) for d, (_, y) in zip(depth_of, pos, strict=True)]
    committed_upto = len(commit.tokens) if commit is not None else len(accepted)
    copied = {i for part in copied_chain(draft) for i in part}
    own = dict(zip(verify.relaxed, verify.preferred, strict=False))  # relaxed node -> target's
    path_slots = [0, *(slot[a] for a in accepted), *([m + 1] if extra else [])]
    on_path = set(path_slots)

    fig = go.Figure()
    ex: list[float | None] = []
    ey: list[float | None] = []
    for child, parent in enumerate(parents):
        ex += [pos[parent + 1][0], pos[child + 1][0], None]
        ey += [pos[parent + 1][1], pos[child + 1][1], None]
    fig.add_trace(
        go.Scatter(
            x=ex,
            y=ey,
            mode="lines",
            line=dict(width=1, color=EDGE_COLOUR),
            hoverinfo="skip",
            showlegend=False,
            name="edges",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[pos[s][0] for s in path_slots],
            y=[pos[s][1] for s in path_slots],
            mode="lines",
            line=dict(width=4, color=PATH_COLOUR),
            hoverinfo="skip",
            showlegend=False,
            name="accepted path",
        )
    )

    n_leaves = int(max(y for _, y in pos)) + 1  # leaves sit at y = 0, 1, …; parents in between
    height = min(MAX_HEIGHT, max(MIN_HEIGHT, PX_PER_LEAF * n_leaves + MARGINS_PX))
    if (width or DEFAULT_WIDTH_PX) < 500:  # a phone: the legend takes a row per entry, and the
        # subtitle wraps onto more lines; without room for them the tree was squashed to 90 px
        legend = len({r[3] for r in nodes}) + bool(draft.copied)
        height += 20 * legend + 40
    font = 10 if (height - MARGINS_PX) / n_leaves >= 20 else 8  # a huge tree hit the height cap
    # The nodes' boxes, set on the layout at once: Plotly re-validates every annotation the
    # figure holds on each add_annotation, so adding them one by one costs the square of their
    # number (a 200-node tree took 10 s to draw).
    boxes: list[dict] = []
    for st, (colour_key, label) in STATUS_STYLE.items():
        rows = [r for r in nodes if r[3] == st]
        if not rows:
            continue
        hover = []
        for slot, idx, tok, _, dp, tp in rows:
            text = texts.get(tok, "?") if tok is not None else "?"
            note = ""
            if st in ("accepted", "relaxed") and accepted.index(idx) >= committed_upto:
                note = " (not committed: the length budget or EOS came first)"
            if idx in copied:
                note += " · copied from the context"
            if idx in own:
                note += f" · the target's own choice: {texts.get(own[idx], '?')!r}"
            hover.append(
                f"{token_hover(text, tok)}"
                f"<br>{st}{note}<br>draft p: {dp} · target p: {tp}"
                f"<br>depth {depth_of[slot]}"
                + ("" if idx < 0 else f" · node {idx}" if idx < n else " · target's token")
            )
        labels = [
            short_token(texts.get(r[2], "?"), limit) if r[2] is not None else "root" for r in rows
        ]
        # The legend entry, the hover target and the data of each node; the box drawn over it is
        # an annotation, which Plotly sizes to its text (a marker is a fixed-size square).
        fig.add_trace(
            go.Scatter(
                x=[pos[r[0]][0] for r in rows],
                y=[pos[r[0]][1] for r in rows],
                mode="markers",
                marker=dict(symbol="square", size=12, color=COLOURS[colour_key]),
                text=labels,
                customdata=[r[1] for r in rows],  # node index: -1 root, n the target's token
                hovertext=hover,
                hoverinfo="text",
                name=label,
            )
        )
        for r, text, h in zip(rows, labels, hover, strict=True):
            boxes.append(
                dict(
                    x=pos[r[0]][0],
                    y=pos[r[0]][1],
                    text=text,
                    showarrow=False,
                    bgcolor=COLOURS[colour_key],
                    bordercolor=COPY_COLOUR
                    if r[1] in copied
                    else PATH_COLOUR
                    if r[0] in on_path
                    else "#90a4ae",
                    borderwidth=3 if r[1] in copied else 2 if r[0] in on_path else 1,
                    borderpad=3,
                    font=dict(size=font, family="ui-monospace, SFMono-Regular, Menlo, monospace"),
                    hovertext=h,
                    name=f"node {r[1]}",
                )
            )
    fig.update_layout(annotations=[*fig.layout.annotations, *boxes])

    if copied:  # the outline's legend entry
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                # an open symbol is drawn in the marker's colour, not its line's
                marker=dict(symbol="square-open", size=12, color=COPY_COLOUR, line=dict(width=3)),
                name="copied from the context (outline)",
            )
        )
    fig.update_xaxes(
        title_text="depth",
        tickvals=centres,
        ticktext=[str(d) for d in range(len(centres))],
        range=[0, span],
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(visible=False, range=[n_leaves - 0.5, -0.5])  # first leaf on top
    # The title names the drafter (cut to fit a phone); the full source, anything grafted on and
    # the verdict go in the subtitle.
    first, *rest = draft.source.split(" + ")
    title = f"Step {step}: token tree from "
    room = TITLE_CHARS - len(title)
    title += cut(first, room)
    verdict = f"{n} node{'s' if n != 1 else ''}, accepted {len(accepted)}" + (
        f", +1 {nodes[-1][3]}" if extra else ""
    )
    if m < n:
        verdict += f"; {m} drawn (the first ones and the accepted path)"
    won = which_branch_won(draft, accepted)
    if won:
        verdict += f"; {won}"
    source = " + ".join(rest if len(first) <= room else [first, *rest])
    subtitle = wrap(f"{source}; {verdict}" if source else verdict, SUBTITLE_CHARS)
    fig = _base_layout(fig, title, height=height, subtitle=subtitle)
    return fig.update_layout(margin=dict(l=PLOT_MARGINS_PX - 20))  # no y axis: room for columns
