"""Parameter schemas: each method declares its knobs once; the CLI and the UI are built from them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from decoders.core.errors import InvalidParameter


@dataclass(frozen=True)
class Param:
    name: str
    type: type  # int | float | str | bool
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None

    def parse(self, raw: Any) -> Any:
        """Convert a raw value (CLI string, JSON number, UI widget value) and check its range."""
        try:
            if self.type is bool:
                value = _parse_bool(raw)
            elif self.type is int:
                value = int(raw) if not isinstance(raw, float) or raw.is_integer() else _fail()
            elif self.type is float:
                value = float(raw)
            else:
                value = str(raw)
        except (TypeError, ValueError):
            raise InvalidParameter(
                f"parameter {self.name!r} expects {self.type.__name__}, got {raw!r}"
            ) from None
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes range checks
            raise InvalidParameter(f"parameter {self.name!r} must be a finite number, got {raw!r}")
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            raise InvalidParameter(
                f"parameter {self.name!r} must be in [{self.min}, {self.max}], got {value!r}"
            )
        if self.choices is not None and value not in self.choices:
            raise InvalidParameter(
                f"parameter {self.name!r} must be one of {', '.join(self.choices)}; got {value!r}"
            )
        return value

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type.__name__,
            "default": self.default,
            "min": self.min,
            "max": self.max,
            "choices": list(self.choices) if self.choices else None,
            "help": self.help,
        }


def _fail() -> Any:
    raise ValueError


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError


# Sampling knobs every method shares. temperature 0 means greedy (the lossless reference).
SAMPLING_PARAMS: tuple[Param, ...] = (
    Param("temperature", float, 0.0, "0 = greedy; > 0 samples from softmax(logits / T)", 0.0, 5.0),
    Param(
        "top_p",
        float,
        1.0,
        "nucleus sampling: keep the smallest set with this much mass",
        0.01,
        1.0,
    ),
    Param("seed", int, 0, "random seed for sampling (runs are reproducible)", 0, 2**31 - 1),
)


# Relaxed verification (SpecDec, Xia et al. 2023), for every draft-and-verify method: β = 1 is the
# exact rule (lossless); β > 1 also keeps a draft token among the target's top β within τ of its
# best log-probability (lossy, greedy only). `synthetic` > 0 replaces the rule by a coin with that
# acceptance rate (lossy, greedy only): the lab's "does measured speed follow the theory?" mode.
RELAX_PARAMS: tuple[Param, ...] = (
    Param(
        "beta",
        int,
        1,
        "relaxed verification: also accept a draft token among the target's top β "
        "(1 = the exact rule, lossless; > 1 is lossy, greedy only)",
        1,
        10,
    ),
    Param(
        "tolerance",
        float,
        1.0,
        "τ: ... when its log-probability is within τ of the top token's (used when β > 1)",
        0.0,
        20.0,
    ),
    Param(
        "synthetic",
        float,
        0.0,
        "a teaching mode: accept each draft token with this probability, whatever the target "
        "says (vLLM's synthetic rejection sampler), to watch speed follow acceptance; 0 = off; "
        "lossy, greedy only",
        0.0,
        1.0,
    ),
)


def validate_params(
    schema: Sequence[Param], given: Mapping[str, Any], method: str
) -> dict[str, Any]:
    """Fill defaults, parse values and reject unknown names (listing the valid ones)."""
    by_name = {p.name: p for p in schema}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise InvalidParameter(
            f"unknown parameter {unknown[0]!r} for method {method!r}; valid: {', '.join(by_name) or 'none'}"
        )
    return {p.name: p.parse(given[p.name]) if p.name in given else p.default for p in schema}
