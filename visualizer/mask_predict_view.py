"""Mask-Predict's refinement of one block: iterations × positions.

Each row is one iteration's fill of the block (one target forward); a cell is coloured by what
happened to that position: filled in this iteration or kept from an earlier one, and whether it
was masked again for the next iteration (the least confident). The last row is what was
committed, never verified: the first token is the target's own, the rest the masks'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import Commit, Event, MaskPredictStep

from .cells import _at, _codes, _heatmap, _swatch, _tok
from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .text import short_token, wrap
from .tokens import COLOURS

MASK_PREDICT_STATUS: dict[str, tuple[str, str]] = {
    "own": (COLOURS["target"], "the target's own token (last token's row)"),
    "filled": ("#ce93d8", "filled now, kept"),
    "filled_remasked": (COLOURS["rejected"], "filled now, masked again (least sure)"),
    "kept": ("#f3e5f5", "kept from an earlier iteration"),
    "kept_remasked": ("#ef9a9a", "kept earlier, masked again now"),
    "committed": (COLOURS["mask"], "committed without verification"),
}


def refinement(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    title = f"Step {step}: Mask-Predict's iterations"
    its = [e for e in events if isinstance(e, MaskPredictStep) and e.step == step]
    if not its:
        if any(isinstance(e, MaskPredictStep) for e in events):
            return _empty(title, f"no Mask-Predict block at step {step}", 220)
        return _empty(
            title, "this trace has no Mask-Predict iterations (not a mask_predict run)", 220
        )
    its.sort(key=lambda e: e.iteration)
    width = max(len(e.tokens) for e in its)
    code = _codes(MASK_PREDICT_STATUS)
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    y: list[str] = []
    for e in its:
        zr: list[int | None] = [None] * width
        tr, hr = [""] * width, [""] * width
        for j, (t, p) in enumerate(zip(e.tokens, e.probs, strict=True)):
            new, again = j in e.updated, j in e.remasked
            if j == 0 and e.iteration == 0:
                st = "own"
            elif new:
                st = "filled_remasked" if again else "filled"
            else:
                st = "kept_remasked" if again else "kept"
            zr[j], tr[j] = code[st], short_token(texts.get(t, "?"), 6)
            hr[j] = f"{_tok(texts, t)}<br>confidence {p:.2f}<br>{MASK_PREDICT_STATUS[st][1]}"
        z.append(zr)
        text.append(tr)
        hover.append(hr)
        y.append(f"iteration {e.iteration + 1}")
    commit = _at(events, Commit, step)
    if commit is not None:
        zr, tr, hr = [None] * width, [""] * width, [""] * width
        for j, (t, origin) in enumerate(zip(commit.tokens, commit.origins, strict=False)):
            st = "own" if origin == "target" else "committed"
            zr[j], tr[j] = code[st], short_token(texts.get(t, "?"), 6)
            hr[j] = f"{_tok(texts, t)}<br>{MASK_PREDICT_STATUS[st][1]}"
        z.append(zr)
        text.append(tr)
        hover.append(hr)
        y.append("committed")

    fig = go.Figure()
    x = [f"+{j}" for j in range(width)]
    fig.add_trace(_heatmap(z, MASK_PREDICT_STATUS, x=x, y=y, text=text, hover=hover, name="block"))
    for name, (colour, label) in MASK_PREDICT_STATUS.items():
        if any(code[name] in r for r in z):
            fig.add_trace(_swatch(colour, label))
    fig.update_yaxes(autorange="reversed")  # iteration 1 on top, the commit at the bottom
    fig.update_xaxes(title_text=f"output position (+0 = token {its[0].position + 1})")
    redone = sum(len(e.updated) for e in its[1:])
    note = (
        f"{len(its)} iteration{'s' if len(its) > 1 else ''} (one forward each) for {width} tokens; "
        f"{redone} position{'s' if redone != 1 else ''} re-predicted after the first; nothing is verified"
    )
    return _base_layout(
        fig, title, height=min(560, 250 + 46 * len(z)), subtitle=wrap(note, SUBTITLE_CHARS)
    )
