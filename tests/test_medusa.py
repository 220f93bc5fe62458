"""Medusa (decoders/methods/medusa.py) and blockwise parallel decoding (decoders/methods/blockwise.py): lossless
under greedy, exact under sampling, one target forward per step, and a real run's trace and views.
The tree, the parameters, the embedded model and the views on synthetic steps:
test_medusa_views.py.

The shipped heads may be anything (placeholders now, trained ones later), so nothing here assumes
they are good. Where a test needs drafts that are often right (an EOS inside an accepted draft, a
step that fills the budget), it fits its own heads to tiny-random's greedy continuations of the
test prompts and decodes with them through `decode_with`, the same loop `decode` runs with the
shipped file.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch
from test_speculative import (
    CHI2_9DOF_1E3,
    CHI2_CRIT_1E3,
    bin_counts,
    next_token_probs,
    one_torch_thread,  # noqa: F401  (autouse: torch runs on one thread here)
    pit,
    uniformity_chi2,
)

from conftest import PROMPTS, Run, assert_greedy, greedy, run_with
from decoders import METHODS
from decoders.core.errors import TraceError
from decoders.core.events import (
    Commit,
    Done,
    Draft,
    Forward,
    HeadProposals,
    Verify,
    token_ids,
)
from decoders.core.runtime import forward, new_cache
from decoders.core.tree import chain
from decoders.methods.medusa import build_tree, tree_paths
from decoders.trained.artifacts import save_artifact, vocab_head
from decoders.trained.medusa_heads import MedusaHeads, Proposal, load_heads
from ui.live import Trace
from ui.traces import check_trace
from visualizer.panels import VIEWS

# The chi-square test's critical values at false alarm 1e-3, by degrees of freedom.
CHI2_1E3 = {**CHI2_CRIT_1E3, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124}
DETAIL_TOP_K = 5  # DecodeConfig.top_k: the heads' candidates blockwise records for its view


# --- heads fitted to tiny-random's own continuations ------------------------------------------------


def fit_heads(bundle, docs: list[list[int]], n_heads: int, steps: int) -> MedusaHeads:
    """Heads trained (Adam, `steps` full-batch steps) so that head i's top token at position t is
    docs[t + i + 1]: the target's final features in, its LM head (cut to the docs' tokens) out."""
    feats, targets = [], []
    for doc in docs:
        out = forward(bundle, new_cache(bundle), doc, step=0, kind="prefill", features=True)
        feats.append(out.features)
        targets += [
            [doc[t + i + 1] if t + i + 1 < len(doc) else -1 for i in range(1, n_heads + 1)]
            for t in range(len(doc))
        ]
    vocab = torch.tensor(sorted({t for doc in docs for t in doc} | set(bundle.eos_ids)))
    slot = {int(v): i for i, v in enumerate(vocab)}
    y = torch.tensor([[slot[t] if t >= 0 else -100 for t in row] for row in targets])
    f = torch.cat(feats)
    torch.manual_seed(0)
    heads = MedusaHeads(bundle.model.config, n_heads, vocab)
    lm_head = vocab_head(bundle, vocab)
    opt = torch.optim.Adam(heads.parameters(), lr=3e-2)
    for _ in range(steps):
        logits = lm_head(heads(f))
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, len(vocab)), y.reshape(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads


@pytest.fixture(scope="module")
def fitted(tiny, tmp_path_factory) -> dict[str, MedusaHeads]:
    """ "fitted": heads that know every greedy continuation of the test prompts (raw text, 60
    tokens); "partial": ten training steps only (the right token is often ranked 2nd..10th);
    "shipped": the model's file. Each saved and loaded back like a shipped file."""
    docs = []
    for prompt in PROMPTS:
        ids = tiny.encode(prompt, chat=False)
        docs.append(ids + greedy(tiny, tuple(ids), 60).token_ids)
    n = load_heads(tiny).n_heads
    folder = tmp_path_factory.mktemp("medusa")
    out = {"shipped": load_heads(tiny)}
    for name, steps in (("fitted", 300), ("partial", 10)):
        path = folder / f"{name}.safetensors"
        save_artifact(fit_heads(tiny, docs, n, steps), path, {"model": tiny.model_id})
        out[name] = load_heads(tiny, path)
    return out


def same_as_greedy(bundle, prompt, method, budget, heads=None, **params) -> Run:
    res = run_with(bundle, prompt, method, budget, heads, **params)
    ref = greedy(bundle, prompt, budget, chat=False)
    assert_greedy(bundle, res, ref.token_ids)  # near-ties: conftest
    if res.token_ids == ref.token_ids:
        assert res.finish_reason == ref.finish_reason
    return res


def by_step(res: Run) -> dict[int, dict]:
    steps: dict[int, dict] = defaultdict(lambda: {"forwards": []})
    for e in res.events:
        if isinstance(e, Forward):
            steps[e.step]["forwards"].append(e)
        elif isinstance(e, Draft | Verify | Commit | HeadProposals):
            key = type(e).__name__.lower()
            assert key not in steps[e.step], f"two {key} events in step {e.step}"
            steps[e.step][key] = e
    return dict(sorted(steps.items()))


def full_params(method: str, params: dict) -> dict:
    from decoders import METHODS

    return {**METHODS[method].preset("defaults"), **params}


def check_steps(res: Run, method: str, params: dict, budget: int, n_heads: int, n_layers=4):
    """Every step runs ONE target forward (1 + drafted inputs, every layer) and, when it drafts, one
    pass of the heads (0 decoder layers, 1 input: the feature) before it. The draft is the static
    tree (medusa) or the top-1 chain (blockwise) of the step's HeadProposals, cut to remaining - 1
    levels; the verdict is a path from the root; the commit is that path and the target's token."""
    p = full_params(method, params)
    done = 0
    for step, ev in by_step(res).items():
        commit, fws = ev["commit"], ev["forwards"]
        if step == 0:
            assert [f.kind for f in fws] == ["prefill"] and commit.origins == ("target",)
            done += len(commit.tokens)
            continue
        cap = budget - done - 1  # the target adds one token after the accepted path
        assert cap >= 0, "a step ran after the budget was spent"
        assert [f.kind for f in fws if f.kind != "draft"] in (["verify"], ["target"])
        (target,) = [f for f in fws if f.kind in ("verify", "target")]
        assert target.layers == n_layers and fws[-1] is target  # the heads run before it
        if method == "medusa":
            paths = [q for q in tree_paths(p, n_heads) if len(q) <= cap]
            depth, width = max(map(len, paths), default=0), p["top_k"]
        else:
            depth, width = min(p["k"], cap), DETAIL_TOP_K
        if depth == 0:
            assert len(fws) == 1 and target.kind == "target" and target.n_input_tokens == 1
            assert not {"draft", "verify", "headproposals"} & set(ev)
            assert commit.origins == ("target",) and len(commit.tokens) == 1
            done += 1
            continue
        assert [(f.kind, f.layers, f.n_input_tokens) for f in fws[:-1]] == [("draft", 0, 1)]
        heads = ev["headproposals"]
        assert heads.position == done
        assert len(heads.heads) == len(heads.probs) == depth
        assert all(len(row) == width for row in heads.heads)
        assert all(len(set(row)) == width for row in heads.heads)  # a head's ranks differ
        assert all(list(row) == sorted(row, reverse=True) for row in heads.probs)
        draft = ev["draft"]
        if method == "medusa":
            proposal = Proposal(heads.heads, heads.probs, target)
            tokens, parents, probs = build_tree(paths, proposal)
            assert draft.source == "medusa"
        else:
            tokens = [row[0] for row in heads.heads]
            parents, probs = list(chain(depth)), [row[0] for row in heads.probs]
            assert draft.source == "blockwise"
        assert (draft.tokens, draft.parents, draft.probs) == (
            tuple(tokens),
            tuple(parents),
            tuple(probs),
        )
        assert target.kind == "verify" and target.n_input_tokens == 1 + len(tokens)
        verify = ev["verify"]
        acc = verify.accepted
        assert all(parents[b] == a for a, b in zip((-1, *acc), acc, strict=False)), acc
        assert len(verify.target_probs) == len(tokens)
        k = len(acc)
        assert commit.tokens[:k] == tuple(tokens[i] for i in acc)[: len(commit.tokens)]
        at_leaf = k > 0 and acc[-1] not in parents
        origins = ("draft",) * k + ("bonus" if at_leaf else "correction",)
        assert commit.origins == origins[: len(commit.tokens)]
        if len(commit.tokens) == k + 1:
            assert commit.tokens[k] == verify.correction
        else:  # cut short: only by an EOS
            assert res.finish_reason == "eos" and commit.tokens[-1] == res.token_ids[-1]
        done += len(commit.tokens)
    assert done == len(res.token_ids) <= budget
    steps = [s for s in by_step(res) if s > 0]
    assert res.stats["target_forwards"] == 1 + len(steps)  # one per step, and the prefill


# --- greedy: lossless ---------------------------------------------------------------------------------

CONFIGS = {
    "medusa-default": ("medusa", {}),
    "medusa-paper": ("medusa", {"nodes": 63}),
    "medusa-top1": ("medusa", {"top_k": 1}),
    "medusa-top3": ("medusa", {"top_k": 3, "nodes": 40}),
    "medusa-one-node": ("medusa", {"nodes": 1}),
    "medusa-custom": ("medusa", {"choices": "0 1 2 0.0 0.1 1.0 0.0.0 0.0.0.0"}),
    "blockwise-k1": ("blockwise", {"k": 1}),
    "blockwise-k2": ("blockwise", {"k": 2}),
    "blockwise-k4": ("blockwise", {"k": 4}),
}
HEADS = ("shipped", "fitted", "partial")
CASES = [(h, c) for h in HEADS for c in CONFIGS]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "heads", "config"),
    [(i, *c) for i, c in enumerate(CASES)],
    ids=[f"{h}-{c}" for h, c in CASES],
)
def test_lossless_on_tiny(tiny, fitted, case, heads, config):
    # 3 heads x 9 settings, one prompt each, shifted per heads so every prompt meets each method.
    method, params = CONFIGS[config]
    prompt = PROMPTS[(case + case // len(CONFIGS)) % len(PROMPTS)]
    res = same_as_greedy(tiny, prompt, method, 32, fitted[heads], **params)
    n_heads = fitted[heads].n_heads
    check_steps(res, method, params, 32, n_heads)
    rules = {v.rule for v in res.events if isinstance(v, Verify)}
    assert rules == {"greedy-tree" if method == "medusa" else "greedy-chain"}
    if heads == "fitted":  # they know this continuation: each step takes the whole rank-0 path
        p = full_params(method, params)
        depth = max(map(len, tree_paths(p, n_heads))) if method == "medusa" else p["k"]
        accepted = [len(v.accepted) for v in res.events if isinstance(v, Verify)]
        assert accepted[:-1] == [depth] * (len(accepted) - 1) and accepted[-1] >= 1
    if heads == "partial" and config in ("medusa-paper", "blockwise-k4"):
        assert res.stats["accepted_drafts"] > 0


def test_a_tree_keeps_what_the_chain_misses(tiny, fitted):
    """Half-trained heads often rank the right token 2nd or lower: the tree accepts such nodes
    (ranks > 0 on the accepted path), the top-1 chain cannot."""
    ranks_taken = 0
    for prompt in PROMPTS[:3]:
        tree = same_as_greedy(tiny, prompt, "medusa", 40, fitted["partial"], nodes=63)
        chain_ = same_as_greedy(tiny, prompt, "blockwise", 40, fitted["partial"], k=4)
        for _step, ev in by_step(tree).items():
            if "verify" in ev:
                heads, draft = ev["headproposals"].heads, ev["draft"]
                depths = _depths(draft.parents)
                ranks_taken += sum(
                    heads[depths[i]].index(draft.tokens[i]) > 0 for i in ev["verify"].accepted
                )
        assert tree.stats["tokens_per_target_forward"] >= chain_.stats["tokens_per_target_forward"]
    assert ranks_taken > 0


def _depths(parents) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(0 if p == -1 else out[p] + 1)
    return out


# --- budget and EOS -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "per_step"),
    [
        ("medusa", {}, 4),  # the default tree is 3 deep: 3 accepted + the bonus
        ("medusa", {"nodes": 63}, 5),
        ("blockwise", {"k": 4}, 5),
        ("blockwise", {"k": 2}, 3),
    ],
)
def test_drafts_never_run_past_the_budget(tiny, fitted, method, params, per_step):
    """With heads that are always right, every step fills what the budget leaves: a tree or chain
    longer than remaining - 1 is cut to it, and the last step ends exactly at max_new_tokens."""
    for budget in range(1, 11):
        res = same_as_greedy(tiny, PROMPTS[4], method, budget, fitted["fitted"], **params)
        assert len(res.token_ids) == budget and res.finish_reason == "length"
        check_steps(res, method, params, budget, 4)
        assert res.stats["target_forwards"] == 1 + -(-(budget - 1) // per_step)
        if budget == 1:
            assert not any(isinstance(e, Draft | Verify | HeadProposals) for e in res.events)
        for shipped in (fitted["shipped"], fitted["partial"]):
            res = same_as_greedy(tiny, PROMPTS[4], method, budget, shipped, **params)
            check_steps(res, method, params, budget, shipped.n_heads)


@pytest.mark.parametrize(("method", "params"), [("medusa", {}), ("blockwise", {"k": 4})])
def test_eos_inside_an_accepted_draft_stops_like_autoregressive(tiny, fitted, method, params):
    free = same_as_greedy(tiny, PROMPTS[1], method, 32, fitted["fitted"], **params)
    # An accepted draft token that is not its commit's last, at its first occurrence.
    pos, eos, position = 0, None, None
    for e in (e for e in free.events if isinstance(e, Commit)):
        for j, (t, o) in enumerate(zip(e.tokens[:-1], e.origins, strict=False)):
            if o == "draft" and t not in free.token_ids[: pos + j]:
                eos, position = t, pos + j
                break
        if eos is not None:
            break
        pos += len(e.tokens)
    assert eos is not None
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    for heads in HEADS:
        res = same_as_greedy(bundle, PROMPTS[1], method, 32, fitted[heads], **params)
        assert res.finish_reason == "eos" and res.token_ids == free.token_ids[: position + 1]
        check_steps(res, method, params, 32, fitted[heads].n_heads)
        if heads == "fitted":  # the verifier kept as much as the output could take, or more
            last = [e for e in res.events if isinstance(e, Commit)][-1]
            verify = [e for e in res.events if isinstance(e, Verify)][-1]
            assert set(last.origins) == {"draft"} and len(verify.accepted) >= len(last.tokens)


# --- sampling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "rule"), [("medusa", "sample-tree"), ("blockwise", "sample-deterministic")]
)
def test_sampling_is_reproducible_per_seed(tiny, fitted, method, rule):
    kw = dict(temperature=1.0, seed=4)
    a = run_with(tiny, PROMPTS[2], method, 16, fitted["partial"], **kw)
    b = run_with(tiny, PROMPTS[2], method, 16, fitted["partial"], **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16
    untimed = [[e for e in r.events if not isinstance(e, Forward | Done)] for r in (a, b)]
    assert untimed[0] == untimed[1]
    c = run_with(tiny, PROMPTS[2], method, 16, fitted["partial"], **{**kw, "seed": 5})
    assert c.token_ids != a.token_ids
    assert {v.rule for v in a.events if isinstance(v, Verify)} == {rule}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "temperature", "children"),
    [
        ("medusa", 0.2, None),  # head 1's top few (the default tree's first level); often kept
        ("medusa", 1.0, None),  # a flat target: mostly the residual draw
        ("blockwise", 0.2, 1),  # head 1's top token
    ],
)
def test_sampling_follows_the_target_distribution(tiny, fitted, method, temperature, children):
    """Budget 3: the first step may draft one level (point masses, chosen by rank). The first
    token is the prefill's draw; the second, the first verified one, is tested against the
    target's exact distribution given the first, and against autoregressive sampling."""
    seeds = 160
    if children is None:
        children = sum(len(q) == 1 for q in tree_paths(full_params(method, {}), 4))
        assert children >= 3
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    firsts, seconds, drafted, kept = [], [], [], []
    for seed in range(seeds):
        res = run_with(
            tiny, prompt_ids, method, 3, fitted["fitted"], temperature=temperature, seed=seed
        )
        assert len(res.token_ids) == 3
        steps = by_step(res)
        d, v, h = steps[1]["draft"], steps[1]["verify"], steps[1]["headproposals"]
        assert d.parents == (-1,) * children and d.tokens == h.heads[0][:children]
        firsts.append(res.token_ids[0])
        seconds.append(res.token_ids[1])
        drafted.append(d.tokens)
        kept.append(bool(v.accepted))
    contexts = [[*prompt_ids, t] for t in firsts]
    p = next_token_probs(tiny, contexts, temperature)
    # A child is kept exactly when the output is one of them: P = sum of p over the children.
    mass = torch.stack([p[i, list(c)].sum() for i, c in enumerate(drafted)])
    assert [s in c for s, c in zip(seconds, drafted, strict=True)] == kept
    expected, sd = float(mass.sum()), float((mass * (1 - mass)).sum()) ** 0.5
    assert abs(sum(kept) - expected) <= 4 * sd + 1, (sum(kept), expected)
    if temperature < 1:
        assert sum(kept) >= seeds // 4  # the point-mass rule's keep branch is exercised
    else:
        assert sum(kept) < seeds  # and its residual draw
    # Each child is the output with exactly its target probability, whatever its rank.
    by_rank = torch.stack([p[i, list(c)] for i, c in enumerate(drafted)])
    expected_counts = [*by_rank.sum(0).tolist(), float((1 - by_rank.sum(1)).sum())]
    counts = [
        sum(s == c[j] for s, c in zip(seconds, drafted, strict=True)) for j in range(children)
    ]
    counts.append(seeds - sum(counts))
    cells = [(o, e) for o, e in zip(counts[:-1], expected_counts, strict=False) if e >= 5]
    cells.append((seeds - sum(o for o, _ in cells), seeds - sum(e for _, e in cells)))
    if len(cells) > 1 and cells[-1][1] >= 5:
        stat = sum((o - e) ** 2 / e for o, e in cells)
        assert stat < CHI2_1E3[len(cells) - 1], (counts, expected_counts)

    # Ranked with the drafted children first (in order), a bias towards them shows as small U.
    key = p.clone()
    for i, c in enumerate(drafted):
        key[i, list(c)] = 2.0 + torch.arange(len(c), 0, -1, dtype=key.dtype)
    u = pit(seconds, p, key, seed=1)
    assert uniformity_chi2(u) < CHI2_9DOF_1E3, bin_counts(u)


def _trace(tiny, fitted, **meta) -> Trace:
    res = run_with(tiny, PROMPTS[0], "medusa", 12, fitted["fitted"])
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    base = {
        "model": tiny.model_id,
        "method": "medusa",
        "params": {},
        "prompt_ids": prompt_ids,
        "max_new_tokens": 12,
    }
    return Trace({**base, **meta}, list(res.events), {})


def test_an_imported_trace_checks_the_heads_guesses(tiny, fitted):
    good = _trace(tiny, fitted)
    checked = check_trace(good, tiny.model.config.vocab_size)
    assert sum(isinstance(e, HeadProposals) for e in checked.events) >= 2
    at = next(i for i, e in enumerate(good.events) if isinstance(e, HeadProposals))
    h = good.events[at]
    bad = {
        "position": dataclasses.replace(h, position=h.position + 1),
        "same shape": dataclasses.replace(h, probs=h.probs[:-1]),
        "outside the model.s vocabulary": dataclasses.replace(
            h, heads=((10**8, *h.heads[0][1:]), *h.heads[1:])
        ),
        r"in \[0, 1\]": dataclasses.replace(h, probs=((1.5, *h.probs[0][1:]), *h.probs[1:])),
        "at most 16 x 16": dataclasses.replace(h, heads=((1,) * 17,) * 1, probs=((0.0,) * 17,)),
    }
    for message, event in bad.items():
        events = [*good.events[:at], event, *good.events[at + 1 :]]
        with pytest.raises(TraceError, match=message):
            check_trace(Trace(good.meta, events, {}), tiny.model.config.vocab_size)


def test_views_of_a_real_run_draw_every_step(tiny, fitted):
    for method in ("medusa", "blockwise"):
        res = run_with(tiny, PROMPTS[3], method, 20, fitted["partial"])
        texts = {t: tiny.token_text(t) for e in res.events for t in token_ids(e)}
        for step in by_step(res):
            for panel in (VIEWS[v] for v in METHODS[method].views):
                fig = panel(res.events, texts, step)
                assert fig.layout.title.text.startswith(("Step", "Token tree")), fig.layout.title
