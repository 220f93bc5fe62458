"""Token-tree sizing by cost (size=cost): which nodes and levels pay for their input, the price
table behind it (measured once, stored, robust to noise, never during a comparison), and the
copied branch cut where its copies stop paying, lossless."""

import dataclasses
import threading

import pytest
import torch
from test_prompt_lookup import humaneval
from test_speculative import (
    by_step,
    one_torch_thread,  # noqa: F401  (autouse: torch runs on one thread here)
)
from test_token_tree import check_tree_steps, same_as_greedy

from conftest import PROMPTS
from decoders import InvalidParameter, generate
from decoders.core.costs import forward_ms, input_cost, pays
from decoders.core.drafter import Drafter
from decoders.core.events import Draft, Forward, Verify
from decoders.core.tree import depths
from decoders.drafting.copied import CopyRates
from decoders.drafting.eagle import grow_dynamic
from decoders.drafting.trees import TreeDraft, graft, spelled, worth
from decoders.methods.token_tree import draft_cost
from decoders.trained.drafters import auto_draft

# --- size=cost: which nodes pay for their input ------------------------------------------------------


def test_worth_keeps_a_node_while_it_beats_the_cost_of_its_input():
    # Free inputs (a GPU): every node with any chance pays.
    assert worth([0.9, 0.5, 0.01, 0.001], 0.0) == 4
    # 0.1 per input: 0.9 > 0.1*1; 0.5 > 0.1*1.9/1.1 = 0.173; 0.1 < 0.1*2.4/1.2 = 0.2 -> stop.
    assert worth([0.9, 0.5, 0.1, 0.05], 0.1) == 2
    # A node exactly at the bar adds nothing: it is left out.
    assert worth([0.1], 0.1) == 0
    assert worth([], 0.05) == 0
    assert worth([0.99, 0.98], 10.0) == 0  # an input dearer than a whole forward: never

    def rate(scores, cost):  # expected tokens per unit of verification time
        return (1 + sum(scores)) / (1 + cost * len(scores))

    scores = [0.95, 0.7, 0.42, 0.3, 0.2, 0.12, 0.07, 0.03, 0.01]
    for cost in (0.01, 0.035, 0.1, 0.3):
        n = worth(scores, cost)
        best = max(range(len(scores) + 1), key=lambda k: rate(scores[:k], cost))
        assert n == best, cost  # the greedy rule finds the best prefix


def test_drafting_already_spent_lowers_the_bar_for_an_input():
    # 0.1 per input, 2 nodes summing to 1.0: the bar is 0.1 * 2 / 1.2 = 0.167 with free drafting,
    # 0.1 * 2 / 2.2 = 0.091 once a whole forward's worth of drafting was spent on the step.
    assert not pays(0.1, 1.0, 2, 0.1)
    assert pays(0.1, 1.0, 2, 0.1, spent=1.0)
    scores = [0.9, 0.5, 0.2, 0.12, 0.08, 0.05]
    assert worth(scores, 0.1) < worth(scores, 0.1, spent=1.0) <= len(scores)


class FakeGrower:
    """Hands grow_dynamic fixed distributions (each node's children: tokens 1, 2, 3 with
    probabilities 0.8, 0.15, 0.05) and records one Forward event per (batched) draft forward."""

    def __init__(self) -> None:
        self.events = []
        self.drafter = Drafter  # a drafter of one forward per level (reach None)

    def root(self, x: int) -> torch.Tensor:
        self.events.append(Forward(1, "draft", 1, 1, 1.0))
        return torch.tensor([0.0, 0.8, 0.15, 0.05])

    def expand(self, tree: TreeDraft, nodes) -> list[torch.Tensor]:
        dist = self.root(-1)  # one forward for the whole level
        return [dist.clone() for _ in nodes]


def test_a_level_is_drafted_only_while_it_pays_for_its_draft_forward():
    args = (7, 6, 3, 24, 0.035)  # x, depth, top_k, nodes, cost per input
    levels = {}
    for draft in (0.0, 0.02, 0.1, 1.0):  # a draft forward's price, in one-token target forwards
        grower = FakeGrower()
        tree = grow_dynamic(grower, *args, draft=draft)
        levels[draft] = len(grower.events)
        assert max(depths(tree.parents)) + 1 <= levels[draft]  # one forward per level drafted
        kept = sorted(tree.score, reverse=True)
        assert len(kept) == max(1, worth(kept, 0.035, draft * levels[draft]))  # each kept pays
    assert levels[0.0] == 6  # free drafting: only the inputs are priced (size=<number>)
    assert levels[1.0] == 1  # as dear as a target forward: the root's guesses only
    assert levels[0.0] >= levels[0.02] >= levels[0.1] > levels[1.0]
    assert 1 < levels[0.1] < 6  # the sure chain goes on a while, then its mass runs too thin


def test_the_draft_cost_comes_from_the_price_table(tiny, monkeypatch):
    """A self:k drafter is the target's first k layers: the table's depth rule prices it; a
    drafter that is not (another model) is measured once, kept in the table and stored."""
    from decoders.core import costs

    table = costs.price_table(tiny)
    assert draft_cost(tiny, "self:1") == table.forward(1, 1, tiny.n_layers)
    assert draft_cost(tiny, "auto") == draft_cost(tiny, auto_draft(tiny))  # resolved first
    monkeypatch.setitem(costs._tables, id(tiny.model), table)  # restored after the test
    monkeypatch.setattr(costs, "_save", lambda bundle, t: t)  # the stored table stays as it was
    cost = draft_cost(tiny, "tiny-random-2")
    assert 0.0 < cost < 10.0
    assert costs.price_table(tiny).drafters["tiny-random-2"] == cost
    monkeypatch.setattr(costs, "_measure", lambda b: pytest.fail("measured again"))
    assert draft_cost(tiny, "tiny-random-2") == cost  # kept: every later run grows the same trees


def test_the_table_is_measured_once_then_read_unchanged(tiny, monkeypatch, tmp_path):
    """The first time on a machine the table is measured and stored; a later process reads it
    back unchanged (no clock), and only `measure` replaces it."""
    from decoders.core import costs

    monkeypatch.setenv("DECODING_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "_tables", {})
    table = costs.price_table(tiny)
    assert costs.table_path(tiny).is_file() and table.machine == costs.machine(tiny)
    assert 0.0 <= table.input_cost < 10.0 and table.forward_ms > 0
    assert table.curve[0] == 1.0 and len(table.curve) == len(table.widths)
    monkeypatch.setattr(costs, "_tables", {})  # a new process
    monkeypatch.setattr(costs, "_measure", lambda b: pytest.fail("measured again"))
    assert costs.price_table(tiny) == table
    assert input_cost(tiny) == table.input_cost and forward_ms(tiny) == table.forward_ms
    fresh = dataclasses.replace(table, curve=(1.0, *(c * 2 for c in table.curve[1:])))
    monkeypatch.setattr(costs, "_measure", lambda b: fresh)
    assert costs.measure(tiny) == fresh == costs.price_table(tiny)
    monkeypatch.setattr(costs, "_tables", {})
    assert costs.price_table(tiny) == fresh  # stored


def test_the_price_is_in_the_runs_stats_and_trace(tiny):
    """A sized run says what it was sized by: a Priced event, and input and draft cost in its
    stats, from the price table, which its trace carries whole; a run at a fixed size prices
    nothing."""
    from decoders.core import costs

    res = generate(tiny, PROMPTS[0], "token_tree", 12, draft="self:1")
    (priced,) = [e for e in res.events if e.type == "Priced"]
    table = costs.price_table(tiny)
    assert priced.input_cost == table.input_cost
    assert priced.draft_cost == round(draft_cost(tiny, "self:1"), 5) > 0
    assert (res.stats["input_cost"], res.stats["draft_cost"]) == (
        priced.input_cost,
        priced.draft_cost,
    )
    assert res.trace()["prices"] == table.to_dict()
    fixed = generate(tiny, PROMPTS[0], "token_tree", 12, draft="self:1", size="fixed")
    assert fixed.stats["input_cost"] is None and not any(e.type == "Priced" for e in fixed.events)


def test_a_comparison_and_a_re_measure_wait_for_each_other(tiny, monkeypatch):
    """Compare's timed rounds (hold_prices) start only once a measure under way has finished,
    and a re-measure asked for during a comparison waits for its rounds to end: either's
    forwards would slow the other's."""
    from decoders.core import costs

    started, release = threading.Event(), threading.Event()
    real = costs._measure

    def slow_measure(bundle):
        started.set()
        release.wait(30)
        return real(bundle)

    monkeypatch.setattr(costs, "_save", lambda bundle, t: t)
    monkeypatch.setitem(costs._tables, id(tiny.model), costs.price_table(tiny))
    monkeypatch.setattr(costs, "_measure", slow_measure)
    measure = costs.calibrate_in_background(tiny, again=True)
    timed = threading.Event()

    def compare() -> None:
        with costs.hold_prices():
            timed.set()

    rounds = threading.Thread(target=compare)
    try:
        assert measure is not None and started.wait(30)
        assert costs.calibrate_in_background(tiny, again=True) is None  # one at a time
        rounds.start()
        assert not timed.wait(0.5)  # held while the measure runs
    finally:
        release.set()
    assert timed.wait(30)
    rounds.join(30)
    measure.join(30)
    started.clear()
    with costs.hold_prices():  # a comparison under way: a re-measure waits for it
        again = costs.calibrate_in_background(tiny, again=True)
        assert again is not None and not started.wait(0.5)
    assert started.wait(30)
    again.join(30)
    assert costs._held == 0 and id(tiny.model) not in costs._measuring


def test_the_page_prices_a_model_when_it_loads_not_inside_a_run(tiny, monkeypatch):
    from decoders.core import costs
    from ui import models

    monkeypatch.setattr(costs, "_tables", {})
    monkeypatch.setattr(models, "resolve_model", lambda model: "tiny-random")
    assert models.get_bundle(None) is tiny
    for thread in threading.enumerate():
        if thread.name == "decoding-lab-calibrate":
            thread.join(timeout=60)
    assert id(tiny.model) in costs._tables


def test_a_burst_of_noise_does_not_misprice_an_input(tiny, monkeypatch):
    """The machine slows 3x for a dozen forwards in a row (another job, a throttled core).
    Measured a shape at a time, the burst lands on one shape's forwards only and the price is off
    by far; with the shapes taking turns it lands on every shape of its rounds and the medians
    hold."""
    from types import SimpleNamespace

    from decoders.core import costs

    calls = []

    def fake_forward(bundle, cache, tokens, *, step, kind, layers=None):
        calls.append((len(tokens), layers))
        burst = 3.0 if 20 <= len(calls) < 34 else 1.0  # two whole rounds: the medians must hold
        depth = 1.0 if layers is None else 0.2 + 0.8 * layers / bundle.n_layers
        ms = 10.0 * (1 + 0.05 * (len(tokens) - 1)) * depth * burst
        return SimpleNamespace(event=SimpleNamespace(wall_ms=ms))

    monkeypatch.setattr(costs, "forward", fake_forward)
    monkeypatch.setattr(costs, "crop_cache", lambda cache, n: None)
    table = costs._measure(tiny)
    assert table.input_cost == pytest.approx(0.05)
    assert table.forward_ms == pytest.approx(10.0)
    assert table.fixed_share == pytest.approx(0.2)
    assert table.inputs(8) == pytest.approx(1.35)
    half = tiny.n_layers // 2
    shapes = [(n, None) for n in costs.WIDTHS] + [(1, half)]
    assert calls[1 + 2 * len(shapes) :][: len(shapes)] == shapes  # the shapes take turns


@pytest.mark.parametrize("size", ["big", "-0.1", "11", ""])
def test_a_bad_size_is_refused(tiny, size):
    with pytest.raises(InvalidParameter, match="size"):
        generate(tiny, PROMPTS[0], "token_tree", 4, draft="self:2", size=size)


def test_with_no_node_worth_its_input_only_the_best_guess_is_checked(tiny):
    res = same_as_greedy(tiny, PROMPTS[2], 12, draft="tiny-random", size="10")
    drafts = [e for e in res.events if isinstance(e, Draft)]
    # Every step verifies the draft's single most probable token, nothing more.
    assert drafts and all(len(d.tokens) == 1 and d.parents == (-1,) for d in drafts)
    assert len(drafts) == sum(1 for e in res.events if isinstance(e, Verify))
    # Growth stops at the root: per step the draft model catches up on the last token and runs
    # the root; it never feeds a deeper level (a fixed tree would feed five more).
    for step, ev in by_step(res).items():
        drafts = [f for f in ev["forwards"] if f.kind == "draft"]
        assert len(drafts) <= (2 if step else 1), step


def test_copies_are_cut_where_they_stop_paying():
    rates = CopyRates()
    # Priors: a copy after a 3-token match is right 67 % of the time, each next one 75 %.
    assert rates.score(3, 0) == pytest.approx(0.67)
    assert rates.score(3, 2) == pytest.approx(0.67 * 0.75**2)
    assert rates.score(1, 0) == pytest.approx(0.16) and rates.score(9, 0) == rates.score(3, 0)
    branch = list(range(100, 116))
    # Alone (a trusted match): copies join while score > cost * (1 + S) / (1 + cost * n).
    cut = rates.cut(TreeDraft(), branch, 3, 0.035)
    expected = worth([rates.score(3, k) for k in range(16)], 0.035)
    assert len(cut) == expected and 3 <= expected < 16
    assert cut == branch[: len(cut)]
    assert rates.cut(TreeDraft(), branch, 3, 0.0) == branch  # free inputs: all of it
    assert rates.cut(TreeDraft(), branch, 1, 0.5) == []  # a poor match at a dear input: none
    # What the tree already spells is free, and the drafter's nodes raise the bar for the rest.
    tree = TreeDraft()
    a = tree.add(100, -1, 0.9)
    tree.add(101, a, 0.9)
    on_tree = rates.cut(tree, branch, 1, 0.035)
    assert on_tree[:2] == [100, 101]
    total, count = 0.9 + 0.81, 2
    for k in range(2, 16):
        s = rates.score(1, k)
        if not pays(s, total, count, 0.035):
            break
        total, count = total + s, count + 1
    assert len(on_tree) == k


def test_copy_rates_learn_from_the_verdicts():
    rates = CopyRates()
    tree = TreeDraft()
    graft(tree, [7, 8, 9, 10])
    assert spelled(tree, [7, 8, 9, 10, 11]) == [0, 1, 2, 3]
    before_first, before_then = rates.score(2, 0), rates.score(2, 1) / rates.score(2, 0)
    rates.update(tree, [7, 8, 9, 10], 2, accepted=(0, 1, 2, 3))  # all four right
    assert rates.score(2, 0) > before_first
    assert rates.score(2, 1) / rates.score(2, 0) > before_then
    seen = rates.then[1]
    rates.update(tree, [7, 8, 9, 10], 2, accepted=(0,))  # the 2nd was wrong: the rest unseen
    assert rates.then[1] == seen + 1
    first_seen = rates.first[1][1]
    rates.update(tree, [7, 8], 1, accepted=())  # the first copy was wrong
    assert rates.first[1][1] == first_seen + 1 and rates.then[1] == seen + 1


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["self:2", "tiny-random"])
@pytest.mark.parametrize("size", ["0.035", "0.3"])
def test_the_cut_copied_branch_is_lossless(tiny, draft, size):
    # Prompts that repeat themselves, so that lookup matches at 1, 2 and 3 tokens.
    for prompt in (humaneval(0), "the cat sat on the mat. the cat sat on the mat. the cat"):
        for trust in (0, 3):
            res = same_as_greedy(
                tiny, prompt, 40, chat=False, draft=draft, size=size, lookup=16, trust=trust
            )
            check_tree_steps(res, 40, {"shape": "dynamic", "size": size, "lookup": 16})
