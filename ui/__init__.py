"""The web app: what the page does without gradio (models, live, links, traces, compare) and its layout."""

from .layout import build_demo

__all__ = ["build_demo"]
