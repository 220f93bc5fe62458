"""What the Run tab keeps per browser session: when Stop was last pressed, the views' width, and
whether a run or an import replaced the example. One `forget` drops it all when a page closes."""

from __future__ import annotations

from .live import Trace
from .run_views import stale_note

# Stop, per browser session: when it was last pressed. The run in that session sees it within a
# heartbeat and ends itself, keeping what it decoded. (Gradio's own `cancels` left the Run button
# pending until the cancelled handler's thread came back, and dropped the next Run meanwhile.)
STOPS: dict[str | None, float] = {}
# The method view's width in pixels, per session, as the page last said it (at load, on a resize,
# with each step): a run draws its views for it (the `run_stream` API keeps its inputs).
WIDTHS: dict[str | None, int | None] = {}
# The sessions whose views a run or an import has replaced: the page's opening redraw of its
# example leaves them alone.
REPLACED: set[str | None] = set()
# A link's `step` (`?method=jacobi&step=3`), per session: the session's next finished run opens
# there (once), when it has that step.
LINK_STEPS: dict[str | None, int] = {}


def stale_for(picked: str, trace: Trace | None) -> str:
    """The figures still show the last run: say whose when another method is picked, so nobody
    reads them as this method's (they are dimmed until a run of this method replaces them)."""
    shown = trace.meta.get("method") if trace is not None else None
    return stale_note(shown, picked) if shown is not None and shown != picked else ""


def forget(session: str | None) -> None:
    """A page closed (or reloaded: a new session): drop what this module kept for it. A run still
    streaming to it has already ended: a dropped connection closes its handler (`in_background`)."""
    STOPS.pop(session, None)
    WIDTHS.pop(session, None)
    REPLACED.discard(session)
    LINK_STEPS.pop(session, None)
