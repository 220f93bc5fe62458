"""SPACE's relay: at each step, the guesses being verified, every mask group's guesses, and the
group that hands its guesses to the next step.

Columns are output positions, so the figure is a staircase: group g sits after the g-th verified
input and guesses the k positions after the token that follows it. The group after the last
accepted input is the one whose guesses the next step verifies; it is outlined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
CODE = _codes(RELAY_STATUS)


@dataclass(frozen=True)
class RelayGrid:
    """What the relay shows at one step: one row per line of the figure, top to bottom
    ("guesses" and "committed" after the prefill, then a row per mask group), one column per
    output position; codes index RELAY_STATUS (None: an empty cell)."""

    step: int
    y_labels: list[str]
    z: list[list[int | None]]
    text: list[list[str]]
    hover: list[list[str]]
    width: int  # output positions drawn: pos .. pos + m + k
    position: int  # output tokens committed before the step (+0 is the next one)
    accepted: int  # guesses accepted
    verified: int  # guesses verified
    handed: int  # the group whose guesses the next step verifies


Cell = tuple[int | None, str, str]  # status code, label, hover


def _cell(texts: Mapping[int, str], t: int, status: str, hover: str) -> Cell:
    return CODE[status], short_token(texts.get(t, "?"), 6), hover


def _verified_row(
    cands: Sequence[int], verify: Verify | None, texts: Mapping[int, str], width: int
) -> list[Cell]:
    """The guesses this step verified, each with its verdict."""
    accepted = len(verify.accepted) if verify is not None else 0
    relaxed = set(verify.relaxed) if verify is not None else set()
    row: list[Cell] = [(None, "", "")] * width
    for i, c in enumerate(cands):
        st = "accepted" if i < accepted else "rejected" if i == accepted else "not checked"
        st = "relaxed" if i in relaxed else st
        row[i] = _cell(texts, c, st, f"{_tok(texts, c)}<br>c{i + 1}: {RELAY_STATUS[st][1]}")
    return row


def _committed_row(commit: Commit | None, texts: Mapping[int, str], width: int) -> list[Cell]:
    """The tokens this step committed, by origin."""
    row: list[Cell] = [(None, "", "")] * width
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
        row[i] = _cell(texts, t, st, f"{_tok(texts, t)}<br>committed: {RELAY_STATUS[st][1]}")
    return row


def _group_row(groups: MaskGroups, g: int, texts: Mapping[int, str], width: int) -> list[Cell]:
    """Group g's guesses, from the column after the input it follows (x for g = 0, else c_g)."""
    row: list[Cell] = [(None, "", "")] * width
    tokens = list(groups.groups[g][:MAX_MASKS])
    probs = list(groups.probs[g][:MAX_MASKS])
    st = "handed" if g == groups.handed else "unused"
    if g == groups.handed and groups.guesses:  # when sampling, the tokens actually drawn
        tokens = list(groups.guesses[:MAX_MASKS])
    for j, t in enumerate(tokens):
        col = g + 1 + j
        if col >= width:
            break
        pj = f"{probs[j]:.2f}" if j < len(probs) else "?"
        hover = f"{_tok(texts, t)}<br>group {g}, mask {j + 1}: p = {pj}<br>{RELAY_STATUS[st][1]}"
        row[col] = _cell(texts, t, st, hover)
    return row


def relay_grid(events: Sequence[Event], texts: Mapping[int, str], step: int) -> RelayGrid | None:
    """The relay's cells at `step` (see the module doc); None when the step has no MaskGroups."""
    groups = _at(events, MaskGroups, step)
    if groups is None:
        return None
    verify = _at(events, Verify, step)
    cands = list(groups.candidates)
    n_groups = min(len(groups.groups), len(groups.probs), MAX_GROUPS)
    k = max((len(g[:MAX_MASKS]) for g in groups.groups[:MAX_GROUPS]), default=0)
    width = len(cands) + 1 + k  # positions pos .. pos + m + k
    rows: list[list[Cell]] = []
    labels: list[str] = []
    if step > 0:  # what this step verified, then what it committed
        rows += [
            _verified_row(cands, verify, texts, width),
            _committed_row(_at(events, Commit, step), texts, width),
        ]
        labels += ["guesses", "committed"]
    for g in range(n_groups):
        rows.append(_group_row(groups, g, texts, width))
        labels.append("after x" if g == 0 else f"after c{g}")
    return RelayGrid(
        step=step,
        y_labels=labels,
        z=[[c[0] for c in row] for row in rows],
        text=[[c[1] for c in row] for row in rows],
        hover=[[c[2] for c in row] for row in rows],
        width=width,
        position=groups.position,
        accepted=len(verify.accepted) if verify is not None else 0,
        verified=len(cands),
        handed=groups.handed,
    )


def relay(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """SPACE's relay at `step`: the guesses verified, what was committed, every mask group's
    guesses (the group handed on in a colour of its own; see the module doc)."""
    title = f"Step {step}: the mask groups' relay"
    grid = relay_grid(events, texts, step)
    if grid is None:
        if any(isinstance(e, MaskGroups) for e in events):
            return _empty(title, f"no mask groups at step {step}", 220)
        return _empty(
            title,
            "this trace has no SPACE relay (not a SPACE run, or recorded without detail)",
            220,
        )
    z = grid.z
    fig = go.Figure()
    x = [f"+{i}" for i in range(grid.width)]
    fig.add_trace(
        _heatmap(
            z, RELAY_STATUS, x=x, y=grid.y_labels, text=grid.text, hover=grid.hover, name="relay"
        )
    )
    for name in RELAY_STATUS:
        if any(CODE[name] in r for r in z):
            fig.add_trace(_swatch(*RELAY_STATUS[name]))
    fig.update_yaxes(autorange="reversed")  # rows name themselves: "guesses", "after x", …
    fig.update_xaxes(title_text=f"output position (+0 = token {grid.position + 1})")
    if step == 0:
        note = "the prefill's masks guess the tokens after the first one"
    else:
        note = (
            f"{grid.accepted} of {grid.verified} guesses accepted; group {grid.handed} (after the "
            f"last accepted input) hands its guesses to step {step + 1}"
        )
    return _base_layout(
        fig,
        title,
        height=min(640, 260 + 44 * len(z)),
        subtitle=wrap(note, SUBTITLE_CHARS),
    )
