"""The web app's pieces: session logic (no gradio) and the page layout."""

from .layout import build_demo

__all__ = ["build_demo"]
