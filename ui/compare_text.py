"""What a comparison says: its headline (the verdict, in words), its table's rows, the price
line. Computed from the rows `compare_methods` makes, with the readings of decoders/core/readings.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decoders.core.prices import (
    REFERENCE,
    PriceTable,
)
from decoders.core.readings import (  # the rules a reading follows, one place each
    contradicts,
    decision_margin,
    fmt_rate,
    fmt_ratio,
    fmt_speedup,
    leaders,
    speedup_range,
)
from decoders.specs import BREAK


def headline(rows: list[Mapping[str, Any]]) -> str:
    """One sentence that answers the question: who is fastest, and are the outputs the same."""
    if not rows:
        return "Nothing compared yet."
    others = [r for r in rows if r["method"] != REFERENCE]
    if not others:
        return f"Autoregressive alone: {fmt_rate(rows[0]['tokens_per_s'])} tokens/s."
    lossy = [r for r in others if r.get("lossy")]
    others = [r for r in others if not r.get("lossy")]  # the headline's race is between equals
    tail = _lossy_sentence(lossy) + _unexplained_sentence(rows)
    if not others:
        return tail.strip()
    speed = _speed_sentence(rows[0], others, decision_margin(rows))
    differ = [r for r in others if not r["identical"] and not r.get("near_tie")]
    tied = [r for r in others if r.get("near_tie")]
    ties = "".join(
        f"; {r['method']} identical up to a float near-tie at token {r['first_divergence']}"
        for r in tied
    )
    if not differ and not tied:
        n = len(others)
        same = {1: "the output is identical", 2: "both outputs identical"}.get(
            n, f"all {n} outputs identical"
        ) + " to greedy"
    elif not differ:
        same = f"{len(others) - len(tied)} of {len(others)} outputs identical to greedy{ties}"
    else:
        where = "; ".join(f"{r['method']} differs at token {r['first_divergence']}" for r in differ)
        same = (
            f"{len(others) - len(differ) - len(tied)} of {len(others)} outputs identical to "
            f"greedy; {where}{ties}"
        )
        caveat = next((r["caveat"] for r in differ if r.get("caveat")), None)
        if caveat:
            same += f" ({caveat})"
    return f"{speed}; {same}.{tail}"


def _measured(r: Mapping[str, Any]) -> str:
    low, high = r.get("speedup_range") or (None, None)
    spread = f", {fmt_speedup(low)}–{fmt_speedup(high)}" if low is not None else ""
    return f"measured {fmt_speedup(r['speedup'])}{spread}"


def _speed_sentence(
    reference: Mapping[str, Any], others: list[Mapping[str, Any]], margin: float
) -> str:
    """Who is fastest, decided on the modelled speedups (each run's work priced by the price
    table: the same on a busy machine), and said only when the lead beats the table's own error;
    the measured speedups stand beside it. Rows whose work has no modelled price (traces from
    before tables) are ranked by their clock, as measured."""
    modelled = [r for r in others if r.get("modelled_speedup") is not None]
    if len(modelled) < len(others):  # a speedup its own work cannot explain names no winner
        return _clock_sentence(reference, [r for r in others if r.get("explained", True)] or others)
    ranked = sorted(modelled, key=lambda r: r["modelled_speedup"], reverse=True)
    best = ranked[0]
    m = best["modelled_speedup"]
    fast = f"{best['method']} at {fmt_speedup(m)} modelled ({_measured(best)})"
    work = best.get("work")
    if work and reference.get("work") == work:
        return (
            f"Nothing beat autoregressive: {best['method']} did the same work (the same tokens "
            f"from the same forwards), so its {_measured(best)} is noise"
        )
    if m < 1.0 - margin:
        return f"Nothing beat autoregressive here; the closest: {fast}"
    twins = [r["method"] for r in ranked[1:] if work and r.get("work") == work]
    if twins:
        names = " and ".join([best["method"], *twins])
        return (
            f"A tie: {names} did the same work (the same tokens from the same forwards), at "
            f"{fmt_speedup(m)} modelled over autoregressive; their clocks differ by noise"
        )
    rivals = [r["method"] for r in leaders(ranked)[1]]
    if rivals:
        return (
            f"No clear winner: {best['method']} ({fmt_speedup(m)} modelled) and "
            f"{', '.join(rivals)} are within {margin:.0%} of it, too close to call (the "
            "modelled speedups' margin)"
        )
    if m > 1.0 + margin:
        return f"Fastest: {fast} over autoregressive"
    return (
        f"Nothing clearly beat autoregressive; the closest: {fast}, within the table's error of 1×"
    )


def _clock_sentence(reference: Mapping[str, Any], others: list[Mapping[str, Any]]) -> str:
    """Who is fastest by the clock alone (rows without a priced work): said only when the lead is
    more than noise; two rows that did the same work tie whatever their clocks say."""
    ranked = sorted(others, key=lambda r: r["speedup"], reverse=True)
    best = ranked[0]
    fast = f"{best['method']} at {fmt_speedup(best['speedup'])}"
    work = best.get("work")
    twins = [r["method"] for r in ranked[1:] if work and r.get("work") == work]
    if work and reference.get("work") == work:
        return (
            f"Nothing beat autoregressive: {best['method']} did the same work (the same tokens "
            f"from the same forwards), so its {fmt_speedup(best['speedup'])} is noise"
        )
    low, high = speedup_range(best)
    if high < 1.0:
        return f"Nothing beat autoregressive here; the closest: {fast}"
    if twins:
        names = " and ".join([best["method"], *twins])
        return (
            f"A tie: {names} did the same work (the same tokens from the same forwards), at "
            f"about {fmt_speedup(best['speedup'])} over autoregressive; their clocks differ by noise"
        )
    rivals = [r["method"] for r in ranked[1:] if speedup_range(r)[1] >= low]
    if rivals:
        return (
            f"No clear winner: {best['method']} ({fmt_speedup(best['speedup'])}) and "
            f"{', '.join(rivals)} tie within noise"
        )
    if low > 1.0:
        return f"Fastest: {fast} over autoregressive"
    return f"Nothing clearly beat autoregressive; the closest: {fast}, within noise of 1×"


def _unexplained_sentence(rows: list[Mapping[str, Any]]) -> str:
    """The measurements the work does not bear out: a round faster than the row's tokens per
    forward allow, or a measured range against its modelled verdict."""
    odd = [r for r in rows if not r.get("explained", True)]
    margin = decision_margin(rows)
    against = [r for r in rows if contradicts(r, margin)]
    out = ""
    if odd:
        names = ", ".join(f"{r['method']} ({_measured(r)})" for r in odd)
        out += (
            f" ⚠ {names}: a round faster than its tokens per forward allow, a measurement "
            "problem (the machine slowed another run), not a result; more rounds steady it."
        )
    if against:
        names = ", ".join(
            f"{r['method']} ({_measured(r)} against {fmt_speedup(r['modelled_speedup'])} modelled)"
            for r in against
        )
        out += (
            f" ⚠ {names}: the clock says the opposite of the work: the machine was busy, or "
            "the price table is stale: re-measure it."
        )
    return out


def _lossy_sentence(lossy: list[Mapping[str, Any]]) -> str:
    """The lossy rows in the headline: each by name when there are one or two; else the fastest
    and the one closest to greedy (the table has every row)."""
    if len(lossy) <= 2:
        return "".join(
            f" {r['method']} is lossy: {fmt_speedup(r['speedup'])}, "
            f"{r['lossless'].removeprefix('≈ lossy: ')}."
            for r in lossy
        )
    fast = max(lossy, key=lambda r: r["speedup"])
    close = max(lossy, key=lambda r: (r["agreement"], r["speedup"]))
    text = (
        f" {len(lossy)} lossy rows: the fastest, {fast['method']}, at "
        f"{fmt_speedup(fast['speedup'])} with {100 * fast['agreement']:.0f}% of tokens agreeing"
    )
    if close is not fast:
        text += (
            f"; the closest to greedy, {close['method']}, {100 * close['agreement']:.0f}% "
            f"at {fmt_speedup(close['speedup'])}"
        )
    return text + "."


TABLE_HEADERS = [
    "method spec",
    "modelled",  # the work priced by the price table: what the headline decides on
    "measured",
    "lossless",
    "tokens / s",
    "tokens / forward",
    "layers / token",
    "accept len",
    "tokens",
]


def table_rows(rows: list[Mapping[str, Any]]) -> list[list[str]]:
    """The rows as the table shows them: strings in the one number format."""
    return [
        [
            str(r["method"]).replace(":", ":" + BREAK),
            "—" if r.get("modelled_speedup") is None else fmt_speedup(r["modelled_speedup"]),
            ("⚠ " if not r.get("explained", True) else "")
            + fmt_speedup(r["speedup"])
            + (
                f" ({r['speedup_range'][0]:.2f}–{r['speedup_range'][1]:.2f})"
                if r.get("speedup_range")
                else ""
            ),
            r["lossless"],
            fmt_rate(r["tokens_per_s"]),
            fmt_ratio(r["tokens_per_target_forward"]),
            # the share of the model's layers run per token, where tokens exit early (below 1);
            # a drafting method's count of every verified input (above 1) is not this column's
            f"{r['layers_per_token']:.0%}"
            if r.get("layers_per_token") is not None and r["layers_per_token"] < 1.0
            else "—",
            fmt_ratio(r["mean_acceptance_length"]),
            str(r["new_tokens"]),
        ]
        for r in rows
    ]


def prices_line(table: PriceTable | None) -> str:
    """The price table in a sentence, beside the results it priced."""
    if table is None:
        return ""
    heads = ", ".join(f"{k} {v:.3f}" for k, v in table.drafters.items())
    return (
        f"Work is priced by this machine's table (measured {table.measured}, ±{table.spread:.0%}): "
        f"one more verified input costs {table.input_cost:.3f} of a one-token forward "
        f"({table.forward_ms:.1f} ms), a 17-input forward {table.inputs(17):.2f}"
        + (f"; a draft forward of {heads}" if heads else "")
        + ". Modelled speedups decide; measured ones stand beside them."
    )
