"""What every tab shares: explainers, the GPU wrapper and how a message looks."""

from __future__ import annotations

import logging
from pathlib import Path

import gradio as gr

from .glossary import annotate
from .links import UI_MAX_NEW_TOKENS
from .models import ALLOW_ANY_MODEL

# The benchmark's quality-against-compute points per model (decoders/bench.py writes
# quality_points.json; the shipped ones are copied here with the command in README.md).
QUALITY = Path(__file__).resolve().parents[1] / "assets" / "quality"

try:  # ZeroGPU on Hugging Face Spaces: borrow a GPU for the duration of a call.
    import spaces

    gpu = spaces.GPU
except ImportError:  # anywhere else, a no-op

    def gpu(fn):
        return fn


def explainer(method: str) -> str:
    """The method's explainer, beside its module (decoders/methods/<method>.md), its terms
    marked with their glossary definitions (shown on hover or tap)."""
    from decoders import METHODS

    if method not in METHODS:
        return f"*No explainer yet for `{method}`.*"
    return annotate(METHODS[method].explainer())


def quality_points(model_id: str) -> list[dict]:
    """The benchmarked quality points for a model, [] when none ship (or the file is unreadable:
    the panel then draws the run's point alone)."""
    import json

    from decoders.core.models import slug

    try:
        path = QUALITY / f"{slug(model_id)}.json"
        return list(json.loads(path.read_text())["points"]) if path.is_file() else []
    except (ValueError, KeyError, TypeError, OSError):
        return []


def message(text: str) -> str:
    """A problem, as the status line shows it (never a bare "Error")."""
    return f"⚠️ **{text}**"


def internal_error(exc: Exception) -> str:
    """A handler's last resort for what is not the visitor's doing (a torch error, a view that
    fails, a full disk): the traceback goes to the log, the page gets one short line."""
    logging.getLogger("decoding_lab").exception("a handler failed")
    first = (str(exc).strip().splitlines() or [""])[0]
    detail = first if len(first) <= 160 else first[:157] + "…"
    return f"Something went wrong inside the app: {type(exc).__name__}: {detail}".rstrip(": ")


def model_picker(choices: list[tuple[str, str]], elem_id: str) -> gr.Dropdown:
    """The model dropdown every tab shows: the offered models, any id only where allowed."""
    return gr.Dropdown(
        choices,
        value=choices[0][1],
        label="Model",
        allow_custom_value=ALLOW_ANY_MODEL,
        elem_id=elem_id,
        min_width=200,
    )


def budget_slider(elem_id: str, **kwargs) -> gr.Slider:
    """Max new tokens, up to the page's cap (the same cap its messages name)."""
    return gr.Slider(
        1, UI_MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens", elem_id=elem_id, **kwargs
    )


def api(fn, api_name: str, outputs: list[str], **kwargs) -> None:
    """`gr.api` for `fn`, its outputs named in the API docs (`view_api`) instead of "1st: Any":
    the return annotation resolved to types (this codebase's annotations are strings) and each
    output labelled by `outputs`."""
    import typing

    fn.__annotations__ = typing.get_type_hints(fn)
    gr.api(fn, api_name=api_name, **kwargs)
    blocks = gr.context.get_blocks_context()
    dep = next(f for f in reversed(list(blocks.fns.values())) if f.api_name == api_name)
    for block, name in zip(dep.outputs, outputs, strict=True):
        block.label = name
