"""Method specs: one method and its settings in one string, `NAME[:KEY=VALUE...]`.

    lookahead:N=4:W=5            -> ('lookahead', {'N': '4', 'W': '5'})
    speculative:draft=self:8     -> ('speculative', {'draft': 'self:8'})

The benchmark's `--methods` takes a comma-separated list of them, and Compare one per row. A value
may hold ':' itself: a new setting starts only where a ':' is followed by a KEY=. The values stay
text here; the method's schema parses them (decoders/core/params.py). No torch here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from decoders.core.errors import InvalidInput

# Compare's table puts a zero-width space after each ':' so a long spec wraps between its
# settings; a spec copied out of the table still parses, since the parser drops them.
BREAK = "\u200b"

_SETTING = re.compile(r":(?=[A-Za-z_]\w*=)")  # the ':' that starts a KEY=VALUE


def parse_method(spec: str) -> tuple[str, dict[str, str]]:
    """'lookahead:N=4:W=5' -> ('lookahead', {'N': '4', 'W': '5'}); values may hold ':' too
    ('speculative:draft=self:8')."""
    spec = spec.replace(BREAK, "")
    name, *parts = _SETTING.split(spec)
    if ":" in name:
        raise InvalidInput(f"method spec {spec!r}: expected NAME:KEY=VALUE[:KEY=VALUE]")
    params = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidInput(f"method spec {spec!r}: expected NAME:KEY=VALUE[:KEY=VALUE]")
        params[key] = value
    return name, params


def split_specs(text: str, separators: str = ",") -> list[str]:
    """The specs of a list, e.g. the benchmark's `--methods`: split at `separators`, each spec
    stripped, blanks dropped."""
    pattern = "[" + re.escape(separators) + "]"
    return [s.strip() for s in re.split(pattern, text) if s.strip()]


def spec_of(name: str, values: Mapping[str, Any]) -> str:
    """('lookahead', {'N': 5, 'W': 15}) -> 'lookahead:N=5:W=15', the inverse of `parse_method`;
    booleans are spelled lower-case (`true`), as the schemas parse them."""
    spelled = (str(v).lower() if isinstance(v, bool) else str(v) for v in values.values())
    return ":".join([name, *(f"{k}={v}" for k, v in zip(values, spelled, strict=True))])
