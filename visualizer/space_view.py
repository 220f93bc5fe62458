"""SPACE's relay: at each step, the guesses being verified, every mask group's guesses, and the
group that hands its guesses to the next step.

Columns are output positions, so the figure is a staircase: group g sits after the g-th verified
input and guesses the k positions after the token that follows it. The group after the last
accepted input is the one whose guesses the next step verifies; it is outlined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import Commit, Event, MaskGroups, Verify

from .cells import _at, _codes, _heatmap, _swatch, _tok
from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .text import short_token, wrap
from .tokens import COLOURS, LABELS

MAX_GROUPS = 9  # rows drawn at most (a trace may claim more)
MAX_MASKS = 8

RELAY_STATUS: dict[str, tuple[str, str]] = {
    "accepted": (COLOURS["draft"], "guess accepted"),
    "relaxed": (COLOURS["relaxed"], LABELS["relaxed"]),
    "rejected": (COLOURS["rejected"], "guess rejected (the target's token replaces it)"),
    "not checked": (COLOURS["pending"], "not checked (an earlier guess was rejected)"),
    "target": (COLOURS["correction"], "the target's own token (correction)"),
    "bonus": (COLOURS["bonus"], LABELS.get("bonus", "bonus")),
    "handed": ("#d1c4e9", "guesses handed to the next step"),
    "unused": ("#eceff1", "guesses of a group that was not handed on"),
}


def relay(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    title = f"Step {step}: the mask groups' relay"
    groups = _at(events, MaskGroups, step)
    if groups is None:
        if any(isinstance(e, MaskGroups) for e in events):
            return _empty(title, f"no mask groups at step {step}", 220)
        return _empty(
            title,
            "this trace has no SPACE relay (not a SPACE run, or recorded without detail)",
            220,
        )
    verify = _at(events, Verify, step)
    commit = _at(events, Commit, step)
    cands = list(groups.candidates)
    accepted = len(verify.accepted) if verify is not None else 0
    relaxed = set(verify.relaxed) if verify is not None else set()
    rows = [list(g[:MAX_MASKS]) for g in groups.groups[:MAX_GROUPS]]
    probs = [list(p[:MAX_MASKS]) for p in groups.probs[:MAX_GROUPS]]
    k = max((len(r) for r in rows), default=0)
    width = len(cands) + 1 + k  # positions pos .. pos + m + k
    code = _codes(RELAY_STATUS)
    y_labels: list[str] = []
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []

    def blank() -> tuple[list[int | None], list[str], list[str]]:
        return [None] * width, [""] * width, [""] * width

    if step > 0:  # what this step verified, then what it committed
        zr, tr, hr = blank()
        for i, c in enumerate(cands):
            st = "accepted" if i < accepted else "rejected" if i == accepted else "not checked"
            st = "relaxed" if i in relaxed else st
            zr[i], tr[i] = code[st], short_token(texts.get(c, "?"), 6)
            hr[i] = f"{_tok(texts, c)}<br>c{i + 1}: {RELAY_STATUS[st][1]}"
        y_labels.append("guesses")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
        zr, tr, hr = blank()
        for i, (t, origin) in enumerate(
            zip(commit.tokens, commit.origins, strict=False) if commit is not None else ()
        ):
            st = (
                "accepted"
                if origin == "draft"
                else origin
                if origin in ("relaxed", "bonus")
                else "target"
            )
            zr[i], tr[i] = code[st], short_token(texts.get(t, "?"), 6)
            hr[i] = f"{_tok(texts, t)}<br>committed: {RELAY_STATUS[st][1]}"
        y_labels.append("committed")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    for g, (row, p) in enumerate(zip(rows, probs, strict=False)):
        zr, tr, hr = blank()
        st = "handed" if g == groups.handed else "unused"
        if g == groups.handed and groups.guesses:  # when sampling, the tokens actually drawn
            row = list(groups.guesses[:MAX_MASKS])
        for j, t in enumerate(row):
            col = g + 1 + j
            if col >= width:
                break
            zr[col], tr[col] = code[st], short_token(texts.get(t, "?"), 6)
            pj = f"{p[j]:.2f}" if j < len(p) else "?"
            hr[col] = (
                f"{_tok(texts, t)}<br>group {g}, mask {j + 1}: p = {pj}<br>{RELAY_STATUS[st][1]}"
            )
        y_labels.append("after x" if g == 0 else f"after c{g}")
        z.append(zr)
        text.append(tr)
        hover.append(hr)

    fig = go.Figure()
    x = [f"+{i}" for i in range(width)]
    fig.add_trace(_heatmap(z, RELAY_STATUS, x=x, y=y_labels, text=text, hover=hover, name="relay"))
    for name in RELAY_STATUS:
        if any(code[name] in r for r in z):
            fig.add_trace(_swatch(*RELAY_STATUS[name]))
    fig.update_yaxes(autorange="reversed")  # rows name themselves: "guesses", "after x", …
    fig.update_xaxes(title_text=f"output position (+0 = token {groups.position + 1})")
    if step == 0:
        note = "the prefill's masks guess the tokens after the first one"
    else:
        note = (
            f"{accepted} of {len(cands)} guesses accepted; group {groups.handed} (after the "
            f"last accepted input) hands its guesses to step {step + 1}"
        )
    return _base_layout(
        fig,
        title,
        height=min(640, 260 + 44 * len(z)),
        subtitle=wrap(note, SUBTITLE_CHARS),
    )
