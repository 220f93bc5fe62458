"""Kangaroo's views: where in the model a step's tokens went, and why its draft ended.

The layer diagram draws the target as a column of its L decoder layers at one step: layers 1..ℓ
(shallow: the drafts exit after them), the adapter and LM head rows the drafts exit through, and
layers ℓ+1..L (deep: only verification runs them). Each bar is the number of tokens that ran that
layer in the step, split into the drafting pass and the verify pass. Everything is read from the
step's Forward events: a draft forward runs one token through layers 1..ℓ and the adapter (`layers`
= ℓ + 1; `layers` = 1 is the adapter alone, reading the prompt at step 0); the verify forward runs
all its inputs through layers ℓ+1..L, and the inputs drafting did not feed (the last draft
token, and the runners-up beside the drafts) through layers 1..ℓ first (`layers` = L; L − ℓ when
no input needed them).

The confidence view: one bar per drafted token, the adapter's top-1 probability against the
threshold η (dashed), coloured by what the target made of the token (accepted green, first
rejection red, never checked grey), with the reason drafting stopped and the runner-up the
target took, if any: Draft & Verify's figure (self_speculative_view.confidence_bars) with η for θ.
Pure: events in, Figure out (no torch, no gradio).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import plotly.graph_objects as go

from decoders.core.events import Draft, DraftStop, Event, Forward, Verify
from decoders.core.tree import depths

from .figures import LANE_COLOURS, _base_layout, _empty
from .self_speculative_view import confidence_bars, run_cost
from .text import add_caption


@dataclass(frozen=True)
class ExitHead:
    """How a view names the head drafts exit through (the method decides, not the events)."""

    row: str  # its row in the layer diagram
    noun: str  # in sentences
    hover: str
    reads_prompt: bool  # it runs over the prompt's layer-ℓ states at the prefill


ADAPTER = ExitHead("adapter + head", "the adapter", "the adapter and the draft head", True)
# LayerSkip: the tuned model's own final norm and LM head, shared with its last layer
SHARED = ExitHead("norm + LM head", "the LM head", "the final norm and the LM head", False)

MAX_LAYER_ROWS = 64  # deeper models are drawn as three blocks, not one row per layer
LEFT_PX = 100  # room for the y tick labels
ROW_PX = 13  # one layer row: room for a tick label at 11 px
SHALLOW_BAND, DEEP_BAND = "#f1f8e9", "#eceff1"
BAR_ROOM = 2.2  # the x range over the longest bar: the right part holds the bands' names
# (the bars fill 45 %: on a 390 px phone "shallow (drafting)" needs about the right half)


@dataclass(frozen=True)
class StepPasses:
    """Tokens through each part of the model in one step, from its Forward events."""

    n_layers: int  # L
    exit_layer: int | None  # ℓ (None: no draft forward anywhere in the run says it)
    shallow_draft: int  # tokens through layers 1..ℓ in draft forwards
    shallow_verify: int  # ... in its target forward (prefill: the prompt; verify: 1 + runners-up)
    adapter: int  # tokens through the adapter and the draft head
    deep: int  # tokens through layers ℓ+1..L
    draft_forwards: int
    draft_ms: float
    target_ms: float
    target_kind: str  # "prefill", "verify" or "target"


def exit_layer_of(events: Sequence[Event]) -> int | None:
    """ℓ: the exit layer the run's passes were split at (Forward.split)."""
    return next((e.split for e in events if isinstance(e, Forward) and e.split), None)


def step_passes(events: Sequence[Event], step: int) -> StepPasses | None:
    forwards = [e for e in events if isinstance(e, Forward)]
    target = next(
        (e for e in forwards if e.step == step and e.kind in ("prefill", "verify", "target")), None
    )
    if target is None:
        return None
    prefill = next((e.layers for e in forwards if e.kind == "prefill"), None)
    mine = [e for e in forwards if e.step == step and e.kind == "draft"]
    return StepPasses(
        n_layers=max(prefill or 0, target.layers),
        exit_layer=exit_layer_of(mine) or exit_layer_of(events),
        shallow_draft=sum(e.shallow for e in mine),
        # the prefill ran every layer for the prompt; a verify pass resuming at ℓ ran layers
        # 1..ℓ for the inputs it says (the last draft token and any runners-up)
        shallow_verify=target.n_input_tokens if target.kind == "prefill" else target.shallow,
        adapter=sum(e.n_input_tokens for e in mine),
        deep=target.n_input_tokens,
        draft_forwards=len(mine),
        draft_ms=sum(e.wall_ms for e in mine),
        target_ms=target.wall_ms,
        target_kind=target.kind,
    )


def kangaroo_layers(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Kangaroo's layer diagram: the shallow layers, the adapter, the deep layers."""
    return exit_layers(events, texts, step, ADAPTER)


def layerskip_layers(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """LayerSkip's layer diagram: the first E layers, the shared head, the rest."""
    return exit_layers(events, texts, step, SHARED)


class LayerRow(NamedTuple):
    """One row of the layer diagram: a layer (or a block of them, or the exit head), the tokens
    that ran it drafting and verifying, and its hover."""

    label: str
    drafting: int
    verifying: int
    hover: str


@dataclass(frozen=True)
class LayerDiagram:
    """What the layer diagram shows at one step: the model's rows bottom-up (layer 1 first)."""

    step: int
    passes: StepPasses
    rows: list[LayerRow]
    sentences: list[str]  # the caption
    shallow_rows: int  # rows from the bottom that are the shallow layers and the head (0: no draft)
    ticks: list[str]  # the labels ticked on the y axis (empty: every row's)
    head: ExitHead


def layer_diagram(
    events: Sequence[Event], step: int, head: ExitHead = ADAPTER
) -> LayerDiagram | None:
    """The rows of the layer diagram at `step`: one per layer, or three blocks for a model deeper
    than MAX_LAYER_ROWS, or one plain column when the run never drafted. None without a forward."""
    p = step_passes(events, step)
    if p is None:
        return None
    ell, total = p.exit_layer, p.n_layers
    if ell is None or not 1 <= ell < total:  # no draft in the whole run: one plain column
        rows = [_row(_span(1, total), 0, p.deep, _span(1, total))]
        return LayerDiagram(step, p, rows, [_verify_sentence(p)], 0, [], ADAPTER)
    if total <= MAX_LAYER_ROWS:
        rows = [
            _row(f"layer {i}", p.shallow_draft, p.shallow_verify, f"layer {i}")
            for i in range(1, ell + 1)
        ]
        rows.append(_row(head.row, p.adapter, 0, head.hover))
        rows += [_row(f"layer {i}", 0, p.deep, f"layer {i}") for i in range(ell + 1, total + 1)]
        ticks = ["layer 1", f"layer {ell}", head.row, f"layer {ell + 1}", f"layer {total}"]
    else:
        rows = [
            _row(_span(1, ell), p.shallow_draft, p.shallow_verify, _span(1, ell)),
            _row(head.row, p.adapter, 0, head.hover),
            _row(_span(ell + 1, total), 0, p.deep, _span(ell + 1, total)),
        ]
        ticks = [r.label for r in rows]
    shallow_rows = rows.index(next(r for r in rows if r.label == head.row)) + 1
    return LayerDiagram(step, p, rows, _layer_sentences(p, head), shallow_rows, ticks, head)


def exit_layers(
    events: Sequence[Event], texts: Mapping[int, str], step: int, head: ExitHead
) -> go.Figure:
    """The model as a column of layers at `step`: how many tokens ran each part, in which pass."""
    diagram = layer_diagram(events, step, head)
    if diagram is None:
        return _empty(f"Step {step}", "no forward pass recorded at this step", height=220)
    return _layers_figure(diagram)


def _span(first: int, last: int) -> str:
    """'layer 3' or 'layers 1–2'."""
    return f"layer {first}" if first == last else f"layers {first}–{last}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _row(label: str, drafting: int, verifying: int, what: str) -> LayerRow:
    return LayerRow(
        label, drafting, verifying, f"{what}: {drafting} tokens drafting, {verifying} verifying"
    )


def _layers_figure(d: LayerDiagram) -> go.Figure:
    """Stacked horizontal bars, one row per layer (bottom = layer 1), the shallow rows (the
    shallow layers and the exit head) shaded apart from the rest, the caption underneath."""
    labels = [r.label for r in d.rows]
    fig = go.Figure()
    _layer_bars(fig, d, labels)
    if d.shallow_rows:  # light bands, named at their right end (the bars leave room there)
        _bands(fig, d.shallow_rows, len(d.rows))
    fig.update_layout(barmode="stack", bargap=0.25, legend=dict(traceorder="normal"))
    most = max((r.drafting + r.verifying for r in d.rows), default=1)
    fig.update_xaxes(
        title_text="tokens through the layer",
        range=[0, most * BAR_ROOM],
        dtick=_nice_step(most * BAR_ROOM / 8),
    )
    fig.update_yaxes(
        categoryorder="array",
        categoryarray=labels,
        tickmode="array",
        tickvals=list(dict.fromkeys(d.ticks or labels)),
        tickfont=dict(size=11),
    )
    height = 150 + ROW_PX * len(d.rows)
    ell, total = d.passes.exit_layer, d.passes.n_layers
    if d.shallow_rows:
        title = f"Step {d.step}: exit at layer {ell} of {total}"
        subtitle = f"{_span(1, ell)} + {d.head.noun[4:]} draft; {_span(ell + 1, total)} verify"
    else:
        title, subtitle = f"Step {d.step}: {total} layers", "no draft in this run"
    fig = _base_layout(fig, title, height=height, subtitle=subtitle)
    # A left margin that holds the longest tick label (the head's row), so automargin never
    # widens it and the caption, placed from the figure's edge by this margin, stays inside.
    fig.update_layout(margin=dict(l=LEFT_PX))
    fig.update_yaxes(automargin=False)
    # The caption goes under the axis title; the legend row under the caption.
    return add_caption(fig, d.sentences, height, gap_px=56, below_px=92, from_figure_edge=True)


def _layer_bars(fig: go.Figure, d: LayerDiagram, labels: list[str]) -> None:
    """The drafting pass's bars and the verify pass's (the prefill's at step 0), stacked."""
    prefill = d.passes.target_kind == "prefill"
    for name, column, colour in (
        (d.head.noun if prefill else "drafting", 1, LANE_COLOURS["draft"]),
        (
            "the prefill" if prefill else "the verify pass",
            2,
            LANE_COLOURS["prefill" if prefill else "verify"],
        ),
    ):
        xs = [r[column] for r in d.rows]
        if not any(xs):
            continue
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=labels,
                x=xs,
                name=name,
                marker=dict(color=colour, line=dict(width=0.5, color="white")),
                hovertext=[r.hover for r in d.rows],
                hoverinfo="text",
            )
        )


def _bands(fig: go.Figure, shallow_rows: int, n_rows: int) -> None:
    """Light bands behind the shallow rows and the deep ones, named at their right end."""
    for y0, y1, colour, name in (
        (-0.5, shallow_rows - 0.5, SHALLOW_BAND, "shallow (drafting)"),
        (shallow_rows - 0.5, n_rows - 0.5, DEEP_BAND, "verifying"),
    ):
        fig.add_shape(
            type="rect",
            xref="paper",
            x0=0,
            x1=1,
            yref="y",
            y0=y0,
            y1=y1,
            fillcolor=colour,
            line=dict(width=0),
            layer="below",
        )
        fig.add_annotation(
            text=name,
            xref="paper",
            x=1,
            xanchor="right",
            yref="y",
            y=(y0 + y1) / 2,
            showarrow=False,
            font=dict(size=11, color="#546e7a"),
        )


def _nice_step(raw: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least `raw`: round tick steps."""
    step = 1
    while step < raw:
        for factor in (2, 5 / 2, 2):
            step = round(step * factor)
            if step >= raw:
                break
    return step


def _layer_sentences(p: StepPasses, head: ExitHead = ADAPTER) -> list[str]:
    ell, total = p.exit_layer, p.n_layers
    if p.target_kind == "prefill":
        if not head.reads_prompt:
            return [
                f"Prefill: the prompt's {p.deep} tokens ran all {total} layers ({p.target_ms:.1f} ms)."
            ]
        return [
            f"Prefill: the prompt's {p.deep} tokens ran all {total} layers, and their "
            f"layer-{ell} states {head.noun}, so its cache covers the prompt "
            f"({p.target_ms + p.draft_ms:.1f} ms)."
        ]
    if p.draft_forwards:
        first = (
            f"Drafting: {_count(p.draft_forwards, 'forward')} of {_span(1, ell)} and "
            f"{head.noun}, one token each ({p.draft_ms:.1f} ms in all)."
        )
    else:
        first = "No draft this step: the budget left room for the target's own token only."
    once = p.shallow_draft + p.shallow_verify == p.deep
    return [
        first,
        _verify_sentence(p),
        f"Every token ran {_span(1, ell)} once." if once else "",
    ]


def _verify_sentence(p: StepPasses) -> str:
    ell, total = p.exit_layer, p.n_layers
    if ell is None:
        tokens = _count(p.deep, "token")
        return f"One pass of all {total} layers over {tokens} ({p.target_ms:.1f} ms)."
    if p.deep == 1:
        reuse = f"it ran {_span(1, ell)} there first"
    elif p.shallow_verify > 1:
        runners = _runners(p.shallow_verify - 1)
        reuse = (
            f"the last draft token and {runners} ran {_span(1, ell)} there, the others' states "
            "came from drafting"
        )
    else:
        reuse = (
            f"only the last one ran {_span(1, ell)} there, the others' states came from drafting"
        )
    return (
        f"Verifying: one pass of {_span(ell + 1, total)} over {_count(p.deep, 'token')}; {reuse} "
        f"({p.target_ms:.1f} ms)."
    )


# --- the second early exit: confidence against η ------------------------------------------------


def _stop_sentence(
    stop: DraftStop, tokens: Sequence[int], texts: Mapping[int, str], head: ExitHead = ADAPTER
) -> str:
    last = repr(texts.get(tokens[-1], "?")) if tokens else ""
    eta = f"η\u00a0=\u00a0{stop.threshold:.2f}"
    if stop.reason == "confidence" and stop.confidences:
        return (
            f"Stopped after {last}: {head.noun}'s confidence {stop.confidences[-1]:.2f} is below "
            f"{eta} (the token is still verified)."
        )
    if stop.reason == "max_draft":
        return f"Stopped at γ\u00a0=\u00a0{len(tokens)}: every token cleared {eta}."
    if stop.reason == "eos":
        return f"Stopped after {last}: {head.noun} proposed an end token."
    return f"Stopped by the budget: max_new_tokens left room for {len(tokens)} draft tokens."


def _cost_sentence(events: Sequence[Event], head: ExitHead = ADAPTER) -> str:
    cost = run_cost(events)
    ell = exit_layer_of(events)
    if cost is None or not cost.drafts or ell is None:
        return ""
    return (
        f"On this run a draft forward ({_span(1, ell)} + {head.noun}) takes "
        f"{cost.draft_ratio:.0%} of the time of one of its {cost.reference}."
    )


def kangaroo_confidence(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Kangaroo's drafted tokens of one step: the adapter's confidence against η."""
    return exit_confidence_bars(events, texts, step, ADAPTER)


def layerskip_confidence(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """LayerSkip's drafted tokens of one step: the layer-E exit's confidence against η."""
    return exit_confidence_bars(events, texts, step, SHARED)


def exit_confidence_bars(
    events: Sequence[Event], texts: Mapping[int, str], step: int, head: ExitHead
) -> go.Figure:
    """The drafted tokens of one step: the exit head's confidence against η, and why drafting
    stopped."""
    stop = next((e for e in events if isinstance(e, DraftStop) and e.step == step), None)
    if stop is None:
        return _empty(f"Step {step}", "step 0 is the prefill: no draft", height=220)
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    chain = (draft.tokens if draft else ())[: len(stop.confidences)]  # runners-up follow it
    accepted = verify.accepted if verify else ()
    n_acc = sum(1 for i in accepted if i < len(chain))
    caption = [
        _stop_sentence(stop, chain, texts, head),
        _runner_up_sentence(draft, accepted, len(chain), texts, head),
        _cost_sentence(events, head),
    ]
    took = any(i >= len(chain) for i in accepted)
    return confidence_bars(
        stop,
        chain,
        n_acc,
        texts,
        caption,
        symbol="η",
        scorer=f"{head.noun[4:]}'s confidence",
        also_kept=" + a runner-up" if took else "",
    )


def _runner_up_sentence(
    draft: Draft | None,
    accepted: Sequence[int],
    n_chain: int,
    texts: Mapping[int, str],
    head: ExitHead = ADAPTER,
) -> str:
    """What the runners-up (Kangaroo's `siblings`) did this step, if there were any."""
    if draft is None or len(draft.tokens) <= n_chain:
        return ""
    extra = _runners(len(draft.tokens) - n_chain)
    took = [i for i in accepted if i >= n_chain]
    if not took:
        beside = "token" if n_chain == 1 else "tokens"
        return f"Also verified: {extra} beside the drafted {beside}; the target took none."
    node = took[-1]
    parent = draft.parents[node]
    choice = 2 + sum(1 for i in range(n_chain, node) if draft.parents[i] == parent)
    return (
        f"Also verified: {extra}; the target took {texts.get(draft.tokens[node], '?')!r}, the "
        f"{head.noun[4:]}'s {_ordinal(choice)} choice at position {depths(draft.parents)[node] + 1}, in "
        "place of the red bar."
    )


def _ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 5th: a runner-up's rank among the adapter's choices (siblings ≤ 4)."""
    return {2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _runners(n: int) -> str:
    return f"{n} runner-up" if n == 1 else f"{n} runners-up"
