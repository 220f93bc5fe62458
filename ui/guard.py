"""Requests the page answers before Gradio sees them. No gradio here.

A link longer than about 64 k characters (a long prompt in `?prompt=`) makes Gradio's page route
fail inside httpx ("URL too long") with a bare "Internal Server Error"; the guard answers such a
link with a page that says what happened and what to do instead. It answers what reaches the
app: a proxy in front (a Space's) may refuse a long link earlier with its own 4xx. uvicorn's h11
parser would too (a bare 400, "Invalid HTTP request received.") whenever a long request head
arrives in pieces, as it does on a busy machine, unless the server is told to wait for more of
it (`serve_long_heads`).
"""

from __future__ import annotations

from html import escape
from typing import Any

from starlette.middleware import Middleware
from starlette.responses import HTMLResponse

from decoders.engine import MAX_PROMPT_CHARS

# httpx refuses URLs over 65,536 characters; the scheme and host need some of that.
MAX_LINK_CHARS = 60_000
# How much of a request head uvicorn's h11 parser holds while it waits for the rest: its default,
# 16 KiB, answers a longer head that comes in two reads with a bare 400 before the guard sees it.
MAX_HEAD_BYTES = 256 * 1024


class LongLinkGuard:
    """ASGI middleware: a request whose path and query exceed MAX_LINK_CHARS gets 414 and a short
    page pointing to the prompt box; every other request passes through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            length = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            if length > MAX_LINK_CHARS:
                await too_long_page(length)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def too_long_page(length: int) -> HTMLResponse:
    message = (
        f"This link is {length:,} characters long; links to Decoding Lab can carry at most "
        f"{MAX_LINK_CHARS:,} (a prompt in a link counts each special character three times). "
        f"Open the app and paste the prompt into its box instead: prompts there can have up to "
        f"{MAX_PROMPT_CHARS:,} characters."
    )
    body = (
        "<!doctype html><meta charset=utf-8><title>Decoding Lab: link too long</title>"
        f"<p>⚠️ {escape(message)}</p><p><a href='/'>Open Decoding Lab</a></p>"
    )
    return HTMLResponse(body, status_code=414)


def app_kwargs() -> dict[str, Any]:
    """For demo.launch(app_kwargs=...): the guard in front of every Gradio route. A new dict per
    launch, since Gradio writes its own entries into the one it is given."""
    return {"middleware": [Middleware(LongLinkGuard)]}


def serve_long_heads(server: Any) -> None:
    """Let the running uvicorn server (Gradio's `demo.server`) hold up to MAX_HEAD_BYTES of a
    request head that arrives in pieces, so a link too long for the app reaches the guard's page
    however the network splits it. uvicorn reads the setting for each new connection."""
    server.config.h11_max_incomplete_event_size = MAX_HEAD_BYTES
