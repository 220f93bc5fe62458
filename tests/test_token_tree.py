"""Token-tree speculative decoding (decoders/methods/token_tree.py): the choice-list parser, the tree mask
helpers, lossless greedy decoding for dynamic (EAGLE-2) and static (Medusa) trees, and sampling
that keeps the target's distribution."""

import dataclasses
import re
import threading

import pytest
import torch
from test_prompt_lookup import humaneval
from test_speculative import (
    CHI2_9DOF_1E3,
    CHI2_CRIT_1E3,
    bin_counts,
    by_step,
    next_token_probs,
    one_torch_thread,  # noqa: F401  (autouse: torch runs on one thread here)
    pit,
    uniformity_chi2,
)

from conftest import PROMPTS, matches_greedy
from decoders import InvalidParameter, generate, load_model, stream
from decoders.core.costs import forward_ms, input_cost, pays
from decoders.core.events import Commit, Draft, Forward, Verify
from decoders.core.tree import ancestors, depths, feed_mask, tree_mask, tree_positions, with_root
from decoders.drafting.copied import CopyRates
from decoders.drafting.eagle import grow_dynamic
from decoders.drafting.ngram import lookup
from decoders.drafting.trees import MAX_NODES, TreeDraft, graft, parse_choices, spelled, worth
from decoders.methods.token_tree import DEFAULT_CHOICES, draft_cost
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


# --- parse_choices ------------------------------------------------------------------------------------


def test_parse_choices_accepts_paths_sorted_by_depth():
    assert parse_choices("0 1 0.0") == [(0,), (1,), (0, 0)]
    assert parse_choices("0.1 1 0 0.0 0.1.3") == [(0,), (1,), (0, 0), (0, 1), (0, 1, 3)]
    assert parse_choices("0, 1,0.0") == [(0,), (1,), (0, 0)]  # commas work as separators
    assert parse_choices("0 0 0.0") == [(0,), (0, 0)]  # duplicates count once
    assert parse_choices("15 15.15") == [(15,), (15, 15)]  # the largest rank
    default = parse_choices(DEFAULT_CHOICES)
    assert len(default) == 15 and max(map(len, default)) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.0", "needs its parent 0"),
        ("0 0.0 1.0.0", "needs its parent 1.0"),
        ("x", "dot-separated"),
        ("0 1.x", "dot-separated"),
        ("0 0..1", "dot-separated"),
        ("16", "0..15"),
        ("0 0.16", "0..15"),
        ("-1", "0..15"),
        ("", "1..64"),
        ("   ", "1..64"),
    ],
)
def test_parse_choices_rejects_bad_lists(text, message):
    with pytest.raises(InvalidParameter, match=message):
        parse_choices(text)


def test_parse_choices_limits_the_number_of_paths():
    paths = [str(r) for r in range(16)] + [f"{a}.{b}" for a in range(4) for b in range(16)]
    assert len(paths) == 80
    assert len(parse_choices(" ".join(paths[:MAX_NODES]))) == MAX_NODES
    with pytest.raises(InvalidParameter, match=r"1\.\.64 paths, got 65"):
        parse_choices(" ".join(paths[: MAX_NODES + 1]))


# --- tree helpers -------------------------------------------------------------------------------------

PARENTS = (-1, -1, 0, 1, 2, 0)  # two roots' children; node 4 is three deep


def allowed(mask: torch.Tensor) -> list[list[int]]:
    """Which key columns each query row may attend to."""
    return [torch.nonzero(row == 0).flatten().tolist() for row in mask[0, 0]]


def test_with_root_prepends_the_root():
    assert with_root(()) == (-1,)
    assert with_root((-1,)) == (-1, 0)
    assert with_root(PARENTS) == (-1, 0, 0, 1, 2, 3, 1)
    assert depths(with_root(PARENTS)) == [0, *(d + 1 for d in depths(PARENTS))]
    # Verification positions: the root at the cache length, each node one further per level.
    assert tree_positions(with_root(PARENTS), 10) == [10, 11, 11, 12, 12, 13, 12]


def test_feed_mask_sees_the_context_and_the_ancestors_wherever_they_sit():
    # The cache holds 3 context positions, then nodes 1 and 0 (in that order); nodes 2, 5, 3 come now.
    mask = feed_mask(PARENTS, fed=[1, 0], feed=[2, 5, 3], cache_len=3)
    assert mask.shape == (1, 1, 3, 3 + 2 + 3)
    ctx = [0, 1, 2]
    slot = {1: 3, 0: 4, 2: 5, 5: 6, 3: 7}
    assert allowed(mask) == [
        sorted([*ctx, slot[0], slot[2]]),  # node 2: ancestors 0, 2
        sorted([*ctx, slot[0], slot[5]]),  # node 5: ancestors 0, 5 (not its sibling 2)
        sorted([*ctx, slot[1], slot[3]]),  # node 3: ancestors 1, 3
    ]
    blocked = mask[0, 0][mask[0, 0] != 0]
    assert torch.all(blocked == torch.finfo(torch.float32).min)
    assert feed_mask(PARENTS, [], [0], 2, dtype=torch.float16).dtype == torch.float16


def test_feed_mask_of_a_whole_tree_is_the_tree_mask():
    for parents in (PARENTS, with_root(PARENTS), (-1,), (-1, 0, 1, 2)):
        everything = list(range(len(parents)))
        assert torch.equal(feed_mask(parents, [], everything, 7), tree_mask(parents, 7))
    # Fed one level at a time, each row equals the matching row of the tree mask (restricted
    # to the columns that exist at that point).
    full = tree_mask(PARENTS, 4)[0, 0]
    fed: list[int] = []
    for level in ([0, 1], [2, 3, 5], [4]):
        part = feed_mask(PARENTS, fed, level, 4)[0, 0]
        order = [*range(4), *(4 + n for n in [*fed, *level])]
        for row, node in enumerate(level):
            assert torch.equal(part[row], full[node, order])
        fed += level


def test_tree_mask_rows_are_the_ancestors():
    mask = tree_mask(with_root(PARENTS), 2)
    rows = allowed(mask)
    root_parents = with_root(PARENTS)
    for i, cols in enumerate(rows):
        assert cols == [0, 1, *sorted(2 + a for a in ancestors(root_parents, i))]


# --- greedy: lossless -------------------------------------------------------------------------------

CHAIN3 = "0 0.0 0.0.0"
SHAPES = {
    "dynamic-default": {"shape": "dynamic"},  # size=cost, measured on this machine
    "dynamic-fixed": {"shape": "dynamic", "size": "fixed"},
    "dynamic-depth1": {"shape": "dynamic", "depth": 1, "top_k": 4, "size": "fixed"},
    "dynamic-nodes1": {"shape": "dynamic", "depth": 5, "top_k": 2, "nodes": 1, "size": "fixed"},
    "dynamic-wide": {"shape": "dynamic", "depth": 6, "top_k": 4, "nodes": 30, "size": "fixed"},
    "dynamic-topk1": {"shape": "dynamic", "depth": 3, "top_k": 1, "nodes": 3, "size": "fixed"},
    "dynamic-cost-free": {"shape": "dynamic", "size": "0"},  # every node pays: the fixed tree
    "dynamic-cost-some": {"shape": "dynamic", "top_k": 4, "size": "0.08"},
    "dynamic-cost-none": {"shape": "dynamic", "size": "10"},  # no node pays: plain target steps
    "static-default": {"shape": "static"},
    "static-chain": {"shape": "static", "choices": CHAIN3},
}
DRAFTS = ("self:2", "tiny-random", "tiny-random-2")
DEFAULTS = {"depth": 6, "top_k": 3, "nodes": 24, "size": "cost", "choices": DEFAULT_CHOICES}


def path_scores(draft) -> list[float]:
    """Each node's cumulative draft probability (its path's), from the Draft event."""
    scores: list[float] = []
    for prob, parent in zip(draft.probs, draft.parents, strict=True):
        scores.append(prob * (scores[parent] if parent >= 0 else 1.0))
    return scores


def static_parents(choices: str, depth_cap: int) -> tuple[int, ...]:
    """The parent array a choice list grows into, cut at `depth_cap` levels."""
    paths = [p for p in parse_choices(choices) if len(p) <= depth_cap]
    index = {p: i for i, p in enumerate(paths)}
    return tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths)


def check_tree_steps(res, budget, params, self_layers=None, n_layers=4):
    """Every step: a well-formed tree within the shape's limits and the budget, a verdict that is
    a root-to-node path of it, and a commit of that path plus the target's token."""
    p = {**DEFAULTS, **params}
    done = 0
    for step, ev in by_step(res).items():
        commit = ev["commit"]
        if step == 0:
            done += len(commit.tokens)
            continue
        cap = budget - done - 1  # the target adds one token after the accepted path
        assert cap >= 0, "a step ran after the budget was spent"
        draft, verify = ev.get("draft"), ev.get("verify")
        target_fw = [f for f in ev["forwards"] if f.kind in ("verify", "target")]
        assert len(target_fw) == 1 and target_fw[0].layers == n_layers
        sized = p["shape"] == "dynamic" and p["size"] != "fixed"
        if cap == 0 or (sized and draft is None):  # no room, or no node worth verifying
            assert draft is None and verify is None and target_fw[0].kind == "target"
            assert commit.origins == ("target",) and len(commit.tokens) == 1
            done += 1
            continue
        tokens, parents = draft.tokens, draft.parents
        n = len(tokens)
        assert n >= 1 and len(parents) == len(draft.probs) == n
        if sized and p["size"] != "cost" and not p.get("lookup"):
            # Every kept node pays for its input, given the others (copies are scored apart).
            scores = sorted(path_scores(draft), reverse=True)
            assert max(1, worth(scores, float(p["size"]))) == n, scores  # the best is always in
        assert all(-1 <= par < i for i, par in enumerate(parents)), parents
        level = depths(parents)
        deepest = max(level) + 1
        for node in (-1, *range(n)):  # siblings carry different tokens
            kids = [tokens[i] for i in range(n) if parents[i] == node]
            assert len(kids) == len(set(kids)), (node, kids)
        if p["shape"] == "dynamic":
            assert n <= p["nodes"] + p.get("lookup", 0)
            assert deepest <= min(p["depth"], cap)
            assert all(sum(1 for q in parents if q == node) <= p["top_k"] for node in range(-1, n))
            effective_depth = min(p["depth"], cap)
        else:
            effective_depth = min(max(map(len, parse_choices(p["choices"]))), cap)
            assert parents == static_parents(p["choices"], effective_depth)
            # Ranks: a node's children come in the draft's order of preference.
            for node in (-1, *range(n)):
                probs = [draft.probs[i] for i in range(n) if parents[i] == node]
                assert probs == sorted(probs, reverse=True)
        assert deepest <= effective_depth
        if self_layers is not None:  # one k-layer draft forward per tree level
            drafts = [f for f in ev["forwards"] if f.kind == "draft"]
            assert len(drafts) == effective_depth or (sized and len(drafts) < effective_depth)
            assert all(f.layers == self_layers for f in drafts)
        assert target_fw[0].kind == "verify" and target_fw[0].n_input_tokens == n + 1
        # The verdict is a path from the root down the tree.
        acc = verify.accepted
        assert all(parents[b] == a for a, b in zip((-1, *acc), acc, strict=False)), acc
        assert len(verify.target_probs) == n
        k = len(acc)
        assert commit.tokens[:k] == tuple(tokens[i] for i in acc)[: len(commit.tokens)]
        at_leaf = k > 0 and acc[-1] not in parents
        full = ("draft",) * k + ("bonus" if at_leaf else "correction",)
        assert commit.origins == full[: len(commit.tokens)]
        if len(commit.tokens) == k + 1:
            assert commit.tokens[k] == verify.correction
        else:  # cut short: only by an EOS
            assert res.finish_reason == "eos" and commit.tokens[-1] == res.token_ids[-1]
        done += len(commit.tokens)
    assert done == len(res.token_ids) <= budget


def same_as_greedy(bundle, prompt, max_new_tokens, chat=None, **params):
    # The drafter's tree alone unless a test asks for the copied branch (the defaults graft one).
    params = {"lookup": 0, "trust": 0, **params}
    return matches_greedy(bundle, prompt, max_new_tokens, "token_tree", chat, **params)


CASES = [(shape, draft) for draft in DRAFTS for shape in SHAPES]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "shape", "draft"),
    [(i, *c) for i, c in enumerate(CASES)],
    ids=[f"{s}-{d}" for s, d in CASES],
)
def test_lossless_on_tiny(tiny, case, shape, draft):
    # 7 shapes x 3 drafts, one prompt each, shifted per draft so that every prompt meets every
    # draft and several shapes.
    prompt = PROMPTS[(case + 2 * (case // len(SHAPES))) % len(PROMPTS)]
    params = SHAPES[shape]
    budget = 24
    res = same_as_greedy(tiny, prompt, budget, draft=draft, **params)
    k = int(draft[5:]) if draft.startswith("self:") else None
    check_tree_steps(res, budget, params, self_layers=k)
    steps = [ev for s, ev in by_step(res).items() if "verify" in ev]
    assert all(ev["verify"].rule == "greedy-tree" for ev in steps)
    pruned = params.get("size", "cost") not in ("fixed", "0")  # nodes may not pay on a random model
    assert steps or pruned
    if draft == "tiny-random" and not pruned:  # the target drafting for itself
        for ev in steps:
            acc, parents = ev["verify"].accepted, ev["draft"].parents
            # The draft's top child is the target's choice, and it always makes the tree.
            assert len(acc) >= 1
            if params["shape"] == "static":  # the rank-0 chain runs to the tree's full depth
                assert len(acc) == max(depths(parents)) + 1
                assert all(
                    ev["draft"].probs[i]
                    == max(
                        ev["draft"].probs[j]
                        for j in range(len(parents))
                        if parents[j] == parents[i]
                    )
                    for i in acc
                )
    if draft == "tiny-random-2":
        assert res.stats["accepted_drafts"] <= 2


def test_the_target_as_draft_accepts_every_node_of_a_chain(tiny):
    res = same_as_greedy(tiny, PROMPTS[3], 30, draft="tiny-random", shape="static", choices=CHAIN3)
    verifies = [e for e in res.events if isinstance(e, Verify)]
    drafts = [e for e in res.events if isinstance(e, Draft)]
    # The prefill's token, 7 steps of 3 drafts + a bonus (29 tokens), then a plain target step.
    assert [len(v.accepted) for v in verifies] == [3] * 7
    assert [len(d.tokens) for d in drafts] == [3] * 7
    assert res.stats["draft_acceptance_rate"] == 1.0
    assert res.stats["target_forwards"] == 1 + 8
    check_tree_steps(res, 30, {"shape": "static", "choices": CHAIN3})


# --- budget and EOS -----------------------------------------------------------------------------------


@pytest.mark.parametrize("draft", ["tiny-random", "self:2"])
@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_trees_never_run_past_the_budget(tiny, draft, budget):
    for params in (
        {"shape": "dynamic", "depth": 10, "top_k": 8, "nodes": 64},
        {"shape": "static"},
    ):
        res = same_as_greedy(tiny, PROMPTS[5], budget, draft=draft, **params)
        assert len(res.token_ids) == budget and res.finish_reason == "length"
        check_tree_steps(res, budget, params, self_layers=2 if draft == "self:2" else None)
        if budget == 1:
            assert res.stats["target_forwards"] == 1
            assert not any(isinstance(e, Draft | Verify) for e in res.events)
        if draft == "tiny-random" and params["shape"] == "static" and budget > 1:
            assert res.stats["target_forwards"] == 2  # one verify step fills the budget


@pytest.mark.parametrize("draft", ["tiny-random", "self:2"])
def test_eos_inside_an_accepted_path_stops_like_autoregressive(tiny, draft):
    params = {"shape": "static", "choices": CHAIN3}
    free = same_as_greedy(tiny, PROMPTS[1], 32, draft="tiny-random", **params)
    # The middle token of a fully accepted chain, at its first occurrence in the output.
    pos, eos, position = 0, None, None
    for e in (e for e in free.events if isinstance(e, Commit)):
        if e.step >= 2 and e.origins[:2] == ("draft", "draft"):
            t = e.tokens[1]
            if t not in free.token_ids[: pos + 1]:
                eos, position = t, pos + 1
                break
        pos += len(e.tokens)
    assert eos is not None
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    for run_params in (params, {"shape": "dynamic"}):
        res = same_as_greedy(bundle, PROMPTS[1], 32, draft=draft, **run_params)
        assert res.finish_reason == "eos"
        assert res.token_ids == free.token_ids[: position + 1]
        check_tree_steps(res, 32, run_params)
        if draft == "tiny-random" and run_params is params:
            last = [e for e in res.events if isinstance(e, Commit)][-1]
            verify = [e for e in res.events if isinstance(e, Verify)][-1]
            # The verifier took all three; the output ends at the second, and so does the
            # accepted path (no correction after it): metrics count what was written.
            assert last.origins == ("draft", "draft") and len(verify.accepted) == 2
            assert verify.correction is None


# --- parameters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"shape": "round"}, "dynamic, static"),
        ({"depth": 0}, r"depth.*\[1, 10\]"),
        ({"depth": 11}, r"depth.*\[1, 10\]"),
        ({"top_k": 9}, r"top_k.*\[1, 8\]"),
        ({"nodes": 0}, r"nodes.*\[1, 64\]"),
        ({"nodes": 65}, r"nodes.*\[1, 64\]"),
        ({"shape": "static", "choices": "0.0"}, "needs its parent"),
        ({"shape": "static", "choices": "0 a"}, "dot-separated"),
        ({"draft": "self:0"}, r"1\.\.4"),
        ({"draft": "self:9"}, r"1\.\.4"),
        ({"lookup": 33}, r"lookup.*\[0, 32\]"),
        ({"lookup": 8, "trust": 4}, r"trust.*\[0, 3\]"),
    ],
)
def test_invalid_parameters_are_clear_errors(tiny, params, message):
    with pytest.raises(InvalidParameter, match=message):
        generate(tiny, PROMPTS[0], "token_tree", 8, **params)


def test_trust_without_a_lookup_branch_has_no_effect(tiny):
    """Turning the copied branch off (lookup=0) leaves the default trust nothing to trust."""
    off = generate(tiny, PROMPTS[0], "token_tree", 12, draft="eagle", lookup=0)
    both_off = generate(tiny, PROMPTS[0], "token_tree", 12, draft="eagle", lookup=0, trust=0)
    assert off.token_ids == both_off.token_ids
    assert off.stats["target_forwards"] == both_off.stats["target_forwards"]
    assert not any("prompt lookup" in e.source for e in off.events if isinstance(e, Draft))


def test_stream_rejects_bad_choices_at_call_time(tiny):
    with pytest.raises(InvalidParameter, match="needs its parent"):
        stream(tiny, PROMPTS[0], "token_tree", 8, shape="static", choices="0.0")


# --- the prompt-lookup branch ----------------------------------------------------------------------


def test_graft_walks_the_shared_prefix_and_adds_the_rest():
    tree = TreeDraft()
    a = tree.add(5, -1, 0.6)
    tree.add(7, -1, 0.3)
    tree.add(8, a, 0.5)
    assert graft(tree, [5, 8, 9, 10]) == 2  # 5 and 8 are already there
    assert tree.tokens == [5, 7, 8, 9, 10]
    assert tree.parents == [-1, -1, 0, 2, 3]
    assert tree.probs == [0.6, 0.3, 0.5, 1.0, 1.0]  # copied tokens are point masses
    assert graft(tree, [5, 8]) == 0 and len(tree.tokens) == 5
    assert graft(tree, []) == 0
    assert graft(tree, [7, 5]) == 1 and tree.parents[-1] == 1  # under the 7, not the root's 5
    assert graft(TreeDraft(), [3, 3]) == 2


def root_paths(tokens, parents) -> set[tuple[int, ...]]:
    """Every root-to-node path of a tree, spelled in tokens."""
    paths: dict[int, tuple[int, ...]] = {-1: ()}
    for i, (t, par) in enumerate(zip(tokens, parents, strict=True)):
        paths[i] = (*paths[par], t)
    return set(paths.values())


def check_lookup_branch(res, prompt_ids, budget, size, trust=0) -> dict[int, int]:
    """Every step's tree holds the prompt-lookup chain recomputed from the committed context (cut
    to the budget), grafted after the drafter's nodes as point masses, and its label says so; with
    `trust`, a match of at least that many tokens is the whole draft and the drafter never runs.
    Returns, per step, how many of the kept tokens came from copied nodes."""
    context, done, kept_copies = list(prompt_ids), 0, {}
    for step, ev in by_step(res).items():
        cap = budget - done - 1
        if step > 0 and cap > 0:
            draft, drafted = ev["draft"], [f for f in ev["forwards"] if f.kind == "draft"]
            chain, n = lookup(context, 3, min(size, cap))
            if chain and trust and n >= trust:
                assert draft.source == f"prompt lookup (n={n}, trusted: drafter skipped)"
                assert draft.tokens == tuple(chain) and draft.parents == chain_parents(len(chain))
                assert not drafted
                grown = 0
            else:
                added = re.search(rf"prompt lookup \(n={n}, (\d+) new nodes\)", draft.source)
                assert bool(added) == bool(chain), draft.source
                grown = len(draft.tokens) - (int(added.group(1)) if chain else 0)
                assert grown >= 1 and drafted  # the drafter's own tree comes first
                if chain:
                    assert tuple(chain) in root_paths(draft.tokens, draft.parents)
                    # The copy shares the drafter's nodes as far as they agree and adds the rest
                    # (nothing, when the drafter's tree already holds the whole chain).
                    own = root_paths(draft.tokens[:grown], draft.parents[:grown])
                    shared = max(k for k in range(len(chain) + 1) if tuple(chain[:k]) in own)
                    assert int(added.group(1)) == len(chain) - shared
                    assert all(p == 1.0 for p in draft.probs[grown:])
            kept_copies[step] = sum(i >= grown for i in ev["verify"].accepted)
        context += ev["commit"].tokens
        done += len(ev["commit"].tokens)
    return kept_copies


def chain_parents(n: int) -> tuple[int, ...]:
    return tuple(range(-1, n - 1))


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["self:2", "tiny-random-2"])
@pytest.mark.parametrize("budget", [1, 2, 3, 5, 16])
def test_the_lookup_branch_is_lossless_and_kept_when_right(tiny, draft, budget):
    # Prompts that repeat themselves, so the lookup finds earlier occurrences to copy. (At 16
    # tokens the copies are accepted as often as at 40, measured: 6 kept with either drafter;
    # there the budget, not the size, caps the 32-token copy: sizes 8 and 4 cap their own.)
    hits = 0
    for prompt, size in ((PROMPTS[5] * 3, 8), (PROMPTS[0] * 4, 32), (PROMPTS[2], 4)):
        prompt_ids = tiny.encode(prompt, chat=False)
        ref = generate(tiny, prompt_ids, "autoregressive", budget)
        for params in (
            {"shape": "dynamic", "nodes": 4, "size": "fixed", "trust": 0},
            {"shape": "static", "choices": CHAIN3, "trust": 0},
            {
                "shape": "dynamic",
                "size": "fixed",
                "trust": 1,
            },  # every match is trusted: the drafter is skipped
        ):
            res = generate(
                tiny, prompt_ids, "token_tree", budget, draft=draft, lookup=size, **params
            )
            assert res.token_ids == ref.token_ids, (prompt, params)
            assert res.finish_reason == ref.finish_reason
            copies = check_lookup_branch(res, prompt_ids, budget, size, params.get("trust", 0))
            hits += sum(copies.values())
    if budget == 16:
        assert hits > 0  # the copied branch is really accepted, not just drawn


# --- sampling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["dynamic", "static"])
def test_sampling_is_reproducible_per_seed(tiny, shape):
    # Fixed size: the whole tree every step (sized, tiny-random's unsure drafts shrink to one node).
    kw = dict(draft="self:2", shape=shape, size="fixed", temperature=1.0, seed=9)
    a = generate(tiny, PROMPTS[2], "token_tree", 12, **kw)
    b = generate(tiny, PROMPTS[2], "token_tree", 12, **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    assert [e for e in a.events if isinstance(e, Draft | Verify | Commit)] == [
        e for e in b.events if isinstance(e, Draft | Verify | Commit)
    ]
    assert generate(tiny, PROMPTS[2], "token_tree", 12, **{**kw, "seed": 10}).token_ids != (
        a.token_ids
    )
    assert all(v.rule == "sample-tree" for v in a.events if isinstance(v, Verify))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("draft_id", "temperature", "seeds"),
    [
        ("tiny-random-2", 1.0, 160),  # an unrelated draft: its top 3 are (almost) never kept
        ("tiny-random", 0.2, 160),  # the target's own top 3 at a low temperature: often kept
    ],
)
def test_sampling_follows_the_target_distribution(tiny, draft_id, temperature, seeds):
    """The dynamic tree's first step (budget 3: one level, the draft's top 3 as point masses).
    The first token is the prefill's own draw; the second, the first verified one, is tested
    against the target's exact distribution given the first, and against autoregressive sampling
    over the same seeds."""
    draft = load_model(draft_id)
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    firsts, seconds, drafted, kept = [], [], [], []
    for seed in range(seeds):
        res = generate(
            tiny,
            prompt_ids,
            "token_tree",
            3,
            draft=draft_id,
            lookup=0,
            trust=0,
            size="fixed",  # the draft's top 3, whatever they cost
            temperature=temperature,
            seed=seed,
        )
        assert len(res.token_ids) == 3
        d = next(e for e in res.events if isinstance(e, Draft))
        v = next(e for e in res.events if isinstance(e, Verify))
        assert d.step == v.step == 1 and d.parents == (-1, -1, -1)
        firsts.append(res.token_ids[0])
        seconds.append(res.token_ids[1])
        drafted.append(d.tokens)
        kept.append(bool(v.accepted))
        assert v.rule == "sample-tree"
    contexts = [[*prompt_ids, t] for t in firsts]
    p = next_token_probs(tiny, contexts, temperature)
    q = next_token_probs(draft, contexts, temperature)
    for i, children in enumerate(drafted):
        # The children are the draft's top 3 after the right context, best first (compared by
        # value: batched and incremental forwards may swap near-ties).
        top = torch.topk(q[i], 3).values
        assert q[i, list(children)] == pytest.approx(top, rel=1e-3, abs=1e-7)
    # A child is kept exactly when the output is one of the children: P = sum of p over them.
    mass = torch.stack([p[i, list(c)].sum() for i, c in enumerate(drafted)])
    assert [s in c for s, c in zip(seconds, drafted, strict=True)] == kept
    expected, sd = float(mass.sum()), float((mass * (1 - mass)).sum()) ** 0.5
    assert abs(sum(kept) - expected) <= 4 * sd + 1, (sum(kept), expected)
    if draft_id == "tiny-random":
        assert sum(kept) >= seeds // 4  # the multi-draft rule is really exercised
    # Each child is the output with exactly its target probability, whatever its rank (the 2nd
    # child is only tried after the 1st is rejected, so it must be kept with p / (1 - p(1st))).
    by_rank = torch.stack([p[i, list(c)] for i, c in enumerate(drafted)])  # [seeds, 3]
    expected_counts = [*by_rank.sum(0).tolist(), float((1 - by_rank.sum(1)).sum())]
    counts = [sum(s == c[j] for s, c in zip(seconds, drafted, strict=True)) for j in range(3)]
    counts.append(seeds - sum(counts))
    cells = [(o, e) for o, e in zip(counts[:3], expected_counts, strict=False) if e >= 5]
    cells.append((seeds - sum(o for o, _ in cells), seeds - sum(e for _, e in cells)))
    if len(cells) > 1:  # (an unrelated draft's children are practically never the output)
        stat = sum((o - e) ** 2 / e for o, e in cells)
        assert stat < CHI2_CRIT_1E3[len(cells) - 1], (counts, expected_counts)
    else:
        assert counts[3] >= seeds - 1

    u_tree = pit(seconds, p, q, seed=1)  # ranked by the draft's preference: children first
    assert uniformity_chi2(u_tree) < CHI2_9DOF_1E3, bin_counts(u_tree)
    assert uniformity_chi2(pit(seconds, p, p, seed=2)) < CHI2_9DOF_1E3

    # (Autoregressive sampling's own draws are tested once, where they live: test_autoregressive.)


# --- the embedded model ---------------------------------------------------------------------------------


@pytest.mark.slow
# The static shape: on tiny-random (test_lossless_on_tiny) and, at the paper's settings, in
# test_lossless's embedded grid.
@pytest.mark.parametrize(("task", "shape"), [(0, "dynamic")])
def test_lossless_on_the_embedded_model(embedded, task, shape):
    res = same_as_greedy(embedded, humaneval(task), 48, draft="self:8", shape=shape)
    check_tree_steps(res, 48, {"shape": shape}, self_layers=8, n_layers=embedded.n_layers)
    assert res.stats["verify_steps"] > 0
    assert res.stats["accepted_drafts"] > 0
    assert res.stats["tokens_per_target_forward"] > 1.0


@pytest.mark.slow
def test_eos_inside_a_copied_branch_stops_like_autoregressive(embedded):
    kw = dict(draft="self:8", lookup=10, trust=0, shape="static", choices=CHAIN3)
    prompt_ids = embedded.encode(humaneval(1), chat=True)
    free = generate(embedded, prompt_ids, "token_tree", 64, **kw)
    copies = check_lookup_branch(free, prompt_ids, 64, 10)
    # The second token of a commit whose first two tokens were both copied (and that the output
    # has not produced before) becomes the EOS.
    pos, eos, position = 0, None, None
    for e in (e for e in free.events if isinstance(e, Commit)):
        if copies.get(e.step, 0) >= 2 and e.tokens[1] not in free.token_ids[: pos + 1]:
            eos, position = e.tokens[1], pos + 1
            break
        pos += len(e.tokens)
    assert eos is not None
    bundle = dataclasses.replace(embedded, eos_ids=frozenset({eos}))
    res = generate(bundle, prompt_ids, "token_tree", 64, **kw)
    ref = generate(bundle, prompt_ids, "autoregressive", 64)
    assert res.token_ids == ref.token_ids == free.token_ids[: position + 1]
    assert res.finish_reason == ref.finish_reason == "eos"
    assert [e for e in res.events if isinstance(e, Commit)][-1].origins == ("draft", "draft")
    check_lookup_branch(res, prompt_ids, 64, 10)


@pytest.mark.slow
@pytest.mark.parametrize("task", [3])
def test_the_lookup_branch_on_the_embedded_model(embedded, task):
    prompt_ids = embedded.encode(humaneval(task), chat=True)
    # Fixed size: the whole copied chain is grafted (size=cost would cut it where it stops paying).
    kw = dict(draft="eagle", size="fixed")
    plain = generate(embedded, prompt_ids, "token_tree", 64, lookup=0, trust=0, **kw)
    both = generate(embedded, prompt_ids, "token_tree", 64, lookup=10, trust=0, **kw)
    trusting = generate(embedded, prompt_ids, "token_tree", 64, lookup=10, trust=3, **kw)
    ref = generate(embedded, prompt_ids, "autoregressive", 64)
    assert plain.token_ids == both.token_ids == trusting.token_ids == ref.token_ids
    # (the defaults, sized with copies cut, on code: tests/test_tour.py re-runs them)
    copies = check_lookup_branch(both, prompt_ids, 64, 10)
    trusted = check_lookup_branch(trusting, prompt_ids, 64, 10, trust=3)
    assert sum(trusted.values()) >= 10
    assert trusting.stats["draft_forwards"] < both.stats["draft_forwards"]
    # Code repeats its own identifiers: the copied branch is kept often, and the target needs
    # fewer forwards than with the EAGLE tree alone.
    assert sum(copies.values()) >= 10
    assert both.stats["target_forwards"] < plain.stats["target_forwards"]


@pytest.mark.slow
def test_sampling_with_the_lookup_branch_is_reproducible_per_seed(embedded):
    prompt_ids = embedded.encode(humaneval(1), chat=True)
    kw = dict(draft="self:8", lookup=10, trust=0, size="fixed", temperature=0.5, seed=3)
    a = generate(embedded, prompt_ids, "token_tree", 40, **kw)
    b = generate(embedded, prompt_ids, "token_tree", 40, **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 40
    verifies = [e for e in a.events if isinstance(e, Verify)]
    assert verifies and all(v.rule == "sample-tree" for v in verifies)
    drafts = {e.step: e for e in a.events if isinstance(e, Draft)}
    # Copied nodes (after the drafter's) are kept under the point-mass rule, too.
    kept_copies = 0
    for v in verifies:
        added = re.search(r"(\d+) new nodes", drafts[v.step].source)
        grown = len(drafts[v.step].tokens) - (int(added.group(1)) if added else 0)
        kept_copies += sum(i >= grown for i in v.accepted)
    assert kept_copies > 0
