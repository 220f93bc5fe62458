"""The block drafter's one pass at a step (block_draft). Pure: events in, Figure out.

`block_fill`: one row per draft position, one column per rank: every cell came out of the same
drafter forward. Cells the draft used take the verdict's colour (accepted green, compared and lost
red, never checked grey), cells it left out stay white; the bar along each cell's foot is the
position's confidence; an outline marks the target's own token where the block had it among its
candidates. Grown as a tree (the default), a node at depth d is one of position d's candidates,
so several nodes may share a cell (it takes the best verdict among them); a chain copied by prompt
lookup rides beside it with no cell, and the subtitle counts it apart. The subtitle also says what
a chain drafter (the EAGLE chain) pays for a draft as deep as the block's: one forward per token,
one after another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import BlockFill, Draft, Event, Forward, Verify
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
    subtitle = _block_subtitle(events, texts, step, draft, verify, data.accepted)
    height = min(900, MARGINS_PX + ROW_PX * len(data.heads))
    return _base_layout(fig, title, height=height, subtitle=subtitle)


def _block_subtitle(
    events: Sequence[Event],
    texts: Mapping[int, str],
    step: int,
    draft: Draft | None,
    verify: Verify | None,
    accepted: int,
) -> str:
    """What the step's one forward gave, what was verified (the block's own nodes, and a copied
    chain's apart: it came from no forward and has no cell), and what a chain drafter would
    have paid for a draft as deep as the block's."""
    forward = _draft_forward(events, step)
    inputs = f" over {forward.n_input_tokens} inputs" if forward is not None else ""
    after = _root_label(events, texts, step, "the root")
    said = [f"Every cell: 1 drafter forward{inputs} (row i: the token i after {after})."]
    copied = set(draft.copied) if draft is not None else set()
    own = [i for i in range(len(draft.tokens)) if i not in copied] if draft is not None else []
    level = depths(draft.parents) if draft is not None else []
    deep = 1 + max((level[i] for i in own), default=-1)
    kept = set(verify.accepted) if verify is not None else set()
    if not own:
        said.append("No position was sure enough to pay for its input.")
    elif deep < len(own):  # a tree: nodes at depth d are position d's candidates
        said.append(f"Verified: a tree of {len(own)} nodes from these cells, {deep} deep.")
    else:
        said.append(f"Verified: its first {deep} positions as a chain.")
    if copied:
        said.append(
            f"Beside it, {len(copied)} tokens copied by prompt lookup (no forward, no cell); "
            f"{len(kept & copied)} of the {accepted} accepted came from them."
        )
    else:
        said.append(f"{accepted} accepted.")
    if deep > 1:
        said.append(
            f"A chain drafter pays {deep} forwards, one after another, to draft {deep} deep."
        )
    said.append("Bar: the position's confidence.")
    return " ".join(said)
