"""What the exit heatmap (exit_view.exit_heatmap) shows, as plain data: the tokens around a step
× the exits they reached, each cell's confidence, and the run's totals. No Plotly: events and
token texts in, cells out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from decoders.core.events import Commit, Event, Forward, LayerExit

from .cells import _tok

WINDOW = 32  # tokens a heatmap shows around the current step (a phone's width of columns)


def _exits(events: Sequence[Event]) -> list[LayerExit]:
    """The run's layer exits, by output position."""
    return sorted((e for e in events if isinstance(e, LayerExit)), key=lambda e: e.position)


def _outputs(events: Sequence[Event]) -> list[int]:
    """The tokens committed, by output position."""
    return [t for e in events if isinstance(e, Commit) for t in e.tokens]


def _oracle(events: Sequence[Event]) -> bool:
    """CALM's oracle run: it weighs no confidence (an exit scores 1 when its top-1 is the full
    model's token, which it peeked at first), so no threshold and no "confidence" is drawn."""
    return any(isinstance(e, Forward) and e.kind == "oracle" for e in events)


@dataclass(frozen=True)
class ExitMap:
    """What the exit heatmap shows: the tokens around the step (columns, by output position) ×
    the exits they reached (rows, the full model last), each cell's confidence (None: no exit was
    offered there) and hover, and the run's totals for the subtitle."""

    step: int
    shown: list[LayerExit]  # the columns' exits, in position order
    rows: list[int]  # the exit layers drawn
    y: list[str]  # their labels
    z: list[list[float | None]]
    hover: list[list[str]]
    outputs: list[int]  # the output so far, by position
    now: LayerExit | None  # the exit of this step's token
    n_layers: int
    oracle: bool  # CALM's oracle run: a cell is 1 where the exit gives the full model's token
    exits: int  # tokens after the prefill's, in the whole run
    early: int  # of them, how many left early
    depth: float  # the depth they were written from on average (a share of the layers)
    rule: str  # the exit rule ("hash" for HASH EE)


def _exit_cells(
    shown: Sequence[LayerExit],
    rows: Sequence[int],
    outputs: Sequence[int],
    texts: Mapping[int, str],
    oracle: bool,
) -> tuple[list[list[float | None]], list[list[str]]]:
    """Each exit × token cell's confidence (None where no exit was offered) and hover."""
    z: list[list[float | None]] = [[None] * len(shown) for _ in rows]
    hover = [[""] * len(shown) for _ in rows]
    for c, e in enumerate(shown):
        tok = outputs[e.position] if e.position < len(outputs) else None
        conf = dict(zip(e.layers, e.confidences, strict=True))
        for r, ell in enumerate(rows):
            where = "left here" if ell == e.layer else ("passed" if ell < e.layer else "not run")
            if ell in conf:
                z[r][c] = conf[ell]
                score = (
                    f"{'gives' if conf[ell] else 'misses'} the full model's token"
                    if oracle
                    else f"confidence {conf[ell]:.3f} vs λ {e.threshold:.3f}"
                )
                hover[r][c] = (
                    f"token {e.position}: {_tok(texts, tok)}<br>layer {ell}: {score}<br>{where}"
                )
            else:
                hover[r][c] = f"token {e.position}: {_tok(texts, tok)}<br>layer {ell}: {where}"
    return z, hover


def exit_map(events: Sequence[Event], texts: Mapping[int, str], step: int) -> ExitMap | None:
    """The exit heatmap's data at `step` (see `exit_heatmap`); None without layer exits."""
    exits = _exits(events)
    if not exits:
        return None
    oracle = _oracle(events)
    n_layers = exits[0].n_layers
    now = next((e for e in exits if e.step == step), None)
    centre = now.position if now is not None else exits[-1].position
    shown = [e for e in exits if centre - WINDOW + 8 <= e.position <= centre + 8][-WINDOW:]
    outputs = _outputs(events)
    rows = sorted({ell for e in shown for ell in e.layers} | {e.layer for e in shown})
    z, hover = _exit_cells(shown, rows, outputs, texts, oracle)
    return ExitMap(
        step=step,
        shown=shown,
        rows=rows,
        y=[f"ℓ {ell}" if ell < n_layers else f"{ell} (full)" for ell in rows],
        z=z,
        hover=hover,
        outputs=outputs,
        now=now,
        n_layers=n_layers,
        oracle=oracle,
        exits=len(exits),
        early=sum(e.layer < e.n_layers for e in exits),
        depth=sum(e.layer for e in exits) / (len(exits) * n_layers),
        rule=exits[0].rule,
    )
