"""What every tab shares: explainers, the GPU wrapper and how a message looks."""

from __future__ import annotations

from pathlib import Path

EXPLAINERS = Path(__file__).resolve().parents[1] / "assets" / "explainers"

try:  # ZeroGPU on Hugging Face Spaces: borrow a GPU for the duration of a call.
    import spaces

    gpu = spaces.GPU
except ImportError:  # anywhere else, a no-op

    def gpu(fn):
        return fn


def explainer(method: str) -> str:
    path = EXPLAINERS / f"{method}.md"
    return path.read_text() if path.is_file() else f"*No explainer yet for `{method}`.*"


def message(text: str) -> str:
    """A problem, as the status line shows it (never a bare "Error")."""
    return f"⚠️ **{text}**"
