"""docs/METHODS.md tells readers each knob's default: it must say what the code does."""

import re
from pathlib import Path

from decoders import METHODS

README = Path(__file__).resolve().parents[1] / "docs" / "METHODS.md"


def shown(value) -> set[str]:
    """The ways the table may write a default."""
    if isinstance(value, bool):
        return {"on", "true"} if value else {"off", "false"}
    if isinstance(value, float) and value.is_integer():
        return {str(value), str(int(value))}
    return {str(value).lower()}


def test_the_methods_table_states_each_knobs_default_as_the_code_has_it():
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"\| `([a-z_]+)` \|", line)
        if m and m.group(1) in METHODS:
            rows[m.group(1)] = line
    assert len(rows) >= 15, sorted(rows)
    checked, wrong = 0, []
    for name, line in rows.items():
        knobs = {p.name: p for p in METHODS[name].knobs}
        params_column = line.rstrip().rstrip("|").split("|")[-1]
        for m in re.finditer(r"`([a-z_]+)` \(([^)]*)\)", params_column):
            if m.group(1) not in knobs:
                continue
            # "(N, 3)", "(η, 0.6)", "(auto = …)", "(2: guesses …)": the first value after an
            # optional one-letter symbol is the default.
            words = [w.lower() for w in re.split(r"[\s,;:=]+", m.group(2)) if w]
            first = next((w for w in words if not re.fullmatch(r"[^\W\d_]", w)), "")
            checked += 1
            if first not in shown(knobs[m.group(1)].default):
                wrong.append(
                    f"{name}.{m.group(1)}: README ({m.group(2)}), code {knobs[m.group(1)].default!r}"
                )
    assert checked >= 30 and not wrong, wrong
