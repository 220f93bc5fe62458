"""Token-tree speculative decoding (decoders/methods/token_tree.py): the choice-list parser, the tree mask
helpers, lossless greedy decoding for dynamic (EAGLE-2) and static (Medusa) trees within the budget
and up to an EOS, the parameters' errors, and sampling that keeps the target's distribution.

Sizing trees by cost (size=cost, the price table): test_token_tree_sizing.py; the prompt-lookup
branch and the embedded model: test_token_tree_lookup.py."""

import dataclasses

import pytest
import torch
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
from decoders.core.events import Commit, Draft, Verify
from decoders.core.tree import ancestors, depths, feed_mask, tree_mask, tree_positions, with_root
from decoders.drafting.trees import MAX_NODES, parse_choices, worth
from decoders.methods.token_tree import DEFAULT_CHOICES

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
        ({"lookup": 8, "trust": 33}, r"trust.*\[0, 32\]"),
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
