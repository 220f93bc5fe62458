"""What drafts cost on this machine, measured: one more verified input and one draft forward as
fractions of a one-token target forward. Tree and chain drafts are sized by these prices
(`pays`: is a node worth its input?). A model is priced when it loads (`calibrate`; the app does
it in the background), and priced again when a sized run's own forwards disagree."""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
from collections.abc import Iterator, Sequence

import torch

from decoders.core.models import ModelBundle
from decoders.core.runtime import crop_cache, forward, new_cache

_input_costs: dict[int, float] = {}
_forward_ms: dict[int, float] = {}
_cost_lock = threading.Lock()


def input_cost(
    bundle: ModelBundle, *, context: int = 64, extra: int = 16, repeats: int = 7
) -> float:
    """What one more input costs a forward on this machine, as a fraction of a one-token forward.

    Measured once per loaded model, after a `context`-token cache, each shape warmed up first: the
    median over `repeats` rounds of one forward of 1 token and one of 1 + `extra`, taken in turns
    (a burst of noise on a shared machine then falls on both sides of a round, not on all of one
    size: measured a size at a time, one burst once priced inputs at half their cost and grew a
    whole benchmark's trees to 8 layers a token). About 0.035 on a 2-core Intel CPU and 0.045 on a
    2-core AMD one, where compute grows with every input, and near 0 on a GPU, where a forward of
    a few dozen tokens costs what one does. Tree drafts use it to verify only the nodes worth
    their price here (`token_tree`'s size=cost).
    """
    key = id(bundle.model)
    with _cost_lock:
        if key not in _input_costs:
            _input_costs[key], one = _measure_input_cost(bundle, context, extra, repeats)
            _forward_ms.setdefault(key, one)
        return _input_costs[key]


def _measure_input_cost(
    bundle: ModelBundle, context: int = 64, extra: int = 16, repeats: int = 7
) -> tuple[float, float]:
    """(input cost, one-token forward ms), measured now (see input_cost)."""
    ones, manys = _timed_forwards(bundle, context, (1, 1 + extra), repeats)
    rounds = [(m - o) / extra / max(o, 1e-6) for o, m in zip(ones, manys, strict=True)]
    return max(0.0, statistics.median(rounds)), statistics.median(ones)


def forward_ms(bundle: ModelBundle) -> float:
    """Wall milliseconds of a one-token forward of this model on this machine (after a 64-token
    cache), measured once per loaded model: what a draft forward's time is weighed against."""
    key = id(bundle.model)
    with _cost_lock:
        if key not in _forward_ms:
            _forward_ms[key] = statistics.median(_timed_forwards(bundle, 64, (1,), 3)[0])
        return _forward_ms[key]


def measured_costs(bundle: ModelBundle) -> dict[str, float]:
    """What this process has measured of `bundle`'s costs so far (`input_cost`, `forward_ms`),
    measuring nothing: a benchmark records the prices its trees were sized by."""
    key = id(bundle.model)
    with _cost_lock:
        found = {"input_cost": _input_costs.get(key), "forward_ms": _forward_ms.get(key)}
    return {k: round(v, 4) for k, v in found.items() if v is not None}


def set_prices(bundle: ModelBundle, input_cost: float, forward_ms: float) -> None:
    """Price `bundle` as given instead of measuring (a recorded run's prices: its trees then grow
    again as they grew when it was recorded)."""
    with _cost_lock:
        _input_costs[id(bundle.model)] = input_cost
        _forward_ms[id(bundle.model)] = forward_ms


def calibrate(bundle: ModelBundle, *, again: bool = False) -> dict[str, float]:
    """Measure what draft sizes are priced by (`input_cost`, `forward_ms`): the app calls it when
    a model loads, in the background, so no visitor's run pays for it or waits behind it (a run
    that starts before it finishes waits on the lock, as it would have measured itself).
    `again`: measure even when prices are stored, and replace them when done (runs go on with
    the old ones meanwhile)."""
    if again:
        price, one = _measure_input_cost(bundle)
        with _cost_lock:
            _input_costs[id(bundle.model)] = price
            _forward_ms[id(bundle.model)] = one
    input_cost(bundle)
    forward_ms(bundle)
    return measured_costs(bundle)


def calibrate_in_background(bundle: ModelBundle, *, again: bool = False) -> threading.Thread | None:
    """`calibrate` on a daemon thread, unless this model's prices are stored (and not `again`),
    being measured already, or (`again`) a comparison holds the prices (hold_prices)."""
    key = id(bundle.model)

    def run() -> None:
        try:
            calibrate(bundle, again=again)
        finally:
            with _cost_lock:
                _measuring.pop(key, None)

    with _cost_lock:  # one decision with hold_prices': it waits for this thread, or none starts
        if (key in _input_costs and not again) or key in _measuring or (again and _held):
            return None
        thread = threading.Thread(target=run, name="decoding-lab-calibrate", daemon=True)
        _measuring[key] = thread
        try:
            thread.start()  # started before anyone can join it (run takes the lock only to finish)
        except RuntimeError:  # no thread to be had: no entry left for hold_prices to join
            _measuring.pop(key, None)
            raise
    return thread


# A run's own verify forwards second-guess the price: when the price they imply is off by more
# than this factor (either way) over at least MIN_OBSERVED forwards of MIN_WIDTH+ inputs, the
# model is re-measured in the background for later runs. Not below MIN_TIMED_MS a one-token forward: there
# the timer and the scheduler, not the inputs, make the differences (the tiny test models).
REPRICE_FACTOR = 2.0
MIN_OBSERVED = 8
# A forward of fewer inputs says little about the price: on a CPU the first few extra inputs are
# nearly free (4 inputs measured 1.01 one-token forwards here, 8 1.13, 16 1.49), so narrow
# forwards implied a price 5x too low and set off a re-measure after almost every run.
MIN_WIDTH = 8
MIN_TIMED_MS = 5.0
_measuring: dict[int, threading.Thread] = {}  # per model: its measure under way (one at a time)
# "0" keeps every price as first measured: what a process that compares runs with each other
# needs (the test suite: a run alone and the same run among others must size the same trees).
REPRICE_ENV = "DECODING_LAB_REPRICE"


def implied_input_cost(bundle: ModelBundle, forwards: Sequence[tuple[int, float]]) -> float | None:
    """The per-input price a run's own verify forwards (inputs, wall ms) imply against the
    measured one-token forward: the median of (ms / one - 1) / (n - 1) over forwards of
    MIN_WIDTH+ inputs; None when there are too few of them or no measured one-token forward."""
    one = _forward_ms.get(id(bundle.model))
    seen = [(ms / one - 1.0) / (n - 1) for n, ms in forwards if n >= MIN_WIDTH] if one else []
    return statistics.median(seen) if len(seen) >= MIN_OBSERVED else None


_held = 0  # comparisons in progress: while any runs, no re-measure starts (hold_prices)
HOLD_WAIT_S = 60.0  # how long a comparison waits for a measure already under way


@contextlib.contextmanager
def hold_prices() -> Iterator[None]:
    """No background re-measure while this is open: a comparison's runs are timed side by side,
    and a re-measure beside them would slow whichever ran next (Compare's rounds; the
    benchmark, a process of its own, sets DECODING_LAB_REPRICE=0 instead). A measure already
    under way when it opens is waited for first (up to HOLD_WAIT_S), for the same reason. A
    model's first measure (`input_cost`, not a re-measure) holds the price lock throughout, so
    opening waits for it to the end, however long it takes."""
    global _held
    with _cost_lock:
        _held += 1
        under_way = list(_measuring.values())
    try:
        for thread in under_way:
            thread.join(timeout=HOLD_WAIT_S)
        yield
    finally:
        with _cost_lock:
            _held -= 1


def second_guess_price(bundle: ModelBundle, forwards: Sequence[tuple[int, float]]) -> bool:
    """After a sized run: when its verify forwards imply a per-input price off by more than
    REPRICE_FACTOR from the stored one, re-measure them in the background (later runs use the new
    ones; this one kept its own). True when it started that."""
    if os.environ.get(REPRICE_ENV, "1") == "0" or _held:
        return False
    key = id(bundle.model)
    price, one = _input_costs.get(key), _forward_ms.get(key)
    if price is None or one is None or one < MIN_TIMED_MS:
        return False
    implied = implied_input_cost(bundle, forwards)
    if implied is None:
        return False
    floor = 0.005  # near 0 (a GPU) a ratio says nothing
    if max(implied, floor) <= REPRICE_FACTOR * max(price, floor) and max(
        price, floor
    ) <= REPRICE_FACTOR * max(implied, floor):
        return False
    return calibrate_in_background(bundle, again=True) is not None


def _timed_forwards(
    bundle: ModelBundle, context: int, sizes: Sequence[int], repeats: int
) -> list[list[float]]:
    """Wall ms of `repeats` forwards of each size after a `context`-token cache, per size; the
    sizes take turns, round by round."""
    vocab = bundle.model.config.vocab_size
    ids = torch.arange(context + max(sizes)) % vocab
    cache = new_cache(bundle)
    forward(bundle, cache, ids[:context], step=0, kind="prefill")

    def timed(n: int) -> float:
        out = forward(bundle, cache, ids[context : context + n], step=0, kind="verify")
        crop_cache(cache, context)
        return out.event.wall_ms

    for n in sizes:  # warm-up: the first forwards of a shape pay for its kernels (oneDNN's
        timed(n), timed(n)  # primitives); a cold 17-token forward once priced inputs 1.6x too dear
    rounds = [[timed(n) for n in sizes] for _ in range(repeats)]
    return [list(times) for times in zip(*rounds, strict=True)]


def pays(score: float, total: float, n: int, cost: float, spent: float = 0.0) -> bool:
    """Is one more draft node with path probability `score` worth its input? A draft of n nodes
    whose path probabilities sum to `total` yields about 1 + total tokens per step costing
    1 + spent + cost·n one-token forwards (`spent`: the drafting done for it); the node raises
    that rate exactly when its score beats cost × (1 + total) / (1 + spent + cost·n)."""
    return score > cost * (1.0 + total) / (1.0 + spent + cost * n)
