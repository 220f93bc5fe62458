"""The block drafter's one pass at a step (block_draft). Pure: events in, Figure out.

`block_fill`: one row per draft position, one column per rank: every cell came out of the same
drafter forward. Cells the draft used take the verdict's colour (accepted green, compared and lost
red, never checked grey), cells it left out stay white; the bar along each cell's foot is the
position's confidence; an outline marks the target's own token where the block had it among its
candidates. Grown as a tree (the default), a node at depth d is one of position d's candidates,
so several nodes may share a cell (it takes the best verdict among them). The subtitle says what
the forward cost beside what a chain drafter (the EAGLE chain) pays for a draft as deep: one head
forward per token, one after another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import BlockFill, Event, Forward
from decoders.core.tree import depths

from .figures import _base_layout, _empty
from .medusa_view import MARGINS_PX, ROW_PX, _root_label, _step_events, guesses_grid, heads_data


def _draft_forward(events: Sequence[Event], step: int) -> Forward | None:
    return next(
        (e for e in events if isinstance(e, Forward) and e.step == step and e.kind == "draft"),
        None,
    )


def block_fill(
    events: Sequence[Event], texts: Mapping[int, str], step: int, width: int | None = None
) -> go.Figure:
    """The block the drafter filled at `step` in one forward, coloured by the verdict."""
    title = f"Step {step}: the block, filled in one forward"
    proposals, draft, verify, commit = _step_events(events, step, BlockFill)
    if proposals is None:
        if step == 0:
            why = "step 0 is the prefill: it gives the block head its first features"
        elif any(isinstance(e, BlockFill) for e in events):
            why = f"no block at step {step}: a plain target step (the budget's last token)"
        else:
            why = "this trace has no block detail (recorded without it)"
        return _empty(title, why, 220)
    data = heads_data(proposals, draft, verify, commit)
    if data is None:
        return _empty(title, "malformed block: tokens and probabilities differ in shape")
    fig = guesses_grid(data, texts, width, "position")
    drafted = len(draft.tokens) if draft is not None else 0
    copied = len(draft.copied) if draft is not None else 0
    deep = 1 + max(depths(draft.parents), default=-1) if draft is not None else 0
    forward = _draft_forward(events, step)
    inputs = f" over {forward.n_input_tokens} inputs" if forward is not None else ""
    if deep > 1:
        chain = f"a chain drafter pays {deep} head forwards in a row for a draft {deep} deep"
    elif deep == 1:
        chain = "a chain drafter pays the same for one token"
    else:
        chain = "no position was sure enough to pay for its input"
    if drafted > deep:  # a tree: nodes at depth d are position d's candidates
        shape = f"a tree of {drafted} nodes, {deep} deep"
        if copied:
            shape += f" ({copied} copied by prompt lookup, from no forward)"
        verified = f"{shape}, verified"
    else:
        verified = f"{drafted} verified"
    after = _root_label(events, texts, step, "the root")
    subtitle = (
        f"row i: position i's candidates for the token i after {after}, all from 1 drafter "
        f"forward{inputs}; {verified}, {data.accepted} accepted; {chain}; bar: the "
        "position's confidence"
    )
    height = min(900, MARGINS_PX + ROW_PX * len(data.heads))
    return _base_layout(fig, title, height=height, subtitle=subtitle)
