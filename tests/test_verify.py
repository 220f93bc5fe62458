"""The shared verification rules (decoders/core/verify.py), as pure functions: no model.

Greedy rules are checked token for token on hand-made trees; sampling rules are checked to keep
the target's distribution exactly, with Pearson chi-square tests at a false-alarm rate of 1e-3 per
test (critical values below; every test is seeded, so a correct implementation passes every run).
"""

from collections import Counter, defaultdict

import pytest
import torch
from test_speculative import one_torch_thread  # noqa: F401  (autouse: one torch thread)

from decoders.core.sampling import Sampler
from decoders.core.tree import chain
from decoders.core.verify import greedy_chain, greedy_tree, sample_tree, speculative_chain

# Upper 1e-3 quantiles of the chi-square distribution, by degrees of freedom.
CHI2_CRIT_1E3 = {
    1: 10.828,
    2: 13.816,
    3: 16.266,
    4: 18.467,
    5: 20.515,
    6: 22.458,
    7: 24.322,
    8: 26.124,
    9: 27.877,
    10: 29.588,
    15: 37.697,
    20: 45.315,
    25: 52.620,
}

N_DRAWS = 20000  # the distribution tests
N_SMALL = 4000  # support checks and deterministic acceptance


def chi2_stat(counts: Counter, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic of `counts` against `probs` (over the support) and its degrees of freedom.
    A token outside the support must never be seen at all."""
    n = sum(counts.values())
    support = [t for t in range(len(probs)) if float(probs[t]) > 0]
    outside = {t: c for t, c in counts.items() if t not in support}
    assert not outside, f"tokens with zero probability were drawn: {outside}"
    stat = sum((counts[t] - n * float(probs[t])) ** 2 / (n * float(probs[t])) for t in support)
    return stat, len(support) - 1


def assert_follows(counts: Counter, probs: torch.Tensor, what: str = "") -> None:
    stat, df = chi2_stat(counts, probs)
    assert stat < CHI2_CRIT_1E3[df], f"{what}: chi2 = {stat:.2f} with {df} dof, counts {counts}"


def softmax(row, temperature: float = 1.0) -> torch.Tensor:
    return torch.softmax(torch.as_tensor(row, dtype=torch.float32) / temperature, dim=-1)


# --- greedy_tree / greedy_chain ------------------------------------------------------------------

# A hand-made tree over an 8-token vocabulary:
#
#   root ─ n0 (tok 3) ─ n5 (tok 4)
#        ├ n1 (tok 5) ─ n3 (tok 2)
#        │            └ n4 (tok 6)
#        └ n2 (tok 1)
TREE_TOKENS = (3, 5, 1, 2, 6, 4)
TREE_PARENTS = (-1, -1, -1, 1, 1, 0)
PARENT_ROW = (0, 0, 0, 2, 2, 1)  # the logits row that scores each node (its parent's row)


def tree_logits(argmax_per_row: dict[int, int], seed: int = 0) -> torch.Tensor:
    """7 rows (root + 6 nodes) of random logits with a clear argmax where given."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(TREE_TOKENS) + 1, 8, generator=g)
    for row, best in argmax_per_row.items():
        logits[row, best] = 6.0
    return logits


def test_greedy_tree_follows_the_argmax_through_the_second_child_to_a_bonus():
    # Row 0 (root) wants 5 = n1 (the 2nd child), row 2 (n1) wants 6 = n4, row 5 (n4, a leaf) wants 7.
    # Row 1 (n0) would accept n5, but the target never goes down n0.
    logits = tree_logits({0: 5, 1: 4, 2: 6, 5: 7})
    v = greedy_tree(TREE_TOKENS, TREE_PARENTS, logits)
    p = torch.softmax(logits, -1)
    assert v.accepted == (1, 4)
    assert v.tokens == (5, 6, 7)
    assert v.origins == ("draft", "draft", "bonus")
    assert v.correction == 7
    assert v.rule == "greedy-tree"
    # Each committed token's probability comes from the row that predicted it.
    assert v.probs == pytest.approx((float(p[0, 5]), float(p[2, 6]), float(p[5, 7])), abs=1e-6)
    # The target's probability of every node, from its parent's row (accepted or not).
    expected = [float(p[row, tok]) for row, tok in zip(PARENT_ROW, TREE_TOKENS, strict=True)]
    assert v.target_probs == pytest.approx(expected, abs=1e-6)
    assert len(v.target_probs) == len(TREE_TOKENS)


def test_greedy_tree_correction_inside_the_tree_and_at_the_root():
    # n1's children are 2 and 6; the target wants 0 after n1: accept n1, then correct with 0.
    logits = tree_logits({0: 5, 2: 0})
    v = greedy_tree(TREE_TOKENS, TREE_PARENTS, logits)
    p = torch.softmax(logits, -1)
    assert v.accepted == (1,)
    assert v.tokens == (5, 0)
    assert v.origins == ("draft", "correction")
    assert v.correction == 0
    assert v.probs == pytest.approx((float(p[0, 5]), float(p[2, 0])), abs=1e-6)

    # The target wants 7 at the root: no child matches, the root's own token is a correction.
    logits = tree_logits({0: 7, 1: 4, 2: 6})
    v = greedy_tree(TREE_TOKENS, TREE_PARENTS, logits)
    assert v.accepted == ()
    assert v.tokens == (7,)
    assert v.origins == ("correction",)
    assert v.probs == pytest.approx((float(torch.softmax(logits, -1)[0, 7]),), abs=1e-6)

    # Going down n0 (1st child) to its leaf n5, then a bonus from n5's row (6).
    logits = tree_logits({0: 3, 1: 4, 6: 2})
    v = greedy_tree(TREE_TOKENS, TREE_PARENTS, logits)
    assert (v.accepted, v.tokens, v.origins) == ((0, 5), (3, 4, 2), ("draft", "draft", "bonus"))


def test_greedy_tree_accepts_an_inner_node_then_corrects_below_it():
    # Accepting n1 (an inner node) and stopping there is a correction, never a bonus.
    logits = tree_logits({0: 5, 2: 7})
    v = greedy_tree(TREE_TOKENS, TREE_PARENTS, logits)
    assert v.origins[-1] == "correction"


def test_greedy_with_no_draft_is_the_targets_own_token():
    logits = tree_logits({0: 2})[:1]
    for v in (greedy_tree([], [], logits), greedy_chain([], logits)):
        assert v.accepted == () and v.tokens == (2,) and v.origins == ("target",)
        assert v.target_probs == ()
        assert v.probs == pytest.approx((float(torch.softmax(logits[0], -1)[2]),), abs=1e-6)


def test_verifiers_check_the_shape_of_their_input():
    logits = tree_logits({})
    with pytest.raises(AssertionError):
        greedy_tree(TREE_TOKENS, TREE_PARENTS, logits[:-1])  # one row short
    with pytest.raises(AssertionError):
        greedy_tree(TREE_TOKENS, TREE_PARENTS[:-1], logits)  # one parent short


@pytest.mark.parametrize("seed", range(12))
def test_greedy_chain_is_greedy_tree_on_a_chain(seed):
    g = torch.Generator().manual_seed(seed)
    n = 5
    logits = torch.randn(n + 1, 10, generator=g) * 3
    best = logits.argmax(-1).tolist()
    agree = seed % (n + 1)  # the draft agrees with the target for the first `agree` positions
    draft = [best[i] if i < agree else (best[i] + 1) % 10 for i in range(n)]
    c = greedy_chain(draft, logits)
    t = greedy_tree(draft, chain(n), logits)
    assert c.rule == "greedy-chain" and t.rule == "greedy-tree"
    assert {**c.__dict__, "rule": None} == {**t.__dict__, "rule": None}
    # And it is exactly what token-by-token greedy would have produced.
    assert c.accepted == tuple(range(agree))
    assert c.tokens == (*best[:agree], best[agree])
    assert c.origins[-1] == ("bonus" if agree == n else "correction")


# --- sample_tree (point-mass drafts, several per position) -----------------------------------------

ROOT_ROW = [2.0, 1.0, 0.5, 0.0, -1.0, 1.5]  # p ≈ .420 .154 .094 .057 .021 .255


def three_child_tree() -> tuple[list[int], list[int], torch.Tensor]:
    """Root children: tok 1 (likely), tok 3 (unlikely), tok 0 (the most likely, tried last);
    n3 (tok 4) hangs under n0. Rows 1..4 are distinct distributions for the second token."""
    tokens = [1, 3, 0, 4]
    parents = [-1, -1, -1, 0]
    logits = torch.tensor(
        [
            ROOT_ROW,
            [0.0, 1.0, 2.0, 0.0, -1.0, 0.5],  # after n0 (tok 1)
            [1.0, 0.0, 0.0, 2.0, 0.0, 0.0],  # after n1 (tok 3), a leaf: bonus row
            [0.0, 0.0, 0.0, 0.0, 0.0, 3.0],  # after n2 (tok 0), a leaf: bonus row
            [0.5, 0.5, 0.5, -2.0, 1.0, 0.0],  # after n3 (tok 4), a leaf: bonus row
        ]
    )
    return tokens, parents, logits


def test_sample_tree_keeps_the_target_distribution():
    tokens, parents, logits = three_child_tree()
    sampler = Sampler(temperature=1.0, seed=11)
    p = torch.softmax(logits, -1)
    first: Counter = Counter()
    second: defaultdict[int, Counter] = defaultdict(Counter)
    third: Counter = Counter()
    for _ in range(N_DRAWS):
        v = sample_tree(tokens, parents, logits, sampler)
        assert v.rule == "sample-tree"
        t = v.tokens[0]
        first[t] += 1
        # A token that is one of the root's children can only come from accepting that child.
        assert (v.origins[0] == "draft") == (t in (1, 3, 0)), v
        if len(v.tokens) > 1:
            second[t][v.tokens[1]] += 1
        if v.accepted == (0, 3):
            # n0 (tok 1) then n3 (tok 4) kept: the bonus comes from n3's row (row 4).
            assert v.tokens[:2] == (1, 4) and v.origins == ("draft", "draft", "bonus")
            third[v.tokens[2]] += 1
        else:
            assert len(v.tokens) <= 2
    assert_follows(first, p[0], "first token")
    # Given the first token, the second follows the row of the node it was drafted as.
    assert set(second) == {1, 3, 0}
    for tok, row in ((1, 1), (3, 2), (0, 3)):
        assert sum(second[tok].values()) == first[tok]  # every accepted child brings a 2nd token
        assert_follows(second[tok], p[row], f"second token after {tok}")
    # P(keep n0, then n3) = p0(1) * p1(4) ≈ 0.154 * 0.031: about a hundred draws.
    assert sum(third.values()) > 40
    assert_follows(third, p[4], "bonus after an accepted path")


def test_sample_tree_with_top_p_never_leaves_the_nucleus():
    # top_p = 0.75 keeps tokens 0, 5, 1 at the root (mass before each < 0.75); drafts 3 and 2 lie
    # outside, so they can never be accepted, and nothing outside the nucleus is ever committed.
    tokens, parents = [3, 1, 2], [-1, -1, -1]
    logits = torch.tensor([ROOT_ROW, [0.0] * 6, [0.0] * 6, [0.0] * 6])
    sampler = Sampler(temperature=1.0, top_p=0.75, seed=3)
    p = softmax(ROOT_ROW)
    nucleus = torch.zeros(6)
    for t in (0, 5, 1):
        nucleus[t] = p[t]
    nucleus /= nucleus.sum()
    first: Counter = Counter()
    for _ in range(N_SMALL):
        v = sample_tree(tokens, parents, logits, sampler)
        assert v.accepted in ((), (1,)), v  # n0 (tok 3) and n2 (tok 2) are outside the nucleus
        first[v.tokens[0]] += 1
    assert set(first) <= {0, 5, 1}
    assert_follows(first, nucleus, "first token with top_p")


def test_sample_tree_chain_is_the_deterministic_rule():
    tokens, logits = [2, 3], torch.zeros(3, 6)
    v = sample_tree(tokens, chain(2), logits, Sampler(temperature=1.0, seed=0))
    assert v.rule == "sample-deterministic"


# --- speculative_chain (draft sampled from q ≠ p) ----------------------------------------------------

V = 6
P_ROW0 = [1.5, 0.5, 0.0, 1.0, -0.5, 0.8]
# The target's next row depends on the first draft token: one row per token (as a real target's).
P_ROW1 = torch.tensor(
    [
        [2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 2.0, 1.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 2.0, 1.0, -1.0],
        [1.0, 1.0, 1.0, 1.0, 1.0, 3.0],
        [0.5, 0.0, -0.5, 1.0, 0.0, 1.5],
    ]
)
P_ROW2 = [0.0, 0.3, 0.6, 0.9, 1.2, 1.5]
# The draft's distributions: quite unlike p, with no mass at all on tokens 4 and 5 at position 0.
Q_ROW0 = torch.tensor([0.10, 0.50, 0.25, 0.15, 0.0, 0.0])
Q_ROW1 = torch.tensor([0.30, 0.05, 0.05, 0.30, 0.05, 0.25])


def spec_logits(d0: int) -> torch.Tensor:
    return torch.stack([torch.tensor(P_ROW0), P_ROW1[d0], torch.tensor(P_ROW2)])


def test_speculative_chain_keeps_the_target_distribution():
    sampler = Sampler(temperature=1.0, seed=21)
    g = torch.Generator().manual_seed(99)  # the drafter's own randomness
    d0s = torch.multinomial(Q_ROW0, N_DRAWS, replacement=True, generator=g).tolist()
    d1s = torch.multinomial(Q_ROW1, N_DRAWS, replacement=True, generator=g).tolist()
    q = torch.stack([Q_ROW0, Q_ROW1])
    p1 = torch.softmax(P_ROW1, -1)
    first: Counter = Counter()
    second: defaultdict[int, Counter] = defaultdict(Counter)
    bonus: Counter = Counter()
    accepted_first = 0
    for d0, d1 in zip(d0s, d1s, strict=True):
        logits = spec_logits(d0)
        v = speculative_chain([d0, d1], q, logits, sampler)
        assert v.rule == "speculative-sampling"
        first[v.tokens[0]] += 1
        if v.accepted:
            accepted_first += 1
            assert v.tokens[0] == d0
            second[d0][v.tokens[1]] += 1
            if v.accepted == (0, 1):
                assert v.tokens[:2] == (d0, d1) and v.origins == ("draft", "draft", "bonus")
                bonus[v.tokens[2]] += 1
            else:
                assert v.origins == ("draft", "correction") and len(v.tokens) == 2
        else:
            assert v.origins == ("correction",) and len(v.tokens) == 1
    # The first committed token ~ p, although the draft came from q.
    p0 = softmax(P_ROW0)
    assert_follows(first, p0, "first token")
    # Acceptance rate of the first draft = sum(min(p, q)).
    overlap = float(torch.minimum(p0, Q_ROW0).sum())
    assert abs(accepted_first / N_DRAWS - overlap) < 4 * (overlap * (1 - overlap) / N_DRAWS) ** 0.5
    # Given that d0 = x was accepted, the second token ~ p(. | x): one test per x, pooled.
    stat, df = 0.0, 0
    for x, counts in second.items():
        if sum(counts.values()) >= 500:
            s, d = chi2_stat(counts, p1[x])
            stat, df = stat + s, df + d
    assert df >= 15, second.keys()
    assert stat < CHI2_CRIT_1E3[df], (stat, df)
    # Both drafts kept: the bonus token comes from the last row.
    assert sum(bonus.values()) > 2000
    assert_follows(bonus, softmax(P_ROW2), "bonus token")


def test_speculative_chain_with_q_equal_to_p_accepts_everything():
    sampler = Sampler(temperature=0.8, seed=4)
    g = torch.Generator().manual_seed(1)
    logits = spec_logits(3)
    p = sampler.distribution(logits)
    bonus: Counter = Counter()
    for _ in range(N_SMALL):
        d0 = int(torch.multinomial(p[0], 1, generator=g))
        d1 = int(torch.multinomial(p[1], 1, generator=g))
        v = speculative_chain([d0, d1], p[:2], logits, sampler)
        assert v.accepted == (0, 1), v
        assert v.tokens[:2] == (d0, d1) and v.origins == ("draft", "draft", "bonus")
        bonus[v.tokens[2]] += 1
    assert_follows(bonus, p[2], "bonus token")


def test_speculative_chain_with_top_p_never_leaves_the_nucleus():
    # Nucleus at top_p = 0.6 of P_ROW0: tokens 0 (.347), 3 (.210), 5 (.172): mass before < 0.6.
    sampler = Sampler(temperature=1.0, top_p=0.6, seed=8)
    p = sampler.distribution(spec_logits(0))
    assert set(torch.nonzero(p[0]).flatten().tolist()) == {0, 3, 5}
    q = torch.stack([Q_ROW0, Q_ROW1])  # the draft mostly proposes tokens outside the nucleus
    g = torch.Generator().manual_seed(2)
    first: Counter = Counter()
    for _ in range(N_SMALL):
        d0 = int(torch.multinomial(Q_ROW0, 1, generator=g))
        d1 = int(torch.multinomial(Q_ROW1, 1, generator=g))
        v = speculative_chain([d0, d1], q, spec_logits(0), sampler)
        if d0 not in (0, 3, 5):
            assert v.accepted == (), v
        first[v.tokens[0]] += 1
    assert_follows(first, p[0], "first token with top_p")


def test_speculative_chain_with_no_draft_samples_the_target():
    sampler = Sampler(temperature=1.0, seed=13)
    logits = torch.tensor([P_ROW0])
    counts = Counter()
    for _ in range(N_SMALL):
        v = speculative_chain([], logits[:0], logits, sampler)
        assert v.origins == ("target",) and v.accepted == ()
        counts[v.tokens[0]] += 1
    assert_follows(counts, softmax(P_ROW0), "no draft")


def test_speculative_chain_reports_the_target_probabilities():
    sampler = Sampler(temperature=1.0, seed=0)
    logits = spec_logits(1)
    p = torch.softmax(logits, -1)
    q = p[:2].clone()  # q == p: everything is accepted, deterministically
    v = speculative_chain([1, 2], q, logits, sampler)
    assert v.target_probs == pytest.approx((float(p[0, 1]), float(p[1, 2])), abs=1e-6)
    assert v.probs == pytest.approx(
        (float(p[0, 1]), float(p[1, 2]), float(p[2, v.tokens[2]])), abs=1e-6
    )
