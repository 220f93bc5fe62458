"""Token trees with the prompt-lookup branch (lookup, trust): grafting the copied chain onto the
drafter's tree, lossless and kept when right on tiny-random; and the embedded model: lossless,
an EOS inside a copied branch, the branch's gain on code, and reproducible sampling. A long
enough match wins outright (trust = the threshold, in tokens of match, for both copy sources):
the copy replaces the drafter's draft, lossless on the embedded model, at the budget's end and
with an EOS inside the copy."""

import dataclasses
import json
import re

import pytest
from test_prompt_lookup import humaneval
from test_speculative import (
    by_step,
    one_torch_thread,  # noqa: F401  (autouse: torch runs on one thread here)
)
from test_token_tree import CHAIN3, check_tree_steps, same_as_greedy

from conftest import PROMPTS, matches_greedy
from decoders import generate
from decoders.core.errors import TraceError
from decoders.core.events import Commit, Draft, Verify
from decoders.drafting.copied import match_length
from decoders.drafting.ngram import find
from decoders.drafting.trees import TreeDraft, graft
from ui.live import run_to_end
from ui.traces import read_trace

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
    to the budget), grafted after the drafter's nodes as point masses, and its label and the
    event's `match` say so; with `trust`, a match of at least that many tokens is the whole draft
    and the drafter never runs (the event's `override`). Returns, per step, how many of the kept
    tokens came from copied nodes."""
    context, done, kept_copies = list(prompt_ids), 0, {}
    for step, ev in by_step(res).items():
        cap = budget - done - 1
        if step > 0 and cap > 0:
            draft, drafted = ev["draft"], [f for f in ev["forwards"] if f.kind == "draft"]
            chain, n, at = find(context, 3, min(size, cap))
            n = match_length(context, at, n) if chain else 0
            assert draft.match == n
            if chain and trust and n >= trust:
                label = f"prompt lookup (n={n} ≥ {trust}: replaces the drafter's draft)"
                assert draft.source == label and draft.override == trust
                assert draft.tokens == tuple(chain) and draft.parents == chain_parents(len(chain))
                assert not drafted
                grown = 0
            else:
                assert draft.override == 0
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


# --- a long enough match wins outright (trust = the threshold, in tokens) ------------------------

# A text that repeats itself: both copy sources match far more than 4 tokens from the first step
# on, and greedy goes on repeating it (measured: the copy overrides at step 1 either way).
REPEATING = "red, green, blue, red, green, blue, red, green, blue, red,"
OVERRIDE = 4  # TensorRT-LLM's sa_spec_threshold


def test_a_prompt_match_is_measured_back_over_the_tokens_that_agree():
    #          0  1  2  3  4  5  6  7  8
    context = [9, 1, 2, 3, 4, 7, 2, 3, 4]  # the end's 3-gram (2, 3, 4) first occurred at 2
    assert find(context, 3, 2)[1:] == (3, 2) and match_length(context, 2, 3) == 3  # 1 != 7
    context = [5, 1, 2, 3, 4, 8, 5, 1, 2, 3, 4]  # here 5, 1 agree before it too
    assert find(context, 3, 2)[1:] == (3, 2) and match_length(context, 2, 3) == 5
    assert match_length([3, 3, 3, 3], 0, 3) == 3  # nothing before the text's start


def overrides(res, threshold: int) -> dict[int, Draft]:
    """The steps whose copied chain replaced the drafter's draft, checked against the rule: a
    match of at least `threshold` tokens, the copy the whole draft, no draft forward that step;
    every other drafted step grew the drafter's tree (its match was shorter, or the datastore's)."""
    fired = {}
    for step, ev in by_step(res).items():
        draft = ev.get("draft")
        if draft is None:
            continue
        drafted = [f for f in ev["forwards"] if f.kind == "draft"]
        if draft.override:
            assert draft.override == threshold <= draft.match
            assert draft.copied == tuple(range(len(draft.tokens))) and not drafted
            assert f"(n={draft.match} ≥ {threshold}: replaces the drafter's draft)" in draft.source
            fired[step] = draft
        else:
            assert draft.match < threshold or "SAM datastore" in draft.source, draft.source
            assert drafted
    return fired


@pytest.mark.slow
@pytest.mark.parametrize("copy", ["prompt", "sam"])
def test_a_long_match_replaces_the_drafters_draft_and_stays_greedy(embedded, copy):
    fired, grown = {}, {}
    for name, prompt, chat in (("repeating", REPEATING, False), ("code", humaneval(0), True)):
        res = matches_greedy(embedded, prompt, 32, "token_tree", chat, copy=copy, trust=OVERRIDE)
        fired[name] = overrides(res, OVERRIDE)
        grown[name] = sum(isinstance(e, Draft) and not e.override for e in res.events)
    assert 1 in fired["repeating"] and len(fired["repeating"]) >= 2, fired
    # On code the drafter's tree and the copy take turns (code repeats its own names).
    assert grown["code"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("copy", ["prompt", "sam"])
def test_a_copy_that_would_run_past_the_budget_is_cut_at_it(embedded, copy):
    kw = dict(copy=copy, trust=OVERRIDE, size="fixed")  # the budget, not a price, cuts the copy
    for budget in (2, 3, 6):
        res = matches_greedy(embedded, REPEATING, budget, "token_tree", False, **kw)
        fired = overrides(res, OVERRIDE)
        if budget == 2:  # no room for a draft after the first token: a plain target step
            assert not fired and not any(isinstance(e, Draft) for e in res.events)
            continue
        # Step 1: the first token is committed, so the copy may fill all but the target's own.
        assert len(fired[1].tokens) == budget - 2, budget
        assert res.finish_reason == "length" and len(res.token_ids) == budget


@pytest.mark.slow
@pytest.mark.parametrize("copy", ["prompt", "sam"])
def test_an_eos_inside_an_overriding_copy_stops_like_autoregressive(embedded, copy):
    kw = dict(copy=copy, trust=OVERRIDE, size="fixed")
    free = generate(embedded, REPEATING, "token_tree", 24, chat=False, **kw)
    fired = overrides(free, OVERRIDE)
    # A copied token the output has not produced before, inside an overriding step's commit
    # (not its first): it becomes the EOS.
    pos, eos, position = 0, None, None
    for e in (e for e in free.events if isinstance(e, Commit)):
        new = [
            j for j in range(1, len(e.tokens) - 1) if e.tokens[j] not in free.token_ids[: pos + j]
        ]
        if e.step in fired and new:
            eos, position = e.tokens[new[0]], pos + new[0]
            break
        pos += len(e.tokens)
    assert eos is not None
    bundle = dataclasses.replace(embedded, eos_ids=frozenset({eos}))
    res = matches_greedy(bundle, REPEATING, 24, "token_tree", False, **kw)
    assert res.token_ids == free.token_ids[: position + 1] and res.finish_reason == "eos"
    last = [e for e in res.events if isinstance(e, Commit)][-1]
    assert last.step in overrides(res, OVERRIDE) and set(last.origins) == {"draft"}


def test_a_trace_whose_override_the_match_did_not_reach_is_refused(tiny):
    """An imported trace's override must name a threshold its match reached, with the copy the
    whole draft (here a recorded chain draft, marked as a copy that overrode)."""
    params = {"draft": "self:2", "shape": "static", "choices": CHAIN3, "lookup": 0, "trust": 0}
    data = json.loads(run_to_end("tiny-random", PROMPTS[0], "token_tree", 12, params).to_json())
    draft = next(e for e in data["events"] if e["type"] == "Draft" and len(e["tokens"]) == 3)
    draft.update(copied=[0, 1, 2], match=5, override=4)
    read_trace(json.dumps(data))  # a match of 5 reached 4: fine
    for bad in ({"override": 6}, {"copied": [1, 2]}, {"match": 10**6, "override": 0}):
        broken = json.loads(json.dumps(data))
        next(e for e in broken["events"] if e == draft).update(bad)
        with pytest.raises(TraceError, match="override a threshold it reached"):
            read_trace(json.dumps(broken))
