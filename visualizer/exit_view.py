"""Early exit's views (CALM, FREE, HASH EE): where each token left the model.

- `exit_heatmap`: output tokens × exit layers. A cell is the confidence a token reached at that
  exit (CALM; blank where no exit was offered), the ◆ marks where it left (the top row, L, is the
  full model), and the current step's column is outlined;
- `exit_confidence`: one token's confidence at each exit on the way up against the threshold
  (CALM): the first bar above the line is where it left;
- `hash_layers`: HASH EE's token → layer table for the input tokens on screen;
- `catch_ups`: FREE's synchronized passes: the held-back tokens each caught up, whether the deep
  model agreed with them, and the threshold as it adapted.

What the heatmap shows is computed in exit_data (plain data); this module draws it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoders.core.events import CatchUp, Event, LayerExit

from .cells import _tok
from .exit_data import WINDOW as WINDOW
from .exit_data import ExitMap, _exits, _oracle, _outputs, exit_map
from .figures import SUBTITLE_CHARS, _base_layout, _empty
from .text import escape, short_token, visible, wrap

EARLY_EXIT = ("calm", "free", "hash_ee")  # the methods these views draw
MAX_TOKEN_TICKS = 8  # labelled tokens under it (hover names every one): slanted, they fit a phone
EXIT_MARK = "#37474f"


def _none(title: str, events: Sequence[Event], step: int) -> go.Figure:
    if step == 0 and _exits(events):
        return _empty(title, "step 0 is the prefill: the first token comes from the full model")
    return _empty(title, "this trace has no layer exits (not a calm, free or hash_ee run)")


def _exit_traces(fig: go.Figure, m: ExitMap, texts: Mapping[int, str]) -> None:
    """The confidences as a heatmap (when any exit was offered), then a ◆ where each token left."""
    x = [e.position for e in m.shown]
    if any(v is not None for row in m.z for v in row):
        fig.add_trace(
            go.Heatmap(
                z=m.z,
                x=x,
                y=m.y,
                zmin=0.0,
                zmax=1.0,
                colorscale="Blues",
                colorbar=dict(
                    title=dict(text="oracle score" if m.oracle else "confidence", side="right"),
                    thickness=10,
                    len=0.8,
                ),
                text=m.hover,
                hoverinfo="text",
                xgap=1,
                ygap=1,
                name="confidence",
            )
        )
    outputs = m.outputs
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[m.y[m.rows.index(e.layer)] for e in m.shown],
            mode="markers",
            marker=dict(symbol="diamond", size=9, color=EXIT_MARK),
            name="left the model here",
            text=[
                f"token {e.position}: "
                f"{_tok(texts, outputs[e.position] if e.position < len(outputs) else None)}"
                f"<br>left after layer {e.layer} of {m.n_layers}"
                for e in m.shown
            ],
            hoverinfo="text",
        )
    )


def _exit_note(m: ExitMap) -> str:
    """How many tokens left early and from what depth, the rule, and which tokens are shown."""
    note = (
        f"{m.early} of the {m.exits} tokens after the prefill's left early; they were written "
        f"from {m.depth:.0%} of the depth on average (the layers a token skipped may still run "
        "later, for its keys and values)"
    ) + (
        "; layer = hash(input)"
        if m.rule == "hash"
        else "; the oracle: 1 where an exit gives the full model's token"
        if m.oracle
        else "; λ_t per token in the hover"
    )
    if len(m.shown) < m.exits:  # the window follows the step: say which tokens it shows
        note += f"; shown: tokens {m.shown[0].position}–{m.shown[-1].position}, around this step's"
    return note


def exit_heatmap(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """Where each token around `step` left the model (see the module doc)."""
    title = "Where each token left the model"
    m = exit_map(events, texts, step)
    if m is None:
        return _none(title, events, step)
    fig = go.Figure()
    _exit_traces(fig, m, texts)
    if m.now is not None:
        fig.add_vrect(
            x0=m.now.position - 0.5,
            x1=m.now.position + 0.5,
            line=dict(color="#ef6c00", width=2),
            fillcolor="rgba(0,0,0,0)",
        )
    x = [e.position for e in m.shown]
    labelled = x[:: max(1, math.ceil(len(x) / MAX_TOKEN_TICKS))]  # slanted labels stay apart
    fig.update_xaxes(
        title_text="output token",
        tickmode="array",
        tickvals=labelled,
        ticktext=[
            short_token(texts.get(m.outputs[p], "?"), 5) if p < len(m.outputs) else "?"
            for p in labelled
        ],
        tickangle=-60,
    )
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=m.y, title_text="exit")
    return _base_layout(
        fig,
        title,
        height=min(520, 200 + 26 * len(m.rows)),
        subtitle=wrap(_exit_note(m), SUBTITLE_CHARS),
    )


def exit_confidence(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    title = f"Step {step}: confidence at each exit"
    exits = _exits(events)
    now = next((e for e in exits if e.step == step), None)
    if now is None:
        return _none(title, events, step)
    if not now.layers:
        reason = (
            "no exit was offered below this token's layer"
            if now.rule == "confidence"
            else "HASH EE weighs no confidence: the input token's hash chose the layer"
        )
        return _empty(title, reason)
    outputs = _outputs(events)
    tok = outputs[now.position] if now.position < len(outputs) else None
    oracle = _oracle(events)
    colours = [
        "#ef6c00" if ell == now.layer else ("#90caf9" if c <= now.threshold else "#1e88e5")
        for ell, c in zip(now.layers, now.confidences, strict=True)
    ]
    fig = go.Figure(
        go.Bar(
            x=[f"ℓ {ell}" for ell in now.layers],
            y=list(now.confidences),
            marker_color=colours,
            text=[f"{c:.2f}" for c in now.confidences],
            textposition="outside",
            hovertext=[
                (
                    f"layer {ell}: {'gives' if c else 'misses'} the full model's token<br>"
                    if oracle
                    else f"layer {ell}: confidence {c:.3f}<br>"
                )
                + (
                    "left here"
                    if ell == now.layer
                    else ("went on" if oracle else "below λ: went on")
                )
                for ell, c in zip(now.layers, now.confidences, strict=True)
            ],
            hoverinfo="text",
            name="confidence",
        )
    )
    # The threshold's value goes in the subtitle: a label on the line collided with a bar's own
    # value whenever a confidence reached the top (the oracle's are 0 or 1).
    if not oracle:
        fig.add_hline(y=now.threshold, line_dash="dash", line_color="#c62828")
    fig.update_yaxes(range=[0, 1.12], title_text="oracle score" if oracle else "confidence")
    fig.update_xaxes(title_text="exit layer")
    where = (
        f"left after layer {now.layer} of {now.n_layers}"
        if now.layer < now.n_layers
        else ("no exit gave it" if oracle else "no exit passed λ_t") + ": the full model wrote it"
    )
    rule = (
        " · the oracle: the first exit that gives the full model's token"
        if oracle
        else f" · dashed: λ_t\u00a0=\u00a0{now.threshold:.3f}"  # kept on one line by wrap()
    )
    note = f"token {now.position} {escape(visible(texts.get(tok, '?')))!s}: {where}{rule}"
    return _base_layout(fig, title, height=300, subtitle=wrap(note, SUBTITLE_CHARS))


def hash_layers(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    title = "HASH EE: token → exit layer"
    exits = [e for e in _exits(events) if e.rule == "hash"]
    if not exits:
        return _empty(title, "this trace has no hashed exits (not a hash_ee run)")
    outputs = _outputs(events)
    seen: dict[int, int] = {}
    count: Counter[int] = Counter()
    for e in exits:  # the input of output token t is output token t - 1
        if 0 < e.position <= len(outputs):
            x = outputs[e.position - 1]
            seen[x] = e.layer
            count[x] += 1
    order = sorted(seen, key=lambda t: (seen[t], -count[t]))
    n_layers = exits[0].n_layers
    layer_text = [f"{seen[t]}" + (" (full)" if seen[t] == n_layers else "") for t in order]
    # A table cell drops a token's leading and trailing spaces, so " the" and "the" would read
    # the same: such tokens show their spaces as ␣, and their ids.
    raw = [visible(texts.get(t, "?")) for t in order]
    looks = [v.strip() for v in raw]
    shown = [
        f"{escape(v.replace(' ', '␣'))}  (id {t})" if looks.count(k) > 1 else escape(v)
        for v, k, t in zip(raw, looks, order, strict=True)
    ]
    fig = go.Figure(
        go.Table(
            header=dict(values=["input token", "exits after layer", "times on screen"]),
            cells=dict(
                values=[
                    shown,
                    layer_text,
                    [count[t] for t in order],
                ]
            ),
        )
    )
    height = min(520, 160 + 24 * len(order))
    fits = (height - 160) // 24
    note = f"{len(order)} distinct input tokens; frequent tokens hash to shallow exits"
    if len(order) > fits:  # Plotly's table scrolls inside itself with no scroll bar of its own
        note += f" · ↕ scroll the table: {len(order) - fits} more rows below"
    return _base_layout(fig, title, height=height, subtitle=wrap(note, SUBTITLE_CHARS))


def catch_ups(events: Sequence[Event], texts: Mapping[int, str], step: int) -> go.Figure:
    """FREE's synchronized passes: for each step that ran the deep layers, the held-back tokens it
    caught up (the deep model agreed with the shallow token, or not), and the shallow exit's
    threshold λ as it adapted."""
    title = "FREE: held-back tokens caught up"
    passes = sorted((e for e in events if isinstance(e, CatchUp)), key=lambda e: e.step)
    if not passes:
        if any(isinstance(e, LayerExit) for e in events):
            return _empty(title, "no token held back in this run")
        return _empty(title, "this trace has no catch-up passes (not a free run)")
    x = [e.step for e in passes]
    agree = [sum(e.agreed) for e in passes]
    differ = [len(e.agreed) - sum(e.agreed) for e in passes]
    hover = [
        f"step {e.step}: caught up tokens {', '.join(map(str, e.positions[:12]))}"
        + ("…" if len(e.positions) > 12 else "")
        + f"<br>deep agreed on {sum(e.agreed)} of {len(e.agreed)} · λ after: {e.threshold:.3f}"
        for e in passes
    ]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=agree,
            width=0.8,  # one step wide: Plotly widens bars to fill the gaps between sparse steps
            name="deep model agreed",
            marker_color="#a5d6a7",
            hovertext=hover,
        )
    )
    fig.add_trace(
        go.Bar(
            x=x,
            y=differ,
            width=0.8,
            name="deep model differed",
            marker_color="#ef9a9a",
            hovertext=hover,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[e.threshold for e in passes],
            mode="lines+markers",
            name="λ after the pass",
            yaxis="y2",
            line=dict(color="#c62828", dash="dash"),
            hoverinfo="skip",
        )
    )
    now = next((e for e in passes if e.step == step), None)
    if now is not None:
        fig.add_vline(x=step, line=dict(color="#ef6c00", width=2))
    fig.update_layout(
        barmode="stack",
        yaxis=dict(title="tokens caught up", rangemode="tozero"),  # the left axis only
        yaxis2=dict(
            overlaying="y", side="right", range=[0, 1.05], title="λ after the pass", showgrid=False
        ),
    )
    fig.update_xaxes(title_text="step (a deep pass)")
    total = sum(len(e.positions) for e in passes)
    note = (
        f"{total} held-back tokens caught up in {len(passes)} passes; the deep model agreed on "
        f"{sum(agree)}"
    )
    return _base_layout(fig, title, height=300, subtitle=wrap(note, SUBTITLE_CHARS))


def quality_point(
    points: Sequence[Mapping], method: str, agreement: float | None, layers: float | None
) -> go.Figure:
    """A lossy run against its family's measured curve: agreement with greedy (y) against the
    decoder layers run per token (x), one point per benchmarked setting of `method` (and the
    other early-exit methods, fainter), and this run as a star. `points`: the benchmark's
    `quality_points.json` rows (spec, method, agreement, layers_per_token, speedup)."""
    title = "This run on its benchmarked curve"
    # Early exit's curves only: relaxed verification's rows (lossy too) run more than the layers
    # of one forward per token and would stretch the axis away from these.
    usable = [
        p
        for p in points
        if p.get("layers_per_token") is not None and str(p["method"]) in EARLY_EXIT
    ]
    if not usable and agreement is None:
        return _empty(title, "no benchmark curve for this model, and no agreement yet")
    fig = go.Figure()
    families: dict[str, list[Mapping]] = {}
    for p in usable:
        families.setdefault(str(p["method"]), []).append(p)
    for name, rows in sorted(families.items(), key=lambda kv: kv[0] != method):
        rows = sorted(rows, key=lambda p: p["layers_per_token"])
        mine = name == method
        fig.add_trace(
            go.Scatter(
                x=[p["layers_per_token"] for p in rows],
                y=[p["agreement"] for p in rows],
                mode="lines+markers",
                name=f"{name} (benchmark)",
                # every curve named in the legend: the other families as faint context
                showlegend=True,
                opacity=1.0 if mine else 0.35,
                line=dict(width=2 if mine else 1),
                text=[
                    f"{escape(str(p['spec']))}<br>agreement {p['agreement']:.0%} · "
                    f"{p['layers_per_token']:.0%} of the layers"
                    + ("" if p.get("speedup") is None else f" · {p['speedup']:.2f}×")
                    for p in rows
                ],
                hoverinfo="text",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[1.0],
            y=[1.0],
            mode="markers",
            name="autoregressive",
            marker=dict(color="#78909c", size=10),
            hoverinfo="name",
        )
    )
    if agreement is not None and layers is not None:
        fig.add_trace(
            go.Scatter(
                x=[layers],
                y=[agreement],
                mode="markers",
                name="this run",
                marker=dict(symbol="star", size=16, color="#ef6c00", line=dict(width=1)),
                text=[f"this run: agreement {agreement:.0%} · {layers:.0%} of the layers"],
                hoverinfo="text",
            )
        )
        note = (
            f"this run: {agreement:.0%} agree, {layers:.0%} of the layers computed per token "
            "(skipped layers run later to fill the cache count)"
        )
    else:
        note = "this run's point appears once its agreement with greedy is checked"
    fig.update_xaxes(title_text="decoder layers per token (share)")
    fig.update_yaxes(title_text="agreement with greedy", range=[0, 1.05])
    # On a phone the legend takes a row per entry, out of the figure's height: without room for
    # them the plot shrank below its axis title, which ran up into the subtitle.
    return _base_layout(fig, title, height=300 + 22 * len(fig.data), subtitle=note)
