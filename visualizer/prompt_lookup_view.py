"""Prompt lookup's method panel: where the copy came from, in the context as the model sees it.

The context is the prompt's token ids as they were fed to the model (the chat template included,
from the Prefill event), then the output committed before the selected step. Prompt lookup found
the context's last n tokens (the suffix) earlier in it and copied what followed. The panel lays
the context out as text, one box per token, and highlights the matched earlier n-gram, the suffix
it matched, and the copied span (coloured by what the target made of it: accepted green, first
rejection red, never checked grey). Long contexts are cut to the rows around the match and the
suffix. Pure: events in, Figure out (no torch, no gradio).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import Commit, CopySource, Draft, Event, Prefill, Verify

from .figures import _base_layout, _empty, draft_panel
from .text import add_caption, escape, token_hover
from .tokens import COLOURS

LINE_CHARS = 44  # characters per row: fits a 390 px phone in an 11 px monospace font
MATCH_COLOUR = "#bbdefb"  # the earlier n-gram and the suffix it matched (one pair: one hue)
SUFFIX_EDGE = "#1565c0"
PROMPT_INK, OUTPUT_INK = "#78909c", "#1f2937"
ROW_PX = 24
CONTEXT_ROWS = 2  # rows of context kept around the match and around the suffix
ROLE_LABELS = {  # for the hover text
    "match": "the matched n-gram, earlier",
    "suffix": "the n-gram looked up (the context's end)",
    "accepted": "copied, accepted",
    "rejected": "copied, rejected",
    "not checked": "copied, not checked",
}
ROLE_FILL = {
    "match": MATCH_COLOUR,
    "suffix": "#e3f2fd",
    "accepted": COLOURS["draft"],
    "rejected": COLOURS["rejected"],
    "not checked": COLOURS["pending"],
}


def _shown(text: str) -> str:
    """A token's text with its whitespace visible and kept (SVG collapses plain spaces)."""
    # Not visible(): it draws a spaces-only token as ␣, and this view lays the context out as
    # text, indentation included.
    return text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "\u00a0") or "∅"


def context_at(events: Sequence[Event], step: int) -> tuple[list[int], int] | None:
    """The context as the model saw it at the start of `step`: (token ids, prompt length)."""
    prefill = next((e for e in events if isinstance(e, Prefill)), None)
    if prefill is None:
        return None
    context = list(prefill.prompt_ids)
    for e in events:
        if isinstance(e, Commit) and e.step < step:
            context.extend(e.tokens)
    return context, len(prefill.prompt_ids)


def layout_rows(texts: Sequence[str], width: int = LINE_CHARS) -> list[tuple[int, int, int]]:
    """(row, first column, columns) per token, laid out like text: a token that would run past
    `width` starts a new row, and so does the token after a newline."""
    placed: list[tuple[int, int, int]] = []
    row = col = 0
    for text in texts:
        size = min(len(text), width)
        if col and col + size > width:
            row, col = row + 1, 0
        placed.append((row, col, size))
        col += size
        if text.endswith("↵"):
            row, col = row + 1, 0
    return placed


def _rows_to_show(rows: Sequence[int], keep: Sequence[int], last_row: int) -> list[int]:
    """The rows around each kept row (CONTEXT_ROWS either side), in order."""
    shown: set[int] = set()
    for r in keep:
        shown.update(range(max(0, r - CONTEXT_ROWS), min(last_row, r + CONTEXT_ROWS) + 1))
    return sorted(shown)


def copy_source(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The context at `step` with the copy's source highlighted (see the module doc)."""
    source = next((e for e in events if isinstance(e, CopySource) and e.step == step), None)
    if source is None:
        if not any(isinstance(e, CopySource) for e in events):
            return draft_panel(events, texts, step)  # a trace from before sources were recorded
        return _empty(f"Step {step}", "no earlier match at this step: a plain target step", 200)
    found = context_at(events, step)
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    if found is None or draft is None:
        return _empty(f"Step {step}", "this trace lacks the prompt or the draft", 200)
    context, prompt_len = found
    start, n, copied = source.start, source.n, len(draft.tokens)
    if not (
        source.context_len == len(context)
        and start >= 0
        and n >= 1
        and start + n + copied <= len(context)
        and context[start : start + n] == context[len(context) - n :]
    ):
        return _empty(f"Step {step}", "the recorded copy source does not match this context", 200)

    n_acc = len(verify.accepted) if verify else 0
    # An accepted end token ended the output: the copy after it was never compared.
    ended = verify is not None and n_acc > 0 and verify.correction is None
    role: dict[int, str] = {}
    for i in range(len(context) - n, len(context)):
        role[i] = "suffix"
    for j in range(copied):
        role[start + n + j] = (
            "accepted" if j < n_acc else "rejected" if j == n_acc and not ended else "not checked"
        )
    for i in range(start, start + n):
        role[i] = "match"

    shown_text = [_shown(texts.get(t, "?")) for t in context]
    placed = layout_rows(shown_text)
    last_row = placed[-1][0]
    keep_rows = _rows_to_show(
        [r for r, _, _ in placed],
        [placed[start][0], placed[start + n + copied - 1][0], last_row],
        last_row,
    )
    # Compact the kept rows onto consecutive lines, with a "⋯" line where rows were left out.
    line_of: dict[int, int] = {}
    gaps: list[tuple[int, int]] = []  # (line, rows skipped)
    line = 0
    for k, r in enumerate(keep_rows):
        skipped = r - (keep_rows[k - 1] + 1 if k else 0)
        if skipped:
            gaps.append((line, skipped))
            line += 1
        line_of[r] = line
        line += 1
    n_lines = line

    fig = go.Figure()
    shapes = []
    inks: dict[str, dict[str, list]] = {
        "prompt": {"x": [], "y": [], "text": [], "hover": []},
        "output": {"x": [], "y": [], "text": [], "hover": []},
    }
    for i, (t, shown, (r, col, size)) in enumerate(zip(context, shown_text, placed, strict=True)):
        if r not in line_of:
            continue
        y = line_of[r]
        part = "prompt" if i < prompt_len else "output"
        what = role.get(i, part)
        if i in role:
            shapes.append(
                dict(
                    type="rect",
                    x0=col + 0.05,
                    x1=col + size - 0.05,
                    y0=y - 0.42,
                    y1=y + 0.42,
                    fillcolor=ROLE_FILL[role[i]],
                    line=dict(
                        color=SUFFIX_EDGE if role[i] in ("match", "suffix") else "#90a4ae",
                        width=1,
                        dash="dot" if role[i] == "suffix" else "solid",
                    ),
                    layer="below",
                )
            )
        ink = inks[part]
        ink["x"].append(col + size / 2)
        ink["y"].append(y)
        cut = shown if len(shown) <= size else shown[: size - 1]
        ink["text"].append(escape(cut))
        ink["hover"].append(
            f"#{i} · {token_hover(texts.get(t, '?'), t)} · {ROLE_LABELS.get(what, what)}"
            + (" (chat template or prompt)" if part == "prompt" and i not in role else "")
        )
    for part, ink in inks.items():
        if ink["x"]:
            fig.add_trace(
                go.Scatter(
                    x=ink["x"],
                    y=ink["y"],
                    mode="text",
                    text=ink["text"],
                    textfont=dict(
                        family="ui-monospace, Menlo, Consolas, monospace",
                        size=11,
                        color=PROMPT_INK if part == "prompt" else OUTPUT_INK,
                    ),
                    hovertext=ink["hover"],
                    hoverinfo="text",
                    showlegend=False,
                )
            )
    for y, skipped in gaps:
        fig.add_annotation(
            x=0,
            y=y,
            xanchor="left",
            text=f"⋯ {skipped} rows",
            showarrow=False,
            font=dict(size=10, color="#90a4ae"),
        )
    fig.update_layout(shapes=shapes, showlegend=False)  # the key is in the caption
    # One row is as tall as three characters are wide, whatever the page's width: on a wide page
    # the text block keeps its proportions (and stays left) instead of stretching.
    fig.update_xaxes(
        visible=False,
        range=[-0.5, LINE_CHARS + 0.5],
        fixedrange=True,
        constrain="domain",
        constraintoward="left",
    )
    fig.update_yaxes(
        visible=False,
        range=[n_lines - 0.4, -0.6],
        fixedrange=True,
        scaleanchor="x",
        scaleratio=3,
        constrain="domain",
        constraintoward="top",
    )

    where = "the prompt as the model sees it" if start < prompt_len else "the output so far"
    if start < prompt_len and any(texts.get(t, "").startswith("<|") for t in context[:prompt_len]):
        where += " (the chat template around the prompt included)"
    tokens_word = "token also occurs" if n == 1 else f"{n} tokens also occur"
    caption = (
        f"The last {tokens_word} at #{start}, in {where}; the {copied} tokens after them were "
        f"copied and the target accepted {n_acc}. Blue: the n-gram (solid: where it was found, "
        "dotted: the context's end). Copied: green accepted, red rejected, grey not checked."
    )
    title = f"Step {step}: n={n} match, {copied} copied"
    height = 60 + ROW_PX * n_lines
    fig = add_caption(_base_layout(fig, title, height=height), [caption], height)
    fig.update_layout(margin=dict(l=12, r=12))
    return fig
