"""Draft & Verify's method panel: why each draft stopped, and whether drafting pays on this model.

One bar per drafted token: the skipping draft's confidence (its top probability) against the
threshold θ of that step, coloured by what the target made of the token (the shared colour
language: accepted green, first rejection red, never checked grey). The last bar carries the
reason drafting stopped (its confidence fell below θ, max_draft, the end token, or the budget).
The caption says, from the run's own Forward events, whether the method was faster or slower than
plain decoding and why. Pure: events in, Figure out (no torch, no gradio).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from decoders.core import readings
from decoders.core.events import Commit, Done, Draft, DraftStop, Event, Forward, Verify

from .figures import _base_layout, _empty, draft_panel
from .text import CAPTION_CHARS as CAPTION_CHARS  # the caption's wrap width (tests read it here)
from .text import add_caption, fmt_ratio, fmt_speedup, short_token, token_hover
from .tokens import COLOURS

THETA_COLOUR = "#c62828"
BAR_EDGE = "#546e7a"
LABELLED_BARS = 7  # up to this many drafted tokens, each bar is labelled with its text
# A median speedup within 12 % of 1x is "about as fast": identical runs differ about that much.
ABOUT = 0.12


@dataclass(frozen=True)
class RunCost:
    """What drafting cost in this run, in units of one full forward's wall time, from medians of
    the run's own forwards (one slow forward on a busy machine moves no verdict), with a spread
    from their quartiles."""

    steps: int  # decoding steps after the prefill
    tokens: int  # tokens they committed
    drafts: int  # draft forwards they ran
    draft_ratio: float  # median draft forward time / median full forward time
    full_ms: float  # the full forward's median time (the unit)
    forwards_per_step: float  # full-forward equivalents per step (drafts + its full forward)
    reference: str  # which forwards gave the unit
    spread: tuple[float, float] = (0.0, 0.0)  # forwards_per_step at the quartiles (low, high)

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps

    @property
    def speedup(self) -> float:
        """Estimated speed relative to autoregressive (one token per full forward)."""
        return self.tokens_per_step / self.forwards_per_step

    @property
    def speedup_range(self) -> tuple[float, float]:
        """The speedup at the quartiles of the forwards' times: the dearest and cheapest steps."""
        low, high = self.spread or (self.forwards_per_step, self.forwards_per_step)
        return self.tokens_per_step / high, self.tokens_per_step / low


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile); one value: that value three times."""
    if len(values) < 2:
        v = float(values[0]) if values else 0.0
        return v, v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[1], q[2]


def run_cost(events: Sequence[Event]) -> RunCost | None:
    """The run's drafting cost from its Forward events. A full forward is a one-token target pass
    when the run has enough of them, else a verify pass (1 + n tokens: a little dearer). Each
    step costs its draft forwards and its full forward, each at its kind's median time; the spread
    prices them at their quartiles (drafts dear and the unit cheap, and the other way round)."""
    forwards = [e for e in events if isinstance(e, Forward) and e.step > 0]
    drafts = [e.wall_ms for e in forwards if e.kind == "draft"]
    fulls = [e for e in forwards if e.kind in ("target", "verify")]
    singles = [e.wall_ms for e in fulls if e.kind == "target" and e.n_input_tokens == 1]
    steps = len({e.step for e in fulls})
    tokens = sum(len(e.tokens) for e in events if isinstance(e, Commit) and e.step > 0)
    if not steps or not fulls:
        return None
    unit_ms = singles if len(singles) >= 3 else [e.wall_ms for e in fulls]
    reference = "one-token target passes" if len(singles) >= 3 else "verify passes"
    u = _quartiles(unit_ms)
    if u[0] <= 0:
        return None
    d = _quartiles(drafts)
    f = _quartiles([e.wall_ms for e in fulls])

    def per_step(draft_ms: float, full_ms: float, unit: float) -> float:
        return (len(drafts) * draft_ms + len(fulls) * full_ms) / unit / steps

    return RunCost(
        steps,
        tokens,
        len(drafts),
        d[1] / u[1] if drafts else 0.0,
        u[1],
        per_step(d[1], f[1], u[1]),
        reference,
        (per_step(d[0], f[0], u[2]), per_step(d[2], f[2], u[0])),
    )


def verdict(speedup: float) -> str:
    """The verdict, "slower", "about" or "faster", reads the median-based speedup against a band
    of ±ABOUT around 1×. A verdict read off the quartiles' extremes flipped between two identical
    runs in CI (slower, then about as fast): the extremes are the noisy part of a run's times.
    Four identical runs on one box put the medians at 0.75–0.76×, the upper quartiles at 0.82–0.84×."""
    if speedup < 1.0 / (1.0 + ABOUT):
        return "slower"
    if speedup > 1.0 + ABOUT:
        return "faster"
    return "about"


def cost_sentence(cost: RunCost | None, stats: Mapping | None = None) -> str:
    """Plainly: faster or slower than plain decoding on this run, and why. The verdict is the
    run's modelled speedup read by the one rule (decoders.core.readings: its work priced by the
    price table, so two identical runs say the same on a busy machine); this run's own forward
    times give the draft's share of a forward. A trace without a modelled speedup (made before price tables) is read
    off those times' medians, "about as fast" within ABOUT of 1×."""
    if cost is None or not cost.drafts:
        return "No draft forwards in this run: nothing to weigh against plain decoding."
    low, high = cost.speedup_range
    timed = f"{fmt_speedup(cost.speedup)}, {fmt_speedup(low)}–{fmt_speedup(high)}"
    modelled = (stats or {}).get("modelled_speedup")
    if modelled is not None:
        said = readings.verdict(float(modelled), readings.decision_margin([stats or {}]))
        about = f"modelled {fmt_speedup(modelled)} from its work"
        said = {"about the same": "about"}.get(said, said)
    else:
        said, about = verdict(cost.speedup), f"about {timed}"
    per_step = (
        f"a step's {cost.drafts / cost.steps:.1f} draft forwards and one verify cost "
        f"{cost.forwards_per_step:.1f} full forwards and commit {cost.tokens_per_step:.1f} tokens"
    )
    why = (
        f"a skipping draft forward takes {cost.draft_ratio:.0%} of a full forward's time "
        f"(medians of this run's {cost.reference})"
    )
    if said == "slower":
        return (
            f"Slower than plain decoding on this model ({about}): {why}, so {per_step}. To win, "
            "a step must commit more tokens than it costs in full forwards."
        )
    if said == "faster":
        return f"Faster than plain decoding ({about}): {why}, and {per_step}."
    return f"About as fast as plain decoding ({about}): {why}, and {per_step}."


def _stop_sentence(stop: DraftStop, tokens: Sequence[int], texts: Mapping[int, str]) -> str:
    last = repr(texts.get(tokens[-1], "?")) if tokens else ""
    if stop.reason == "confidence" and stop.confidences:
        return (
            f"Stopped after {last}: its confidence {stop.confidences[-1]:.2f} is below "
            f"θ\u00a0=\u00a0{stop.threshold:.2f}."
        )
    if stop.reason == "max_draft":
        return f"Stopped at max_draft ({len(tokens)}): every token cleared θ\u00a0=\u00a0{stop.threshold:.2f}."
    if stop.reason == "eos":
        return f"Stopped after {last}: the draft proposed an end token."
    return f"Stopped by the budget: max_new_tokens left room for {len(tokens)} draft tokens."


def _stats(events: Sequence[Event]) -> dict | None:
    done = next((e for e in reversed(events) if isinstance(e, Done)), None)
    return done.stats if done else None


def self_speculative_panel(
    events: Sequence[Event], texts: Mapping[int, str], step: int
) -> go.Figure:
    """The drafted tokens of one step, their confidence against θ, and why drafting stopped."""
    stop = next((e for e in events if isinstance(e, DraftStop) and e.step == step), None)
    if stop is None:
        if not any(isinstance(e, DraftStop) for e in events):
            return draft_panel(events, texts, step)  # a trace from before DraftStop was recorded
        return _empty(f"Step {step}", "step 0 is the prefill: no draft", height=220)
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    tokens = draft.tokens if draft else ()
    n_acc = len(verify.accepted) if verify else 0
    caption = [_stop_sentence(stop, tokens, texts), cost_sentence(run_cost(events), _stats(events))]
    return confidence_bars(stop, tokens, n_acc, texts, caption, symbol="θ")


def confidence_bars(
    stop: DraftStop,
    tokens: Sequence[int],
    n_accepted: int,
    texts: Mapping[int, str],
    caption: Sequence[str],
    *,
    symbol: str,
    scorer: str = "confidence",
    also_kept: str = "",
) -> go.Figure:
    """One step of a confidence-gated draft (Draft & Verify here, Kangaroo too): a bar per drafted
    token, its confidence against the dashed threshold `symbol` (θ, η: the paper's name), coloured
    by what the target made of it. `scorer` names whose confidence it is in the hover;
    `also_kept` ends the title's count (Kangaroo: " + a runner-up")."""
    step = stop.step
    if not tokens:
        fig = _empty(f"Step {step}: no draft", "no room to draft: a plain target step", 200)
        return _caption(fig, caption, 200)

    status = [
        "accepted" if i < n_accepted else "rejected" if i == n_accepted else "not checked"
        for i in range(len(tokens))
    ]
    colour = {"accepted": COLOURS["draft"], "rejected": COLOURS["rejected"]}
    x = list(range(1, len(tokens) + 1))
    conf = list(stop.confidences) + [0.0] * (len(tokens) - len(stop.confidences))
    fig = go.Figure(
        go.Bar(
            x=x,
            y=conf,
            marker=dict(
                color=[colour.get(s, COLOURS["pending"]) for s in status],
                line=dict(width=1, color=BAR_EDGE),
            ),
            text=[fmt_ratio(c) for c in conf],
            textposition="outside",
            cliponaxis=False,
            hovertext=[
                f"{token_hover(texts.get(t, '?'), t)} · {scorer} {c:.3f} vs {symbol} "
                f"{stop.threshold:.3f} · {s}"
                for t, c, s in zip(tokens, conf, status, strict=True)
            ],
            hoverinfo="text",
            showlegend=False,
        )
    )
    # The threshold as a dashed line trace, named in the legend row under the plot (never over
    # the bars' labels).
    right = max(len(tokens), 3) + 0.6
    fig.add_trace(
        go.Scatter(
            x=[0.4, right],
            y=[stop.threshold, stop.threshold],
            mode="lines",
            line=dict(color=THETA_COLOUR, dash="dash", width=1.5),
            name=f"{symbol} = {stop.threshold:.2f}: a token below it ends the draft",
            hoverinfo="skip",
        )
    )
    many = len(tokens) > LABELLED_BARS  # too many bars to label on a phone: positions only
    if many:
        fig.update_traces(text=None, selector=dict(type="bar"))
    fig.update_xaxes(
        tickmode="array",
        tickvals=x,
        ticktext=[str(i) for i in x]
        if many
        else [short_token(texts.get(t, "?"), 5) for t in tokens],
        tickangle=0,
        tickfont=dict(size=10),
        range=[0.4, right],
    )
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%", title_text="confidence", dtick=0.25)
    title = f"Step {step}: drafted {len(tokens)}, accepted {n_accepted}{also_kept}"
    return _caption(_base_layout(fig, title, height=240), caption, 240)


def _caption(fig: go.Figure, sentences: Sequence[str], height: int) -> go.Figure:
    """The caption under the tick labels, across the figure's full width, then room for a legend
    row under it."""
    return add_caption(fig, sentences, height, gap_px=30, below_px=64, from_figure_edge=True)
