"""Prompt lookup's method panel: where the copy came from, in the context as the model sees it.

The context is the prompt's token ids as they were fed to the model (the chat template included,
from the Prefill event), then the output committed before the selected step. Prompt lookup found
the context's last n tokens (the suffix) earlier in it and copied what followed. The panel lays
the context out as text, one box per token, and highlights the matched earlier n-gram, the suffix
it matched, and the copied span (coloured by what the target made of it: accepted green, first
rejection red, never checked grey). Long contexts are cut to the rows around the match and the
suffix. `copy_view` lays the context out (plain data), `copy_source` draws it. Pure: events in,
Figure out (no torch, no gradio).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import plotly.graph_objects as go

from decoders.core.events import Commit, CopySource, Draft, Event, Prefill, Verify

from .figures import _base_layout, _empty, draft_panel
from .text import add_caption, escape, is_marker, token_hover
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


class ContextToken(NamedTuple):
    """One token of the context on a kept line: where it sits and what the copy made of it."""

    index: int  # position in the context
    token: int
    line: int
    col: int
    size: int  # columns it takes
    part: str  # "prompt" or "output"
    role: str | None  # a ROLE_FILL key, None for plain context
    text: str  # its text, whitespace made visible (_shown)


@dataclass(frozen=True)
class CopyView:
    """What the copy-source panel shows at one step: the context laid out as text on the lines
    kept, the matched n-gram, the suffix it matched and the copied span."""

    step: int
    start: int  # where the earlier n-gram starts
    n: int  # its length
    copied: int  # tokens copied after it
    accepted: int  # of them, how many the target accepted
    prompt_len: int
    tokens: tuple[ContextToken, ...]  # the tokens on the kept lines, in context order
    gaps: tuple[tuple[int, int], ...]  # (line, rows skipped) for each "⋯" line
    lines: int  # lines drawn, the gaps' included
    chat_template: bool  # the prompt holds a chat template's markers ("<|")


def _roles(
    start: int, n: int, copied: int, context_len: int, verify: Verify | None
) -> dict[int, str]:
    """Context position -> ROLE_FILL key, for the match, the suffix and the copied span."""
    n_acc = len(verify.accepted) if verify else 0
    # An accepted end token ended the output: the copy after it was never compared.
    ended = verify is not None and n_acc > 0 and verify.correction is None
    role: dict[int, str] = {}
    for i in range(context_len - n, context_len):
        role[i] = "suffix"
    for j in range(copied):
        role[start + n + j] = (
            "accepted" if j < n_acc else "rejected" if j == n_acc and not ended else "not checked"
        )
    for i in range(start, start + n):
        role[i] = "match"
    return role


def _compact(keep_rows: Sequence[int]) -> tuple[dict[int, int], list[tuple[int, int]], int]:
    """The kept rows on consecutive lines, with a "⋯" line where rows were left out: (row ->
    line, (line, rows skipped) per gap, lines in all)."""
    line_of: dict[int, int] = {}
    gaps: list[tuple[int, int]] = []
    line = 0
    for k, r in enumerate(keep_rows):
        skipped = r - (keep_rows[k - 1] + 1 if k else 0)
        if skipped:
            gaps.append((line, skipped))
            line += 1
        line_of[r] = line
        line += 1
    return line_of, gaps, line


def copy_view(events: Sequence[Event], texts: Mapping[int, str], step: int) -> CopyView | str:
    """The copy at `step` in its context as data (see `copy_source`), or why there is none."""
    source = next((e for e in events if isinstance(e, CopySource) and e.step == step), None)
    if source is None:
        return "no earlier match at this step: a plain target step"
    found = context_at(events, step)
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    if found is None or draft is None:
        return "this trace lacks the prompt or the draft"
    context, prompt_len = found
    start, n, copied = source.start, source.n, len(draft.tokens)
    if not (
        source.context_len == len(context)
        and start >= 0
        and n >= 1
        and start + n + copied <= len(context)
        and context[start : start + n] == context[len(context) - n :]
    ):
        return "the recorded copy source does not match this context"
    role = _roles(start, n, copied, len(context), verify)
    shown_text = [_shown(texts.get(t, "?")) for t in context]
    placed = layout_rows(shown_text)
    last_row = placed[-1][0]
    keep_rows = _rows_to_show(
        [r for r, _, _ in placed],
        [placed[start][0], placed[start + n + copied - 1][0], last_row],
        last_row,
    )
    line_of, gaps, lines = _compact(keep_rows)
    tokens = tuple(
        ContextToken(
            i,
            t,
            line_of[r],
            col,
            size,
            "prompt" if i < prompt_len else "output",
            role.get(i),
            shown,
        )
        for i, (t, shown, (r, col, size)) in enumerate(
            zip(context, shown_text, placed, strict=True)
        )
        if r in line_of
    )
    return CopyView(
        step=step,
        start=start,
        n=n,
        copied=copied,
        accepted=len(verify.accepted) if verify else 0,
        prompt_len=prompt_len,
        tokens=tokens,
        gaps=tuple(gaps),
        lines=lines,
        chat_template=any(
            texts.get(t, "").startswith("<|") or is_marker(texts.get(t, ""))
            for t in context[:prompt_len]
        ),
    )


def _role_box(tok: ContextToken) -> dict:
    """The box behind a token the copy concerns, in its role's fill."""
    role = tok.role
    return dict(
        type="rect",
        x0=tok.col + 0.05,
        x1=tok.col + tok.size - 0.05,
        y0=tok.line - 0.42,
        y1=tok.line + 0.42,
        fillcolor=ROLE_FILL[role],
        line=dict(
            color=SUFFIX_EDGE if role in ("match", "suffix") else "#90a4ae",
            width=1,
            dash="dot" if role == "suffix" else "solid",
        ),
        layer="below",
    )


def _ink_traces(fig: go.Figure, view: CopyView, texts: Mapping[int, str]) -> None:
    """The context's text: one trace for the prompt's ink, one for the output's."""
    for part in ("prompt", "output"):
        toks = [tok for tok in view.tokens if tok.part == part]
        if not toks:
            continue
        what = [tok.role or part for tok in toks]
        fig.add_trace(
            go.Scatter(
                x=[tok.col + tok.size / 2 for tok in toks],
                y=[tok.line for tok in toks],
                mode="text",
                text=[
                    escape(tok.text if len(tok.text) <= tok.size else tok.text[: tok.size - 1])
                    for tok in toks
                ],
                textfont=dict(
                    family="ui-monospace, Menlo, Consolas, monospace",
                    size=11,
                    color=PROMPT_INK if part == "prompt" else OUTPUT_INK,
                ),
                hovertext=[
                    f"#{tok.index} · {token_hover(texts.get(tok.token, '?'), tok.token)} · "
                    f"{ROLE_LABELS.get(w, w)}"
                    + (
                        " (chat template or prompt)"
                        if part == "prompt" and tok.role is None
                        else ""
                    )
                    for tok, w in zip(toks, what, strict=True)
                ],
                hoverinfo="text",
                showlegend=False,
            )
        )


def _copy_axes(fig: go.Figure, lines: int) -> None:
    """One row is as tall as three characters are wide, whatever the page's width: on a wide page
    the text block keeps its proportions (and stays left) instead of stretching."""
    fig.update_xaxes(
        visible=False,
        range=[-0.5, LINE_CHARS + 0.5],
        fixedrange=True,
        constrain="domain",
        constraintoward="left",
    )
    fig.update_yaxes(
        visible=False,
        range=[lines - 0.4, -0.6],
        fixedrange=True,
        scaleanchor="x",
        scaleratio=3,
        constrain="domain",
        constraintoward="top",
    )


def _copy_caption(view: CopyView) -> str:
    """Where the n-gram was found, what was copied and accepted, and the colours' key."""
    start, n = view.start, view.n
    where = "the prompt as the model sees it" if start < view.prompt_len else "the output so far"
    if start < view.prompt_len and view.chat_template:
        where += " (the chat template around the prompt included)"
    tokens_word = "token also occurs" if n == 1 else f"{n} tokens also occur"
    return (
        f"The last {tokens_word} at #{start}, in {where}; the {view.copied} tokens after them "
        f"were copied and the target accepted {view.accepted}. Blue: the n-gram (solid: where it "
        "was found, dotted: the context's end). Copied: green accepted, red rejected, grey not "
        "checked."
    )


def copy_source(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """The context at `step` with the copy's source highlighted (see the module doc)."""
    if not any(isinstance(e, CopySource) for e in events):
        return draft_panel(events, texts, step)  # a trace from before sources were recorded
    view = copy_view(events, texts, step)
    if isinstance(view, str):
        return _empty(f"Step {step}", view, 200)
    fig = go.Figure()
    shapes = [_role_box(tok) for tok in view.tokens if tok.role is not None]
    _ink_traces(fig, view, texts)
    for y, skipped in view.gaps:
        fig.add_annotation(
            x=0,
            y=y,
            xanchor="left",
            text=f"⋯ {skipped} rows",
            showarrow=False,
            font=dict(size=10, color="#90a4ae"),
        )
    fig.update_layout(shapes=shapes, showlegend=False)  # the key is in the caption
    _copy_axes(fig, view.lines)
    title = f"Step {step}: n={view.n} match, {view.copied} copied"
    height = 60 + ROW_PX * view.lines
    fig = add_caption(_base_layout(fig, title, height=height), [_copy_caption(view)], height)
    fig.update_layout(margin=dict(l=12, r=12))
    return fig
