"""The method-specific panels: each method names, in its declaration, the views that explain its
steps; this module finds them by name (the visualizer imports no engine)."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import Event

from .block_view import block_fill
from .exit_view import catch_ups, exit_confidence, exit_heatmap, hash_layers
from .figures import add_note, draft_panel, topk_panel
from .jacobi_view import jacobi_trajectory
from .kangaroo_view import (
    kangaroo_confidence,
    kangaroo_layers,
    layerskip_confidence,
    layerskip_layers,
)
from .lookahead_views import lookahead_panel, lookahead_window, ngram_pool, pool_candidates
from .mask_predict_view import refinement
from .mask_view import attention_mask
from .medusa_view import blockwise_chain, heads_grid
from .prompt_lookup_view import copy_source
from .retrieval_view import adjacency, retrieval
from .self_speculative_view import self_speculative_panel
from .space_view import relay
from .text import MARK_OPEN, MARKER_NOTE, escape
from .tokens import marked_texts
from .tree_view import token_tree

Panel = Callable[[Sequence[Event], Mapping[int, str], int], go.Figure]

# Every view a method may name in its declaration (`Method.views`: its panel first, then the
# figures drawn under it), by name. A view reads events only.
VIEWS: dict[str, Panel] = {
    f.__name__: f
    for f in (
        topk_panel,
        draft_panel,
        copy_source,
        retrieval,
        adjacency,
        self_speculative_panel,
        token_tree,
        jacobi_trajectory,
        lookahead_panel,
        lookahead_window,
        pool_candidates,
        ngram_pool,
        attention_mask,
        kangaroo_confidence,
        kangaroo_layers,
        layerskip_confidence,
        layerskip_layers,
        heads_grid,
        blockwise_chain,
        block_fill,
        relay,
        refinement,
        exit_heatmap,
        exit_confidence,
        hash_layers,
        catch_ups,
    )
}
# The page (ui/run_tab.py) has this many slots for the figures under a method's panel.
MAX_EXTRA_PANELS = 4


@functools.cache
def _takes_width(view: Panel) -> bool:
    return "width" in inspect.signature(view).parameters


def draw(
    view: Panel,
    events: Sequence[Event],
    texts: Mapping[int, str],
    step: int,
    width: int | None = None,
) -> go.Figure:
    """One view at `step`. A view that sizes its labels to the figure's width in the page (a
    `width` parameter) is told it when the page has said. Every view reads the chat template's
    tokens as markers (visualizer/tokens.py), and a figure that shows one says once what they
    are."""
    marked = marked_texts(events, texts)
    if width and _takes_width(view):
        fig = view(events, marked, step, width=width)  # type: ignore[call-arg]
    else:
        fig = view(events, marked, step)
    if marked is not texts and shows_markers(fig):
        add_note(fig, escape(MARKER_NOTE))
    return fig


def shows_markers(fig: go.Figure) -> bool:
    """Whether a figure's text holds a marker (a view may read tokens it does not draw, such as
    the context rows prompt lookup's panel leaves out): 2-4 ms for a view's figure."""
    return MARK_OPEN in json.dumps(fig.to_plotly_json(), ensure_ascii=False, default=str)


def method_panel(
    views: Sequence[str],
    events: Sequence[Event],
    texts: Mapping[int, str],
    step: int,
    width: int | None = None,
) -> go.Figure:
    """The method's own panel at `step`: the first of its declared views."""
    return draw(VIEWS.get(views[0] if views else "", topk_panel), events, texts, step, width)


def extra_panels(
    views: Sequence[str],
    events: Sequence[Event],
    texts: Mapping[int, str],
    step: int,
    width: int | None = None,
) -> list[go.Figure]:
    """The method's further figures at `step` (its declared views after the first). At step 0,
    the prefill, those with nothing to draw are left out (the page hides their slots): a column
    of "nothing at step 0" notes says less than the one main panel."""
    figures = [draw(VIEWS[name], events, texts, step, width) for name in views[1:] if name in VIEWS]
    return [f for f in figures if f.data] if step == 0 else figures
