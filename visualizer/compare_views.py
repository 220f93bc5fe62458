"""Compare's figures: the speedup bars and the race (tokens committed against wall time).

Pure: rows and trace events in, Plotly figures out (no torch, no gradio). Rows are the dicts
`ui.compare` builds: `method` (the spec), `speedup`, `tokens_per_target_forward`, `tokens_per_s`,
and optionally `identical`. Long specs are wrapped and every axis has `automargin`, so no label is
cut at 1440 px or on a 390 px phone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from decoders.core.events import Commit, Event, Forward

from .cells import _swatch
from .figures import _base_layout, _empty
from .text import cut, fmt_ratio, fmt_speedup

# One colour per row, in row order (autoregressive, the reference, is grey and dashed).
PALETTE = (
    "#2e7d32",  # green
    "#1565c0",  # blue
    "#ef6c00",  # orange
    "#8e24aa",  # purple
    "#c62828",  # red
    "#00838f",  # teal
    "#6d4c41",  # brown
    "#ad1457",  # magenta
    "#9e9d24",  # olive
    "#212121",  # near black
    "#f9a825",  # amber
    "#64b5f6",  # light blue
    "#f06292",  # pink
    "#81c784",  # light green
    "#ba68c8",  # lilac
    "#283593",  # navy
)  # 16 hues or shades apart: Compare's default preset (15 rows) never repeats one
REFERENCE_COLOUR = "#78909c"
# A speedup bar says what the lossless badge says (visualizer.tokens): identical to greedy,
# differs, or lossy (the badge's purple, deeper).
IDENTICAL_COLOUR, DIFFERS_COLOUR, LOSSY_COLOUR = "#2e7d32", "#c62828", "#8e24aa"
INK = "#263238"  # a value written inside a pale bar
WRAP = 22  # characters per label line: fits beside the bars on a 390 px phone
# The race's plot on a 390 px phone, inside Compare's column (the figure ~330 px wide, less its
# y axis and margins): its end labels are laid out on this, apart by LABEL_GAP_PX.
PHONE_PLOT_PX = (240, 260)
LABEL_GAP_PX = 4


def colours_of(labels: Sequence[str]) -> dict[str, str]:
    """One colour per row, the same in every chart of a comparison (the speedup bars' labels, the
    race's lines, the quality chart's points): the reference grey, the others in row order."""
    return {
        label: REFERENCE_COLOUR if i == 0 else PALETTE[(i - 1) % len(PALETTE)]
        for i, label in enumerate(labels)
    }


def wrap_label(spec: str, width: int = WRAP) -> str:
    """Break a spec onto lines of about `width` characters at its ':' (a long value also at its
    spaces), joined with <br> for Plotly: 'token_tree:draft=eagle:lookup=3' ->
    'token_tree<br>:draft=eagle:lookup=3'. A KEY=VALUE is never cut inside a word."""
    pieces: list[str] = []
    for i, part in enumerate(spec.split(":")):
        part = part if i == 0 else ":" + part
        while len(part) > width and part.rfind(" ", 1, width + 1) > 0:  # a tree's choices
            cut = part.rfind(" ", 1, width + 1)
            pieces.append(part[:cut])
            part = part[cut:]
        pieces.append(part)
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + len(piece) <= width:
            lines[-1] += piece
        else:
            lines.append(piece)
    return "<br>".join(lines)


def _layout(
    fig: go.Figure, title: str, height: int, top: int, legend_on_top: bool = False
) -> go.Figure:
    """The views' shared frame (figures._base_layout), with the title lower, in a strip under
    Plotly's toolbar (a phone shows the toolbar all the time, top right, over whatever sits
    there), then the plot; `top` = the top margin (title, and the legend when it sits above the
    plot). Wrapped spec labels are wide: the axes grow their margins to fit them."""
    _base_layout(fig, title, height - 20)
    fig.update_layout(title_pad_t=fig.layout.title.pad.t + 26, margin=dict(l=10, t=top))
    if legend_on_top:  # a short legend reads best right above the bars it names
        fig.update_layout(legend=dict(yref="paper", y=1.01, yanchor="bottom"))
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


@dataclass(frozen=True)
class SpeedupBars:
    """What the speedup chart shows, one entry per row in run order."""

    labels: list[str]  # each spec wrapped, line by line in its row's colour
    speedups: list[float]
    per_forward: list[float]  # tokens per target forward
    colours: list[str]  # each speedup bar's: identical to greedy, differs, or lossy
    modelled: list[float | None]  # the speedup the cost table gives the run's work, if priced


def speedup_bars(rows: Sequence[Mapping[str, Any]]) -> SpeedupBars:
    """The speedup chart's labels, values and bar colours from Compare's rows."""
    colours_by = colours_of([str(r["method"]) for r in rows])
    # each label in its row's colour (the race's and the quality chart's)
    labels = [
        "<br>".join(
            f'<span style="color:{colours_by[str(r["method"])]}">{line}</span>'
            for line in wrap_label(str(r["method"])).split("<br>")
        )
        for r in rows
    ]
    # A lossy method is never green, even when this run happened to match greedy.
    colours = [
        LOSSY_COLOUR
        if r.get("lossy")
        else (DIFFERS_COLOUR if r.get("identical") is False else IDENTICAL_COLOUR)
        for r in rows
    ]
    return SpeedupBars(
        labels=labels,
        speedups=[float(r["speedup"]) for r in rows],
        per_forward=[float(r["tokens_per_target_forward"]) for r in rows],
        colours=colours,
        modelled=[r.get("modelled_speedup") for r in rows],
    )


def speedup_chart(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Speedup over autoregressive and tokens per target forward, one pair of horizontal bars per
    spec (the spec as the label), in the order they ran; the dotted line is 1× (the reference)."""
    if not rows:
        return _empty("Speedup over autoregressive", "run a comparison to see it here")
    d = speedup_bars(rows)
    fig = go.Figure()
    _speedup_traces(fig, d)
    # Under the bars (a value written past a bar that ends just short of 1 goes inside it instead).
    fig.add_vline(x=1.0, line_dash="dot", line_color="#607d8b", layer="below")
    # Plotly gives every row the same band: make it tall enough for the two bars and for the
    # label with the most lines, so neighbouring labels never run into each other.
    lines = max(label.count("<br>") + 1 for label in d.labels)
    band = max(46, 15 * lines + 14)
    priced = [m for m in d.modelled if m is not None]
    # Room past the longest bar for its "2.10×" text, which is drawn outside the bar.
    top = max([*d.speedups, *d.per_forward, *priced, 1.0])
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_xaxes(title_text="ratio (1 = autoregressive)", range=[0, top * 1.22])
    fig.update_yaxes(autorange="reversed")  # the reference on top, then in run order
    title = "Speedup over autoregressive"
    # Each swatch past the two bars' entries may wrap the legend onto one more row on a phone,
    # which grows upwards: room for it.
    # (the lossy swatch's long name takes a row of its own on a phone)
    room = (
        88
        + 22 * (DIFFERS_COLOUR in d.colours)
        + 44 * (LOSSY_COLOUR in d.colours)
        + 22 * bool(priced)
    )
    return _layout(fig, title, 62 + room + band * len(rows), top=room, legend_on_top=True)


def _speedup_traces(fig: go.Figure, d: SpeedupBars) -> None:
    """The two bars per row, the legend's swatches for red and purple bars, and the modelled
    speedups as diamonds."""
    fig.add_trace(
        go.Bar(
            name="speedup (×)",
            y=d.labels,
            x=d.speedups,
            orientation="h",
            marker_color=d.colours,
            text=[fmt_speedup(x) for x in d.speedups],
            textposition=_text_positions(d.speedups),
            insidetextfont=dict(color="white"),
            cliponaxis=False,
            hovertemplate="%{y}<br>%{x:.2f}× over autoregressive<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            name="tokens / forward",
            y=d.labels,
            x=d.per_forward,
            orientation="h",
            marker_color="#90caf9",
            text=[fmt_ratio(x) for x in d.per_forward],
            textposition=_text_positions(d.per_forward),
            insidetextfont=dict(color=INK),
            cliponaxis=False,
            hovertemplate="%{y}<br>%{x:.2f} tokens per target forward<extra></extra>",
        )
    )
    # The legend names the red and purple bars too: legend-only swatches (scatters: an empty bar
    # trace would still take a slot in every row's group).
    if DIFFERS_COLOUR in d.colours:
        fig.add_trace(_swatch(DIFFERS_COLOUR, "speedup (×), output differs from greedy"))
    if LOSSY_COLOUR in d.colours:
        fig.add_trace(_swatch(LOSSY_COLOUR, "speedup (×), lossy method"))
    if any(
        m is not None for m in d.modelled
    ):  # each run's work priced by the table, beside its clock
        fig.add_trace(
            go.Scatter(
                name="modelled speedup (its work)",
                y=d.labels,
                x=d.modelled,
                mode="markers",
                marker=dict(symbol="diamond", size=9, color=INK, line=dict(color="white", width=1)),
                hovertemplate="%{y}<br>%{x:.2f}× modelled from its work<extra></extra>",
            )
        )


def _text_positions(values: Sequence[float]) -> list[str]:
    """Each bar's value outside its end, except where the bar ends just short of the 1× line:
    written outside, "0.97×" would run across the line; inside, the bar hides the line."""
    return ["inside" if 0.8 <= v < 1.0 else "outside" for v in values]


def race_points(
    events: Sequence[Event], commit_s: Sequence[float] | None = None
) -> tuple[list[float], list[int]]:
    """Tokens committed so far against time (seconds from the run's start, prefill included),
    starting at (0, 0). Times are the commits' measured arrival times when the trace has them
    (`commit_s`, one per Commit event), else the clock of its forward passes (Forward.wall_ms,
    which leaves out the work between forwards)."""
    commits = [e for e in events if isinstance(e, Commit)]
    if commit_s is not None and len(commit_s) != len(commits):
        commit_s = None  # not this trace's clock; fall back to the forwards'
    times, tokens = [0.0], [0]
    clock_ms = 0.0
    for e in events:
        if isinstance(e, Forward):
            clock_ms += e.wall_ms
        elif isinstance(e, Commit):
            at = commit_s[len(times) - 1] if commit_s is not None else clock_ms / 1000.0
            times.append(max(at, times[-1]))
            tokens.append(tokens[-1] + len(e.tokens))
    return times, tokens


def race_chart(runs: Sequence[tuple[str, Sequence[Event], Sequence[float] | None]]) -> go.Figure:
    """The race: one line per run, tokens committed against wall time, so the speedup is seen.
    `runs`: (label, events, commit times or None); the first run is the reference (grey, dashed).
    A steeper line is a faster method; a tall step is many tokens accepted by one forward."""
    if not runs:
        return _empty("Race: tokens committed against time", "run a comparison to see it here")
    fig = go.Figure()
    colours = colours_of([label for label, _, _ in runs])
    ends: list[tuple[float, int, str, str]] = []
    for i, (label, events, commit_s) in enumerate(runs):
        times, tokens = race_points(events, commit_s)
        colour = colours[label]
        fig.add_trace(
            go.Scatter(
                x=times,
                y=tokens,
                name=wrap_label(label, 28),
                mode="lines",
                line=dict(color=colour, width=2.5, shape="hv", dash="dash" if i == 0 else None),
                hovertemplate="%{fullData.name}<br>%{x:.2f} s · %{y} tokens<extra></extra>",
            )
        )
        ends.append((times[-1], tokens[-1], label.split(" · ")[0], colour))
    # Each line's name where it ends (the first to finish is the fastest), so a reader need not
    # match fifteen colours to the legend; a name that would cover another is left to the legend.
    span_t = max((t for t, _, _, _ in ends), default=1.0) or 1.0
    span_n = max((n for _, n, _, _ in ends), default=1) or 1
    order = sorted(range(len(ends)), key=lambda i: ends[i][0])
    placed = place_labels(
        [(ends[i][0], float(ends[i][1]), cut(ends[i][2], 14)) for i in order],
        (0.0, span_t * 1.02),
        (0.0, span_n * 1.05),
    )
    where = {i: w for i, w in zip(order, placed, strict=True)}
    fig.add_trace(
        go.Scatter(
            x=[t for t, _, _, _ in ends],
            y=[n for _, n, _, _ in ends],
            mode="markers+text",
            text=[cut(name, 14) if where[i] else "" for i, (_, _, name, _) in enumerate(ends)],
            textposition=[where[i] or "middle left" for i in range(len(ends))],
            textfont=dict(size=9, color=[c for _, _, _, c in ends]),
            marker=dict(size=6, color=[c for _, _, _, c in ends]),
            hoverinfo="skip",
            showlegend=False,
            name="line ends",
        )
    )
    fig.update_xaxes(title_text="wall time (s), prefill included", rangemode="tozero")
    # Outside ticks (drawn white) keep the y axis' "0" clear of the x axis' "0" at the origin.
    fig.update_yaxes(
        title_text="tokens committed",
        rangemode="tozero",
        ticks="outside",
        ticklen=6,
        tickcolor="white",
    )
    # Many long specs: the legend sits at the foot of the figure (the shared frame's place for
    # it) and the plot makes room for it.
    fig = _layout(fig, "Race: tokens committed against time", 400 + 22 * len(runs), top=64)
    fig.update_layout(hovermode="closest")
    return fig


def quality_chart(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Lossy methods' quality against speed: agreement with greedy (y) against speedup (x), one
    point per lossy row, each family of settings (calm:…, hash_ee:…) joined as its curve;
    autoregressive, the reference, is the grey point at (1, 1) (exact rows are not drawn).
    Hover: ROUGE-L and the decoder layers run per token."""
    lossy = [r for r in rows if r.get("lossy")]
    if not lossy:
        return _empty("Quality against speed", "no lossy method ran: every output is greedy's")
    families: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("lossy") or r.get("name") == "autoregressive":
            name = str(r.get("name", r["method"]))
            if "beta=" in str(r["method"]):  # a lossless method made lossy by relaxed verification
                name += " (relaxed β, τ)"
            families.setdefault(name, []).append(r)
    fig = go.Figure()
    colours = colours_of([str(r["method"]) for r in rows])
    for name, members in families.items():
        members = sorted(members, key=lambda r: float(r["speedup"]))
        is_ref = name == "autoregressive"
        fig.add_trace(
            go.Scatter(
                x=[float(r["speedup"]) for r in members],
                y=[float(r.get("agreement", 1.0)) for r in members],
                mode="markers" if is_ref else "lines+markers",
                name=name,
                # each point the colour its row has in the race; the line its first row's
                marker=dict(size=11, color=[colours[str(r["method"])] for r in members]),
                line=dict(color=colours[str(members[0]["method"])]),
                text=[
                    f"{r['method']}<br>{float(r['speedup']):.2f}× · agreement "
                    f"{float(r.get('agreement', 1.0)):.0%} · ROUGE-L "
                    f"{float(r.get('rouge_l', 1.0)):.2f}"
                    + (
                        ""
                        if r.get("layers_per_token") is None
                        else f" · {float(r['layers_per_token']):.0%} of the layers"
                    )
                    + (  # where tokens left, when the skipped layers still ran (fill=compute)
                        f" · left at {float(r['exit_depth']):.0%}"
                        if r.get("exit_depth") is not None
                        and r.get("layers_per_token") is not None
                        and float(r["exit_depth"]) < float(r["layers_per_token"]) - 0.005
                        else ""
                    )
                    for r in members
                ],
                hoverinfo="text",
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#607d8b")
    fig.add_vline(x=1.0, line_dash="dot", line_color="#607d8b")
    fig.update_xaxes(title_text="speedup over autoregressive (×)", rangemode="tozero")
    fig.update_yaxes(title_text="token agreement with greedy", range=[0, 1.08])
    # a legend row per family on a phone: the plot keeps its height under them (its vertical
    # axis title ran into the title when six families squeezed it)
    height = 300 + 24 * len(families)
    return _layout(fig, "Quality against speed (lossy runs)", max(360, height), top=70)


def place_labels(
    points: Sequence[tuple[float, float, str]],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    plot_px: tuple[int, int] = PHONE_PLOT_PX,
) -> list[str | None]:
    """A text position for each point's label ("middle right", "middle left", "top center",
    "bottom center"), the first whose box (10 px text, about 6 px a character, on a plot of
    `plot_px`: a phone's unless said) keeps LABEL_GAP_PX from every point and every label placed
    before it and stays inside the plot; None where none fits (the legend and the hover still
    name the point). Points are labelled in the order given. A figure does not know its width,
    so the boxes are laid out on the narrowest plot it is drawn in: on a wider one they only
    move further apart."""
    (x0, x1), (y0, y1) = x_range, y_range
    w, h = plot_px

    def px(x: float, y: float) -> tuple[float, float]:
        return (x - x0) / (x1 - x0) * w, (y1 - y) / (y1 - y0) * h

    dots = [px(x, y) for x, y, _ in points]
    boxes: list[tuple[float, float, float, float]] = [
        (cx - 5, cy - 5, cx + 5, cy + 5) for cx, cy in dots
    ]
    out: list[str | None] = []
    for (cx, cy), (_, _, text) in zip(dots, points, strict=True):
        tw, th = 6.0 * len(text), 13.0
        options = {
            "middle right": (cx + 7, cy - th / 2, cx + 7 + tw, cy + th / 2),
            "middle left": (cx - 7 - tw, cy - th / 2, cx - 7, cy + th / 2),
            "top center": (cx - tw / 2, cy - 7 - th, cx + tw / 2, cy - 7),
            "bottom center": (cx - tw / 2, cy + 7, cx + tw / 2, cy + 7 + th),
        }
        chosen = None
        for name, (a, b, c, d) in options.items():
            inside = a >= 0 and c <= w and b >= 0 and d <= h
            clear = all(  # dots (the first boxes) as they are, labels kept LABEL_GAP_PX apart
                c + gap <= e or a >= g + gap or d + gap <= f or b >= k + gap
                for n, (e, f, g, k) in enumerate(boxes)
                for gap in (0 if n < len(dots) else LABEL_GAP_PX,)
            )
            if inside and clear:
                chosen = name
                boxes.append((a, b, c, d))
                break
        out.append(chosen)
    return out


def why_faster(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Why a method is faster, from measured rows: tokens per target forward (x) against the
    speedup over autoregressive (y), one point per lossless row, labelled where its name fits
    without covering another (the fastest first; every point names itself on hover); on the
    dotted line y = x a wider forward would cost nothing, and a point's distance below it is
    what its wider forwards and its drafting cost on the machine that measured it."""
    exact = [r for r in rows if not r.get("lossy")]
    if not exact:
        return _empty("Why a method is faster", "no lossless row was measured")
    top = max(max(r["tokens_per_target_forward"] for r in exact), 1.0) * 1.08
    high = max(
        top,
        max(max(float(r["speedup"]), float(r.get("modelled_speedup") or 0)) for r in exact) * 1.1,
    )
    x_range, y_range = (0.9, top), (0.0, high)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[1, top],
            y=[1, top],
            mode="lines",
            line=dict(dash="dot", color=REFERENCE_COLOUR),
            name="if a wider forward cost nothing",
            hoverinfo="skip",
        )
    )
    ordered = sorted(exact, key=lambda r: -float(r["speedup"]))
    where = place_labels(
        [(r["tokens_per_target_forward"], float(r["speedup"]), str(r["method"])) for r in ordered],
        x_range,
        y_range,
    )
    fig.add_trace(
        go.Scatter(
            x=[r["tokens_per_target_forward"] for r in ordered],
            y=[r["speedup"] for r in ordered],
            mode="markers+text",
            text=[str(r["method"]) if w else "" for r, w in zip(ordered, where, strict=True)],
            textposition=[w or "middle right" for w in where],
            textfont=dict(size=10),
            marker=dict(size=9, color=PALETTE[0]),
            hovertext=[
                f"{r['method']}: {r['tokens_per_target_forward']:.2f} tokens per forward, "
                f"{fmt_speedup(r['speedup'])} measured"
                for r in ordered
            ],
            hoverinfo="text",
            name="measured, lossless (hover: each)",
        )
    )
    modelled = [r for r in ordered if r.get("modelled_speedup") is not None]
    if modelled:  # the same runs' work priced by the price table: the speed the clock should read
        fig.add_trace(
            go.Scatter(
                x=[r["tokens_per_target_forward"] for r in modelled],
                y=[r["modelled_speedup"] for r in modelled],
                mode="markers",
                marker=dict(size=9, color=PALETTE[0], symbol="circle-open"),
                hovertext=[
                    f"{r['method']}: {fmt_speedup(r['modelled_speedup'])} modelled from its work"
                    for r in modelled
                ],
                hoverinfo="text",
                name="modelled from the same runs' work",
            )
        )
    fig.add_hline(y=1.0, line=dict(color="#cfd8dc", width=1))
    fig.update_xaxes(title_text="tokens per target forward", range=list(x_range))
    fig.update_yaxes(title_text="speedup over autoregressive (×)", range=list(y_range))
    return _layout(fig, "Why a method is faster (measured here)", height=420, top=70)
