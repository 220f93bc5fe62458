"""Pure drawing functions: trace events in, Plotly figures or HTML out. No torch, no gradio."""

from .compare_views import quality_chart, race_chart, speedup_chart
from .exit_view import quality_point
from .figures import (
    acceptance_by_position,
    acceptance_histogram,
    acceptance_panel,
    draft_panel,
    forward_timeline,
    tokens_per_step,
    topk_panel,
)
from .panels import extra_panels, method_panel
from .tokens import lossless_badge_html, metrics_html, token_spans_html
from .tree_view import token_tree, tree_layout

__all__ = [
    "acceptance_by_position",
    "acceptance_histogram",
    "acceptance_panel",
    "draft_panel",
    "extra_panels",
    "forward_timeline",
    "lossless_badge_html",
    "method_panel",
    "metrics_html",
    "quality_chart",
    "quality_point",
    "race_chart",
    "speedup_chart",
    "token_spans_html",
    "token_tree",
    "tokens_per_step",
    "topk_panel",
    "tree_layout",
]
