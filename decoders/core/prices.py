"""The price table's shape, without torch (stats and saved traces read it): what a forward costs
on one machine, in one-token target forwards. decoders/core/costs.py measures and keeps it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# The one-token-a-forward loop every cost is priced against, by its registry name: the price
# table measures it beside the rest, and every speedup is a ratio to it. The one place the
# engine core names it.
REFERENCE = "autoregressive"

WIDTHS = (1, 2, 4, 8, 17, 32)  # 17: the input price's reference width (1 + 16 inputs)
CONTEXT = 64  # the cache the shapes are measured after
ROUNDS = 7
PROCEDURE = (
    f"medians of {ROUNDS} rounds in which forwards of {', '.join(map(str, WIDTHS))} inputs and a "
    f"half-depth forward take turns after a {CONTEXT}-token cache, each shape warmed up twice, "
    "on this process's torch threads"
)


@dataclass(frozen=True)
class PriceTable:
    """What a forward costs on one machine, in one-token target forwards (decoders/core/costs.py
    says what each field is and how it is measured)."""

    model: str
    machine: str
    forward_ms: float
    widths: tuple[int, ...]
    curve: tuple[float, ...]
    fixed_share: float
    spread: float
    drafters: Mapping[str, float] = field(default_factory=dict)
    # per method: (its forwards' measured cost over their priced shapes, its time between
    # forwards per step in one-token forwards): what its steps cost beyond their shapes (mask
    # rows' adapters, exit heads, retrieval, tree building)
    methods: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    measured: str = ""
    procedure: str = PROCEDURE

    @property
    def input_cost(self) -> float:
        """One more verified input: the slope from 1 to 17 inputs."""
        return round(max(0.0, (self.inputs(17) - 1.0) / 16), 5)

    def inputs(self, n: int) -> float:
        """A full-depth forward of n inputs (n >= 1), interpolated on the measured curve."""
        w, c = self.widths, self.curve
        if n <= w[0]:
            return c[0]
        for i in range(1, len(w)):
            if n <= w[i] or i == len(w) - 1:
                slope = (c[i] - c[i - 1]) / (w[i] - w[i - 1])
                return c[i - 1] + slope * (n - w[i - 1])
        return c[-1]

    def forward(self, n: int, layers: int, depth: int) -> float:
        """A forward of n inputs through `layers` of the model's `depth` layers."""
        share = self.fixed_share + (1.0 - self.fixed_share) * min(layers, depth) / max(depth, 1)
        return self.inputs(max(n, 1)) * share

    @classmethod
    def linear(
        cls, model: str, input_cost: float, forward_ms: float = 10.0, fixed_share: float = 0.2
    ) -> PriceTable:
        """A table whose every input costs `input_cost` (a stated price rather than a measured
        one: tests, and what `size=<number>` assumes)."""
        return cls(
            model=model,
            machine="stated",
            forward_ms=forward_ms,
            widths=WIDTHS,
            curve=tuple(1.0 + input_cost * (n - 1) for n in WIDTHS),
            fixed_share=fixed_share,
            spread=0.01,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "widths": list(self.widths),
            "curve": list(self.curve),
            "methods": {k: list(v) for k, v in self.methods.items()},
        }

    def per_step(self, method: str) -> tuple[float, float]:
        """(forward factor, overhead per step) of `method`; (1, 0) where it was not measured."""
        return self.methods.get(method, (1.0, 0.0))

    def chain_speedup(
        self, acceptance: float, gamma: int, draft_cost: float, method: str = "speculative"
    ) -> tuple[float, float]:
        """The theory of a chain drafter on this table: each of γ draft tokens accepted with
        probability `acceptance` (i.i.d., the chain ending at the first rejection), so a step
        commits E = (1 − α^(γ+1)) / (1 − α) tokens; it pays γ draft forwards at `draft_cost` (of
        a one-token target forward) and one verify forward over γ + 1 inputs, at `method`'s
        measured factor and overhead, against autoregressive's per token. Returns (E, the
        predicted speedup): the same pricing as a run's `modelled_speedup`."""
        if not 0.0 <= acceptance <= 1.0 or gamma < 1 or draft_cost < 0:
            raise ValueError("acceptance in 0..1, gamma >= 1, draft_cost >= 0")
        a = acceptance
        tokens = gamma + 1.0 if a >= 1.0 else (1.0 - a ** (gamma + 1)) / (1.0 - a)
        factor, between = self.per_step(method)
        ar_factor, ar_between = self.per_step(REFERENCE)
        step = (gamma * draft_cost + self.inputs(gamma + 1)) * factor + between
        return tokens, tokens * (ar_factor + ar_between) / step

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PriceTable:
        return cls(
            model=str(d["model"]),
            machine=str(d["machine"]),
            forward_ms=float(d["forward_ms"]),
            widths=tuple(int(w) for w in d["widths"]),
            curve=tuple(float(c) for c in d["curve"]),
            fixed_share=float(d["fixed_share"]),
            spread=float(d["spread"]),
            drafters={str(k): float(v) for k, v in (d.get("drafters") or {}).items()},
            methods={
                str(k): (float(v[0]), float(v[1])) for k, v in (d.get("methods") or {}).items()
            },
            measured=str(d.get("measured", "")),
            procedure=str(d.get("procedure", PROCEDURE)),
        )


def drafter_key(label: str) -> str:
    """A drafter's name in the table and in per-source readings: a Draft event's source up to its
    first parenthesis ("eagle (1 trained layer …)" -> "eagle", "self:8 (first 8 …)" -> "self:8")."""
    return label.split(" (", 1)[0].split(" + ", 1)[0].strip() or "draft"


def recorded_prices(meta: Mapping[str, Any]) -> PriceTable | None:
    """The table a trace's meta says its run was priced by (None: a trace from before tables, or
    a broken one: its work is then not priced)."""
    try:
        table = PriceTable.from_dict(meta["prices"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    numbers = (table.forward_ms, table.fixed_share, table.spread, *table.curve)
    sane = (
        0 < len(table.widths) == len(table.curve) <= 64
        and table.widths[0] == 1
        and all(a < b for a, b in zip(table.widths, table.widths[1:], strict=False))
        and all(math.isfinite(v) and 0 <= v <= 1e6 for v in numbers)
        and all(math.isfinite(v) and 0 <= v <= 1e3 for v in table.drafters.values())
        and all(math.isfinite(v) and 0 <= v <= 1e3 for m in table.methods.values() for v in m)
    )
    return table if sane else None
