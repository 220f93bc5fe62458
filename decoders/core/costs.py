"""What work costs on this machine: one price table per model, measured once, stored, used unchanged.

A run's work (its forwards, the inputs of each, the layers each ran, the tokens) depends only on
the model, the method, its parameters and the prompt. What that work costs here is this module's
`PriceTable`, in one-token target forwards:

- `curve`: a target forward of `widths[i]` inputs after a 64-token cache costs `curve[i]`
  (1.0 at one input; linear between widths, the last slope past the widest);
- `input_cost`: one more verified input, the slope from 1 to 17 inputs: what token trees and
  cost-scheduled chains are sized by (`pays`);
- `fixed_share`: the part of a one-token forward outside its decoder layers (embedding, final
  norm, LM head): a forward through k of L layers costs fixed + (1 - fixed) * k / L;
- `drafters[label]`: one draft forward of a drafter that is not the target's own first layers (a
  trained head, an early exit with its adapter), as measured when the table was
  (`engine.price_runs`) or first sized by;
- `methods[name]`: what a method's steps cost beyond their forwards' shapes, from a short run of
  each: its forwards' wall time over their priced shapes (mask rows' adapters, exit heads), and
  its time between forwards per step (retrieval, tree building);
- `forward_ms`: the wall time of the one-token forward all of them are fractions of.

The procedure: the process's torch threads (the app's own setting), every shape warmed up twice,
then ROUNDS rounds in which the shapes take turns (a burst of load falls on every shape of a round,
not on all the rounds of one), the median per shape; `spread` is the table's own stated error (the
median over shapes of the half inter-quartile range of a shape's rounds, relative to its median). The table is kept
in ~/.cache/decoding-lab/prices/ per model and machine (CPU, threads, torch, device) and every
later run, in this process or the next, reads it unchanged: a decision never follows a live clock.
Only `measure(bundle)` (`python -m decoders --prices --remeasure`, or the button beside Compare's
results) replaces it, and never while a comparison is timing its rounds (`hold_prices`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from decoders.core.errors import InvalidParameter
from decoders.core.events import Event, Forward
from decoders.core.models import ModelBundle, cache_dir, slug
from decoders.core.prices import CONTEXT, ROUNDS, WIDTHS, PriceTable, drafter_key
from decoders.core.runtime import crop_cache, forward, new_cache, require_layers

_tables: dict[int, PriceTable] = {}  # per loaded model (id of its module)
# What completes a model's new table with what only runs can measure: its drafters' forwards and
# each method's cost beyond its forwards' shapes (engine.price_runs).
DrafterPricer = Callable[[ModelBundle, PriceTable], PriceTable]
_cost_lock = threading.RLock()


def machine(bundle: ModelBundle) -> str:
    """What a table is valid for: this CPU (or device), the torch threads, torch's version."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    device = str(bundle.device)
    if bundle.device.type == "cuda":
        device = torch.cuda.get_device_name(bundle.device)
    return f"{cpu}; {device}; {torch.get_num_threads()} threads; torch {torch.__version__}"


def table_path(bundle: ModelBundle) -> Path:
    here = hashlib.sha1(f"{machine(bundle)}|{bundle.dtype}".encode()).hexdigest()[:10]
    return cache_dir() / "prices" / f"{slug(bundle.model_id)}-{here}.json"


def price_table(bundle: ModelBundle, drafters: DrafterPricer | None = None) -> PriceTable:
    """This model's table on this machine: in memory, else stored, else measured now (once, with
    the drafters' prices when `drafters` can price them) and stored. Runs that ask meanwhile wait
    for the whole table."""
    key = id(bundle.model)
    with _cost_lock:
        if key not in _tables:
            stored = _load(bundle)
            if stored is not None:
                _tables[key] = stored
            else:  # the first measure on this machine: no comparison can be timing rounds yet
                _measure_into(bundle, drafters)
        return _tables[key]


def known_table(bundle: ModelBundle) -> PriceTable | None:
    """This model's table on this machine if it is in memory or stored; None rather than
    measuring (a page that only draws the table does not wait a minute for it)."""
    with _cost_lock:
        if id(bundle.model) not in _tables:
            stored = _load(bundle)
            if stored is None:
                return None
            _tables[id(bundle.model)] = stored
        return _tables[id(bundle.model)]


def _measure_into(bundle: ModelBundle, drafters: DrafterPricer | None) -> PriceTable:
    with _cost_lock:
        table = _measure(bundle)
        _tables[id(bundle.model)] = table  # what the drafters' own short runs are priced by
        if drafters is not None:
            table = drafters(bundle, table)
        _tables[id(bundle.model)] = _save(bundle, table)
        return table


def _load(bundle: ModelBundle) -> PriceTable | None:
    path = table_path(bundle)
    try:
        table = PriceTable.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return table if table.machine == machine(bundle) and table.model == bundle.model_id else None


def _save(bundle: ModelBundle, table: PriceTable) -> PriceTable:
    path = table_path(bundle)
    with contextlib.suppress(OSError):  # a read-only cache: the table still serves this process
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table.to_dict(), indent=1))
        tmp.replace(path)
    return table


def input_cost(bundle: ModelBundle) -> float:
    """What one more verified input costs a forward here, as a fraction of a one-token forward
    (about 0.035 on a 2-core Intel CPU and 0.045 on an AMD one; near 0 on a GPU)."""
    return price_table(bundle).input_cost


def forward_ms(bundle: ModelBundle) -> float:
    """Wall milliseconds of a one-token forward of this model here (after a 64-token cache)."""
    return price_table(bundle).forward_ms


def set_table(bundle: ModelBundle, table: PriceTable) -> None:
    """Price `bundle` by `table` in this process (a recorded run's table: its trees then grow as
    they grew when it was recorded). Not stored."""
    with _cost_lock:
        _tables[id(bundle.model)] = table


def drafter_price(bundle: ModelBundle, label: str, measure: Callable[[], float]) -> float:
    """One forward of drafter `label` in one-token target forwards: the table's, else
    `measure()` once, added to the table and stored."""
    table = price_table(bundle)
    if label not in table.drafters:
        with _cost_lock:
            table = price_table(bundle)
            if label not in table.drafters:
                price = round(max(0.0, measure()), 5)
                table = replace(table, drafters={**table.drafters, label: price})
                _tables[id(bundle.model)] = _save(bundle, table)
    return table.drafters[label]


def draft_price(
    bundle: ModelBundle, label: str, depth: int | None, runs: Callable[[], Iterable[Event]]
) -> float:
    """One draft forward of drafter `label`, in one-token target forwards, so that every run sizes
    its drafts alike: the target's own first `depth` layers by the table's depth rule; any other
    drafter (`depth` None: a trained head, another model) by its price in the table, measured the
    first time it is needed (`drafter_price`) as the median draft forward after the first step of
    the events `runs()` yields, against the table's one-token forward."""
    if depth is not None:
        return price_table(bundle).forward(1, depth, bundle.n_layers)

    def measured() -> float:
        times = [
            e.wall_ms for e in runs() if isinstance(e, Forward) and e.kind == "draft" and e.step > 1
        ]
        return statistics.median(times) / forward_ms(bundle) if times else 0.0

    return drafter_price(bundle, drafter_key(label), measured)


def measure(bundle: ModelBundle, drafters: DrafterPricer | None = None) -> PriceTable:
    """Measure this model's table again now and replace the stored one. `drafters` prices the
    trained drafters given the new table (engine.price_runs: short runs, which read the new
    table as they go). Waits for a comparison timing its rounds to end first; other runs wait for
    the whole table (they would otherwise size drafts by half of it)."""
    with _measure_gate():
        return _measure_into(bundle, drafters)


def _measure(bundle: ModelBundle) -> PriceTable:
    depth = bundle.n_layers
    half = max(1, depth // 2)
    try:  # a model whose layers cannot run alone is never asked for part of its depth
        require_layers(bundle, "a half-depth forward")
        partial = half < depth
    except InvalidParameter:
        partial = False
    shapes = [(n, None) for n in WIDTHS] + ([(1, half)] if partial else [])
    times = _timed_forwards(bundle, CONTEXT, shapes, ROUNDS)
    ones = times[0]
    ratios = [[t / max(o, 1e-6) for t, o in zip(ts, ones, strict=True)] for ts in times]
    curve = tuple(round(statistics.median(r), 5) for r in ratios[: len(WIDTHS)])
    spreads = [
        (q[2] - q[0]) / 2 / statistics.median(r)
        for r in ratios[1:]
        for q in [statistics.quantiles(r, n=4)]
    ]
    share = half / depth
    fixed = (statistics.median(ratios[-1]) - share) / (1 - share) if partial else 0.0
    return PriceTable(
        model=bundle.model_id,
        machine=machine(bundle),
        forward_ms=round(statistics.median(ones), 4),
        widths=WIDTHS,
        curve=(1.0, *curve[1:]),
        fixed_share=round(min(max(fixed, 0.0), 0.9), 5),
        spread=round(max(0.01, statistics.median(spreads)), 5),
        measured=time.strftime("%Y-%m-%d %H:%M"),
    )


def calibrate_in_background(
    bundle: ModelBundle,
    again: bool = False,
    drafters: DrafterPricer | None = None,
) -> threading.Thread | None:
    """The table on a daemon thread: loaded, or measured with its drafters (`drafters`) when none
    is stored, when a model loads (a run that starts meanwhile waits on the lock, as it would
    have measured itself); re-measured when asked (`again`). None when there is nothing to do:
    the table is in memory (and not `again`), or a measure is under way."""
    key = id(bundle.model)

    def run() -> None:
        try:
            if again:
                measure(bundle, drafters)
            else:
                price_table(bundle, drafters)
        finally:
            with _state_lock:
                _measuring.pop(key, None)

    with _state_lock:  # not the table's lock, which a measure under way holds throughout
        if (key in _tables and not again) or key in _measuring:
            return None
        thread = threading.Thread(target=run, name="decoding-lab-calibrate", daemon=True)
        _measuring[key] = thread
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: no entry left for hold_prices to join
            _measuring.pop(key, None)
            raise
    return thread


_measuring: dict[int, threading.Thread] = {}  # per model: its measure under way (one at a time)
_state_lock = threading.Lock()  # guards _measuring
_held = 0  # comparisons in progress: while any runs, no re-measure starts
_held_cv = threading.Condition()
HOLD_WAIT_S = 60.0  # how long a comparison waits for a measure already under way


@contextlib.contextmanager
def hold_prices() -> Iterator[None]:
    """No re-measure while this is open: a comparison's runs are timed side by side, and a
    measure beside them would slow whichever ran next. A measure already under way when it
    opens is waited for first (up to HOLD_WAIT_S)."""
    global _held
    with _state_lock:
        under_way = list(_measuring.values())
    for thread in under_way:
        thread.join(timeout=HOLD_WAIT_S)
    with _held_cv:
        _held += 1
    try:
        yield
    finally:
        with _held_cv:
            _held -= 1
            _held_cv.notify_all()


@contextlib.contextmanager
def _measure_gate() -> Iterator[None]:
    """A re-measure starts once no comparison holds the prices."""
    with _held_cv:
        _held_cv.wait_for(lambda: _held == 0)
        yield


def _timed_forwards(
    bundle: ModelBundle,
    context: int,
    shapes: Sequence[tuple[int, int | None]],
    repeats: int,
) -> list[list[float]]:
    """Wall ms of `repeats` forwards of each (inputs, layers) shape after a `context`-token cache,
    per shape; the shapes take turns, round by round."""
    vocab = bundle.model.config.vocab_size
    widest = max(n for n, _ in shapes)
    ids = torch.arange(context + widest) % vocab
    cache = new_cache(bundle)
    forward(bundle, cache, ids[:context], step=0, kind="prefill")

    def timed(shape: tuple[int, int | None]) -> float:
        n, layers = shape
        out = forward(
            bundle, cache, ids[context : context + n], step=0, kind="verify", layers=layers
        )
        crop_cache(cache, context)
        return out.event.wall_ms

    for shape in shapes:  # warm-up: the first forwards of a shape pay for its kernels (oneDNN's
        timed(shape), timed(shape)  # primitives); a cold 17-token forward priced inputs 1.6x dear
    rounds = [[timed(shape) for shape in shapes] for _ in range(repeats)]
    return [list(t) for t in zip(*rounds, strict=True)]


def pays(score: float, total: float, n: int, cost: float, spent: float = 0.0) -> bool:
    """Is one more draft node with path probability `score` worth its input? A draft of n nodes
    whose path probabilities sum to `total` yields about 1 + total tokens per step costing
    1 + spent + cost·n one-token forwards (`spent`: the drafting done for it); the node raises
    that rate exactly when its score beats cost × (1 + total) / (1 + spent + cost·n)."""
    return score > cost * (1.0 + total) / (1.0 + spent + cost * n)
