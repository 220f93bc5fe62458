"""The method-specific panel: each method names the figure that explains its steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go

from decoders.events import Event

from .exit_view import catch_ups, exit_confidence, exit_heatmap, hash_layers
from .figures import draft_panel, topk_panel
from .kangaroo_view import (
    kangaroo_confidence,
    kangaroo_layers,
    layerskip_confidence,
    layerskip_layers,
)
from .lookahead_views import (
    attention_mask,
    jacobi_trajectory,
    lookahead_panel,
    lookahead_window,
    ngram_pool,
    pool_candidates,
)
from .mask_predict_view import refinement
from .medusa_view import blockwise_chain, heads_grid
from .prompt_lookup_view import copy_source
from .self_speculative_view import self_speculative_panel
from .space_view import relay
from .tree_view import token_tree

Panel = Callable[[Sequence[Event], Mapping[int, str], int], go.Figure]

PANELS: dict[str, Panel] = {
    "autoregressive": topk_panel,
    "prompt_lookup": copy_source,
    "speculative": draft_panel,
    "self_speculative": self_speculative_panel,
    "token_tree": token_tree,
    "jacobi": jacobi_trajectory,
    "lookahead": lookahead_panel,
    "kangaroo": kangaroo_confidence,
    "layerskip": layerskip_confidence,
    "medusa": heads_grid,
    "blockwise": blockwise_chain,
    "space": relay,
    "mask_predict": refinement,
    "calm": exit_heatmap,
    "hash_ee": exit_heatmap,
    "free": exit_heatmap,
}


def method_panel(
    method: str, events: Sequence[Event], texts: Mapping[int, str], step: int
) -> go.Figure:
    return PANELS.get(method, topk_panel)(events, texts, step)


# Methods with more to show than one panel: drawn under the main one, same step, each full width
# (the page, ui/run_tab.py, has MAX_EXTRA_PANELS slots for them).
EXTRA_PANELS: dict[str, tuple[Panel, ...]] = {
    "lookahead": (lookahead_window, pool_candidates, ngram_pool),
    "prompt_lookup": (draft_panel,),  # under the copy's source: the draft against what was kept
    "kangaroo": (kangaroo_layers,),  # under the confidences: where in the model the step ran
    "layerskip": (layerskip_layers,),
    "medusa": (token_tree,),  # the tree the heads' guesses formed, verified
    "blockwise": (heads_grid,),  # each head's top few: where the right token ranked
    "space": (attention_mask,),  # the layout's real mask: every group hidden from later rows
    "mask_predict": (attention_mask,),  # masks see all before them; kept tokens see no mask
    "calm": (exit_confidence,),  # this step's token: its confidence at each exit against λ_t
    "hash_ee": (hash_layers,),  # the hash for the tokens on screen
    "free": (catch_ups,),  # the held-back tokens and their synchronized passes
}
MAX_EXTRA_PANELS = 4


def extra_panels(
    method: str, events: Sequence[Event], texts: Mapping[int, str], step: int
) -> list[go.Figure]:
    """The method's extra figures at `step`. At step 0, the prefill, those with nothing to draw
    are left out (the page hides their slots): a column of "nothing at step 0" notes says less
    than the one main panel."""
    figures = [panel(events, texts, step) for panel in EXTRA_PANELS.get(method, ())]
    return [f for f in figures if f.data] if step == 0 else figures
