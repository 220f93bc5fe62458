"""The numbers prose may quote, each from its one source: explainers, the overview and the tour's
narrations write a placeholder, `{{source.key.reading}}`, and `fill` puts in the value the data
holds, formatted by the one number format and read by the one verdict rule (readings.py). So no
number or "faster"/"slower" claim is typed into prose, and a re-recorded tour or a new benchmark
run changes every sentence that quotes it (tests/test_facts.py holds both).

Sources (all committed, so a page and its test read the same numbers):
- `tour`: the tour's side-by-side recording (assets/tour/side_by_side.json): every stop's run on
  one prompt, rounds with one autoregressive reference, one price table. Keyed by the row's spec
  (`token_tree`; the relaxed stop's `speculative:draft=eagle:beta=4:tolerance=2` as `relaxed`).
- `bench.<name>`: a benchmark summary (assets/bench/<name>.json, written by
  `python -m decoders.bench ... --record <name>`), keyed by contestant.
- `seq2seq.<model>`: a translation model's held-out readings, from its card
  (assets/seq2seq/<model>.json): `.n`, `.<task>.<decoding>` (valid share), `.passes`, `.mixed`.
- `prices`: the price table the tour was recorded with (what a forward of n inputs and each
  drafter's forward cost, in one-token forwards).

Readings of a row: `modelled`, `measured` (the median), `range` (its rounds' lowest–highest),
`speeds` ("modelled X×, measured Y×, lo–hi×"), `tpf` (tokens per target forward), `mal` (mean
acceptance length), `rate` (draft acceptance rate), `agreement` (share of the output equal to
greedy's), `layers` (layers per token), `verdict` ("faster than" / "slower than" / "about as
fast as", then the prose says what), `group.<task group>` (a benchmark's group speedup).
Of a source: `fastest` (the fastest lossless method by modelled speedup, or a tie within the
margin), `n` (prompts). Of prices: `inputs.<n>` (a forward of n inputs), `drafter.<name>` (a
drafter's forward, as a share of a one-token forward; the name's first word: eagle, medusa,
blockwise, kangaroo, layerskip, skip).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from .prices import (  # REFERENCE: the row speedups are against
    REFERENCE,
    PriceTable,
    recorded_prices,
)
from .readings import (
    decision_margin,
    fmt_ratio,
    fmt_share,
    fmt_speedup,
    leaders,
    speedup_range,
    verdict,
)

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TOUR_RECORDING = ASSETS / "tour" / "side_by_side.json"
BENCH = ASSETS / "bench"
PLACEHOLDER = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
ALIASES = {"relaxed": "speculative:draft=eagle:beta=4:tolerance=2"}  # the tour's relaxed stop
SAID = {"faster": "faster than", "slower": "slower than", "about the same": "about as fast as"}


class UnknownFact(KeyError):
    """A placeholder no source answers: a typo, or a source that lost the row."""


@cache
def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def tour_rows() -> dict[str, dict[str, Any]]:
    """The side-by-side recording's rows, by spec."""
    return {r["method"]: r for r in _json(TOUR_RECORDING)["rows"]}


def bench_rows(name: str) -> dict[str, dict[str, Any]]:
    path = BENCH / f"{name}.json"
    if not path.is_file():
        raise UnknownFact(f"no benchmark summary {path.name} (python -m decoders.bench --record)")
    summary = _json(path)
    error = float(summary["meta"]["prices"]["spread"])  # the verdicts' margin, as the tour's
    return {k: {"price_error": error, **r} for k, r in summary["rows"].items()}


@cache
def tour_prices() -> PriceTable:
    """The price table the tour was recorded with (every stop's recording carries it)."""
    table = recorded_prices(_json(ASSETS / "tour" / f"{REFERENCE}.json"))
    if table is None:
        raise UnknownFact("the tour's recordings carry no price table")
    return table


def margin(rows: Mapping[str, Mapping[str, Any]]) -> float:
    """The verdict margin of a source: twice its table's stated error, as Compare's."""
    return decision_margin(list(rows.values()))


def said(row: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]) -> str:
    """faster than / slower than / about as fast as (plain decoding), on the modelled speedup."""
    modelled = row.get("modelled_speedup")
    if modelled is None:
        raise UnknownFact("a verdict needs a modelled speedup")
    return SAID[verdict(float(modelled), margin(rows))]


def speeds(row: Mapping[str, Any]) -> str:
    """ "modelled X×, measured Y×, lo–hi×": both speeds, as every view shows them."""
    parts = []
    if row.get("modelled_speedup") is not None:
        parts.append(f"modelled {fmt_speedup(row['modelled_speedup'])}")
    measured = f"measured {fmt_speedup(row['speedup'])}"
    if row.get("speedup_range"):
        low, high = speedup_range(row)
        measured += f", {low:.2f}–{fmt_speedup(high)}"
    return ", ".join([*parts, measured])


def exact(row: Mapping[str, Any]) -> bool:
    """Whether a row's outputs were all identical to greedy: the recording's "✓ identical", a
    benchmark's count of identical prompts equal to its prompts."""
    v = row.get("lossless")
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v == row.get("n")
    return isinstance(v, str) and v.startswith("✓")


def lossless_leaders(
    rows: Mapping[str, Mapping[str, Any]],
) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
    """The fastest lossless row by modelled speedup and its rivals within the margin, by
    Compare's rule (readings.leaders); each row carries its key as `method`."""
    lossless = [
        {**r, "method": key}
        for key, r in rows.items()
        if key != REFERENCE and not r.get("lossy") and exact(r)
    ]
    try:
        return leaders(lossless)
    except ValueError as exc:
        raise UnknownFact("no lossless row with a modelled speedup") from exc


def fastest(rows: Mapping[str, Mapping[str, Any]], titles: Mapping[str, str] | None = None) -> str:
    """The fastest lossless method, as "sam (2.97× modelled)"; rivals within the margin make it
    "sam (2.97× modelled) and token_tree (2.94× modelled), within noise of each other"."""
    best, rivals = lossless_leaders(rows)
    name = (titles or {}).get

    def one(r: Mapping[str, Any]) -> str:
        return f"{name(r['method'], r['method'])} ({fmt_speedup(r['modelled_speedup'])} modelled)"

    if rivals:
        return " and ".join(one(r) for r in [best, *rivals]) + ", within noise of each other"
    return one(best)


def _row_reading(row: Mapping[str, Any], reading: str, rows: Mapping) -> str:
    simple = {
        "modelled": lambda: fmt_speedup(row["modelled_speedup"]),
        "measured": lambda: fmt_speedup(row["speedup"]),
        "range": lambda: f"{speedup_range(row)[0]:.2f}–{fmt_speedup(speedup_range(row)[1])}",
        "speeds": lambda: speeds(row),
        "tpf": lambda: fmt_ratio(row["tokens_per_target_forward"]),
        "mal": lambda: fmt_ratio(row["mean_acceptance_length"]),
        "rate": lambda: fmt_share(row["draft_acceptance_rate"]),
        "agreement": lambda: fmt_share(row["agreement"]),
        "layers": lambda: fmt_share(row["layers_per_token"]),
        "verdict": lambda: said(row, rows),
    }
    if reading.startswith("group."):
        return fmt_speedup(row["group_speedup"][reading.removeprefix("group.")])
    if reading not in simple:
        raise UnknownFact(f"no reading {reading!r}")
    try:
        return simple[reading]()
    except (KeyError, TypeError) as exc:
        raise UnknownFact(f"the row has no {reading!r}") from exc


def _source(parts: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    if parts[0] == "tour":
        return tour_rows(), parts[1:]
    if parts[0] == "bench" and len(parts) > 1:
        return bench_rows(parts[1]), parts[2:]
    raise UnknownFact(f"no source {parts[0]!r}")


def _price(parts: list[str]) -> str:
    table = tour_prices()
    if len(parts) == 2 and parts[0] == "inputs" and parts[1].isdigit():
        return fmt_ratio(table.inputs(int(parts[1])))
    if len(parts) == 2 and parts[0] == "drafter":
        found = [v for k, v in table.drafters.items() if k.split()[0].rstrip(":") == parts[1]]
        if found:
            return fmt_share(found[0])
    raise UnknownFact(f"no price {'.'.join(parts)!r}")


def _seq2seq(parts: list[str]) -> str:
    """A translation model's held-out reading from its card (assets/seq2seq/<model>.json):
    `<model>.n` (its held-out sentences) or `<model>.<task>.<decoding>[.valid|.passes|.mixed]`."""
    path = ASSETS / "seq2seq" / f"{parts[0]}.json"
    if not path.is_file():
        raise UnknownFact(f"no translation model card {path.name}")
    held = _json(path)["held_out"]
    if parts[1:] == ["n"]:
        return str(held["n"])
    task, decoding, *field = parts[1:]
    row = next((r for r in held["rows"] if (r["task"], r["decoding"]) == (task, decoding)), None)
    if row is None or len(field) > 1:
        raise UnknownFact(f"no held-out reading {'.'.join(parts)!r}")
    name = field[0] if field else "valid"
    if name == "passes":
        return f"{row['passes']:.3g}"
    return fmt_share(row[name])


def fact(key: str, titles: Mapping[str, str] | None = None) -> str:
    """One placeholder's value, e.g. `tour.token_tree.modelled` -> "2.09×"."""
    parts = key.split(".")
    if parts[0] == "prices":
        return _price(parts[1:])
    if parts[0] == "seq2seq" and len(parts) > 2:
        return _seq2seq(parts[1:])
    rows, rest = _source(parts)
    if rest == ["fastest"]:
        return fastest(rows, titles)
    if rest == ["n"]:
        return str(next(iter(rows.values())).get("n", len(rows)))
    if len(rest) < 2:
        raise UnknownFact(f"{key!r}: say source.row.reading")
    spec = ALIASES.get(rest[0], rest[0])
    if spec not in rows:
        raise UnknownFact(f"{key!r}: no row {spec!r}")
    return _row_reading(rows[spec], ".".join(rest[1:]), rows)


def fill(text: str, titles: Mapping[str, str] | None = None) -> str:
    """The text with every placeholder replaced by its value; an unknown one raises UnknownFact
    (a page never shows braces). `titles` names methods in `fastest` (spec -> its title)."""
    return PLACEHOLDER.sub(lambda m: fact(m.group(1), titles), text)


def placeholders(text: str) -> list[str]:
    return [m.group(1) for m in PLACEHOLDER.finditer(text)]
