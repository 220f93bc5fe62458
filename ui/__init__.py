"""The web app: its gradio-free logic (models, live runs, links, traces, compare) and its layout."""

from .layout import build_demo

__all__ = ["build_demo"]
