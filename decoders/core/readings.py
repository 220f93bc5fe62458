"""How a run's numbers are read, in one place: the number formats, a speedup's range, the margin
that names a winner, the verdict (faster / slower / about the same as plain decoding), whether a
measured range contradicts it, and whether a run's own work can explain its speed. Compare, the
Run tab, the tour, Learn's explainers (decoders/core/facts.py) and the benchmark read runs through
these; none works a verdict out on its own. Rows are plain mappings (a run's stats plus
`speedup`, `modelled_speedup`, `speedup_range`, `price_error`), so no torch here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# How far one run's speed moves between identical runs on a shared 2-core CPU, either side: a
# speedup from one run is read as a range this wide (several rounds measure their own).
NOISE = 0.10
# How far past its tokens per forward (over its share of the layers) a speedup may go before it is
# flagged as a measurement problem. Loose on purpose: on this CPU a one-token forward is not the
# cheapest per input (the tour's recordings: 53-68 ms for 1 input, 52-58 ms for 4-5), so a
# method verifying a few inputs a forward can beat its tokens per forward by some percent; the
# issue's 6.52x at 2.91 tokens per forward is far past this.
UNEXPLAINED = 0.25
# The least lead, as a share, that names a winner or a verdict on modelled speedups
# (decision_margin): the model's own error against the clock on a quiet machine, most methods
# within ±5 % (docs/BENCHMARKS.md, 2026-12-02), beyond the table's timing spread (about 2 %).
MIN_MARGIN = 0.05


# --- number formats (Compare's table, headline and charts, the panels' captions, the explainers) -


def fmt_ratio(x: float | None) -> str:
    """Ratios (tokens per forward, acceptance lengths): 2 decimals."""
    return "—" if x is None else f"{x:.2f}"


def fmt_speedup(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def fmt_rate(x: float | None) -> str:
    """Tokens per second (and other counts per unit): 1 decimal."""
    return "—" if x is None else f"{x:.1f}"


def fmt_share(x: float | None) -> str:
    """A share (of a forward, of the layers, of the output): a whole percent."""
    return "—" if x is None else f"{x:.0%}"


# --- verdicts -------------------------------------------------------------------------------------


def speedup_range(r: Mapping[str, Any]) -> tuple[float, float]:
    """A row's speedup as a range: the lowest and highest of its runs, or, from one run, the
    noise one run carries here (NOISE either side)."""
    if r.get("speedup_range"):
        low, high = r["speedup_range"]
        return float(low), float(high)
    return r["speedup"] * (1 - NOISE), r["speedup"] * (1 + NOISE)


def decision_margin(rows: Sequence[Mapping[str, Any]]) -> float:
    """How far apart two modelled speedups must be to call one faster: twice the price table's
    stated error (its rounds' spread), at least MIN_MARGIN."""
    error = max((float(r.get("price_error") or 0.0) for r in rows), default=0.0)
    return max(MIN_MARGIN, 2 * error)


def verdict(speedup: float, margin: float) -> str:
    """faster / slower / about the same as autoregressive, for a modelled speedup."""
    if speedup > 1 + margin:
        return "faster"
    return "slower" if speedup < 1 - margin else "about the same"


def contradicts(r: Mapping[str, Any], margin: float) -> bool:
    """Whether a row's measured range says the opposite of its modelled verdict: modelled faster
    and every round slower than autoregressive, or the other way round."""
    modelled = r.get("modelled_speedup")
    if modelled is None:
        return False
    low, high = speedup_range(r)
    said = verdict(float(modelled), margin)
    return (said == "faster" and high < 1.0) or (said == "slower" and low > 1.0)


def explained(r: Mapping[str, Any]) -> bool:
    """Whether a row's speedup is one its own work can explain: a method is at most as fast as
    its tokens per target forward over the share of the layers it ran per token (a forward that
    cost nothing to widen and drafting that cost nothing), give or take UNEXPLAINED. Beyond
    that, the clock measured something else (a reference run slowed by the machine)."""
    # layers per token counts every verified input (above 1 for a tree); below 1 only where
    # tokens exit early, which is what lets one token a forward run faster; where the layers a
    # token skipped run later, batched (fill=compute), where it left bounds its sequential cost
    layers = min(float(r.get("layers_per_token") or 1.0), float(r.get("exit_depth") or 1.0), 1.0)
    bound = float(r.get("tokens_per_target_forward") or 1.0) / max(layers, 0.05)
    fastest = max([float(r["speedup"]), *(r.get("speedup_range") or ())])  # any round
    return fastest <= bound * (1 + UNEXPLAINED)


def leaders(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
    """The fastest row by modelled speedup, and the rows within the margin of it (a tie with
    them: no winner named). Rows without a modelled speedup are left out; none: ValueError."""
    ranked = sorted(
        (r for r in rows if r.get("modelled_speedup") is not None),
        key=lambda r: r["modelled_speedup"],
        reverse=True,
    )
    if not ranked:
        raise ValueError("no row has a modelled speedup")
    best, m = ranked[0], ranked[0]["modelled_speedup"]
    margin = decision_margin(rows)
    return best, [r for r in ranked[1:] if r["modelled_speedup"] * (1 + margin) >= m]
