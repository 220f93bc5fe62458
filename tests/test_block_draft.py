"""The block drafter (block_draft, decoders/trained/block.py, decoders/train/block.py).

- The trainer's masked pass is the drafter's forward: position i of a block laid after entry c
  scores what `BlockDrafter.fill` scores there when it drafts after the same context.
- A head fitted to tiny-random's own continuations drafts blocks the target accepts, so the edges
  inside an accepted block are reached: the budget ending mid-block, an end token inside one; as
  the grown tree (the default, with and without its copied branch), a chain and a static tree,
  always identical to greedy, with ONE draft forward per verify step.
- Sampling keeps the target's distribution: the first verified token of 160 seeded runs against
  the target's exact law (the chain's rejection rule with q = the block's distribution).
- On the embedded model (slow): the shipped head, identical to greedy, drafts accepted.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_speculative import next_token_probs

from conftest import PROMPTS, Run, assert_greedy, greedy, run_with
from decoders import METHODS
from decoders.core.errors import InvalidParameter
from decoders.core.events import BlockFill, Commit, Draft, Forward, Verify
from decoders.core.tree import depths
from decoders.engine import prepare
from decoders.train.block import block_losses, greedy_labels, run_block
from decoders.train.corpus import Corpus
from decoders.train.states import target_states
from decoders.trained.artifacts import save_artifact
from decoders.trained.block import (
    BlockDrafter,
    BlockHead,
    BlockTreeDrafter,
    block_mask,
    load_block,
)


def run(bundle, prompt, budget, head: BlockHead | None = None, **params) -> Run:
    """block_draft with the given head."""
    return run_with(bundle, prompt, "block_draft", budget, head, **params)


def one_draft_forward_per_verify_step(res: Run) -> None:
    """Each step that verified a draft ran exactly one drafter forward before it."""
    steps = {e.step for e in res.events if isinstance(e, Verify)}
    for step in steps:
        drafts = [
            e for e in res.events if isinstance(e, Forward) and e.step == step and e.kind == "draft"
        ]
        assert len(drafts) == 1, (step, drafts)


def fit_block(bundle, docs: list[list[int]], steps: int, fuse=(1,), block: int = 5) -> BlockHead:
    """A head trained (Adam, full batch, the trainer's own pass and loss) on `docs`."""
    states = target_states(bundle, Corpus(docs, ["code"] * len(docs)), fuse)
    vocab = torch.tensor(sorted({t for d in docs for t in d} | set(bundle.eos_ids)))
    torch.manual_seed(0)
    head = BlockHead(bundle.model.config, vocab, fuse, block)
    w = bundle.model.lm_head.weight[vocab].detach()
    labels = greedy_labels(w, states)
    spans = [states.span(d) for d in range(len(docs))]
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for i in range(steps):
        out, target, position = run_block(
            head, bundle.model.model.embed_tokens, states, labels, spans, list(range(i % 2, 64, 2))
        )
        loss = block_losses(w, out, target, position, head.block, 0.9)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head


@pytest.fixture(scope="module")
def fitted_path(tiny, tmp_path_factory):
    """A block head that knows tiny-random's greedy continuations of the test prompts (raw text,
    48 tokens), saved like a shipped file."""
    docs = []
    for prompt in PROMPTS:
        ids = tiny.encode(prompt, chat=False)
        docs.append(ids + greedy(tiny, tuple(ids), 48).token_ids)
    path = tmp_path_factory.mktemp("block") / "fitted.safetensors"
    save_artifact(fit_block(tiny, docs, 80), path, {"model": tiny.model_id})
    return path


@pytest.fixture(scope="module")
def fitted(tiny, fitted_path) -> BlockHead:
    return load_block(tiny, fitted_path)


# The token tree grown from the block (draft=block): dynamic by the price rule, every node kept,
# and a static choice list; and block_draft's own shapes.
TREES = [{}, {"size": "fixed", "nodes": 12}, {"shape": "static", "choices": "0 1 0.0 0.1 0.0.0"}]


def test_the_block_mask_lets_masks_see_everything_and_entries_the_past():
    m = block_mask(past=3, entries=2, masks=2, dtype=torch.float32)[0, 0] == 0
    assert m.shape == (4, 7)
    assert m[0].tolist() == [True] * 3 + [True, False, False, False]  # entry 0: cache + itself
    assert m[1].tolist() == [True] * 5 + [False, False]
    assert m[2].all() and m[3].all()  # the masks: every entry and each other


def test_the_trainers_pass_is_the_drafters_forward(tiny, fitted):
    """Position i of the block after entry c, in one masked training pass over a document, equals
    what the drafter fills after the context that ends there (the same outputs, float32)."""
    prompt = tiny.encode(PROMPTS[0], chat=False)
    doc = prompt + greedy(tiny, tuple(prompt), 24).token_ids
    states = target_states(tiny, Corpus([doc], ["code"]), fitted.fused_layers)
    labels = torch.zeros(len(doc), dtype=torch.long)
    c = 9  # the entry of x = doc[c + 1]; the context is doc[: c + 2]
    head = fitted.float()
    out, _, _ = run_block(head, tiny.model.model.embed_tokens, states, labels, [(0, len(doc))], [c])
    width = len(doc) - 1
    trained = torch.cat([out[0, c : c + 1], out[0, width : width + head.block - 1]])
    drafter = BlockDrafter(tiny, head)
    layers = [states.layers[ell] for ell in head.fused_layers] + [states.features]
    drafter.observe(torch.cat([t[: c + 1] for t in layers], -1).float())
    filled = drafter.fill(doc[: c + 2], step=1)
    rows = torch.log_softmax(trained.float() @ head.lm_head.weight.float().T, -1)
    drafted = torch.log_softmax(filled.logits[:, head.vocab], -1)
    torch.testing.assert_close(drafted, rows, atol=2e-4, rtol=1e-4)


BLOCK_SHAPES = [  # block_draft's own: the grown tree (its default), the chain, the static tree
    {},
    {"lookup": 0},
    {"size": "fixed", "nodes": 12},
    {"shape": "chain"},
    {"shape": "chain", "size": "fixed"},
    {"shape": "static"},
    {"block": 2},
]


@pytest.mark.parametrize("params", BLOCK_SHAPES)
def test_a_fitted_head_is_accepted_and_stays_greedy(tiny, fitted, params):
    accepted = 0
    for prompt in PROMPTS:
        res = run(tiny, prompt, 40, fitted, **params)
        assert_greedy(tiny, res, greedy(tiny, prompt, 40, chat=False).token_ids)
        one_draft_forward_per_verify_step(res)
        accepted += sum(len(e.accepted) for e in res.events if isinstance(e, Verify))
        fills = [e for e in res.events if isinstance(e, BlockFill)]
        assert fills and all(len(f.heads) == fitted.block for f in fills)
    assert accepted >= 30  # the fitted head's blocks are kept, so the edges below are reached


@pytest.mark.parametrize("params", TREES)
def test_the_token_tree_grows_from_the_block_in_one_forward(tiny, fitted_path, params):
    """token_tree:draft=block: every depth of the tree from the block's one forward (a node at
    depth d reads position d + 1's distribution), identical to greedy, its drafts accepted."""
    accepted = 0
    for prompt in PROMPTS:
        res = run_with(tiny, prompt, "token_tree", 40, draft=f"block:{fitted_path}", **params)
        assert_greedy(tiny, res, greedy(tiny, prompt, 40, chat=False).token_ids)
        one_draft_forward_per_verify_step(res)
        accepted += sum(len(e.accepted) for e in res.events if isinstance(e, Verify))
        drafted = [  # the block's nodes (a copied branch may reach deeper)
            d
            for e in res.events
            if isinstance(e, Draft)
            for i, d in enumerate(depths(e.parents))
            if i not in e.copied
        ]
        assert drafted and max(drafted) < load_block(tiny, fitted_path).block
    assert accepted >= 30


def test_a_tree_node_at_depth_d_reads_the_blocks_position_d_plus_1(tiny, fitted):
    """The tree's drafter runs one forward (x's) and reads the block for every deeper node."""
    prompt = tiny.encode(PROMPTS[0], chat=False)
    doc = prompt + greedy(tiny, tuple(prompt), 12).token_ids
    states = target_states(tiny, Corpus([doc], ["code"]), fitted.fused_layers)
    layers = [states.layers[ell] for ell in fitted.fused_layers] + [states.features]
    context = doc[:-1]
    seen = torch.cat([t[: len(context) - 1] for t in layers], -1).float()
    reference, tree = BlockDrafter(tiny, fitted), BlockTreeDrafter(tiny, fitted)
    reference.observe(seen)
    tree.observe(seen)
    block = reference.fill(context, step=1).logits
    assert tree.begin(context, 1) == []
    root = tree.forward([context[-1]], 1, logits_to_keep=1)
    assert root.event is not None and root.event.kind == "draft"
    depth = [0, 2, 1, 3]  # nodes' depths (children of the root: 0), at positions len(context) + d
    deeper = tree.forward([5, 6, 7, 8], 1, [len(context) + d for d in depth])
    assert deeper.event is None  # nothing ran
    torch.testing.assert_close(root.logits, block[:1])
    torch.testing.assert_close(deeper.logits, block[[d + 1 for d in depth]])


def test_a_chain_of_the_block_head_is_block_draft(tiny):
    with pytest.raises(InvalidParameter, match="block_draft method"):
        prepare(tiny, [1, 2, 3], "speculative", 8, params={"draft": "block"})


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 7])
def test_the_budget_ending_mid_block(tiny, fitted, fitted_path, budget):
    tree = {"draft": f"block:{fitted_path}", "size": "fixed"}
    for method, part, params in [
        ("block_draft", fitted, {"shape": "chain", "size": "fixed"}),
        ("block_draft", fitted, {"shape": "static"}),
        ("block_draft", fitted, {"size": "fixed"}),
        ("token_tree", None, tree),
    ]:
        res = run_with(tiny, PROMPTS[1], method, budget, part, **params)
        assert res.token_ids == greedy(tiny, PROMPTS[1], budget, chat=False).token_ids
        assert res.finish_reason == "length"
        committed = 0
        for e in res.events:  # no draft reaches past what the budget leaves the target
            if isinstance(e, Draft):
                assert max(depths(e.parents)) + 1 <= budget - committed - 1, (e, committed)
            if isinstance(e, Commit):
                committed += len(e.tokens)
        assert committed == budget


def test_an_end_token_inside_a_block(tiny, fitted, fitted_path):
    free = greedy(tiny, PROMPTS[1], 30, chat=False).token_ids
    position = 11
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({free[position]}))
    first = free.index(free[position])
    tree = {"draft": f"block:{fitted_path}", "size": "fixed"}
    for method, part, params in [
        ("block_draft", fitted, {"shape": "chain", "size": "fixed"}),
        ("block_draft", fitted, {"shape": "static"}),
        ("block_draft", fitted, {"size": "fixed"}),
        ("token_tree", None, tree),
    ]:
        res = run_with(bundle, PROMPTS[1], method, 30, part, **params)
        assert res.finish_reason == "eos" and res.token_ids == free[: first + 1]


def test_sampling_is_reproducible_and_seeded(tiny, fitted):
    kw = dict(temperature=1.0, seed=4)
    a, b = (run(tiny, PROMPTS[2], 16, fitted, **kw) for _ in range(2))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16
    assert run(tiny, PROMPTS[2], 16, fitted, **{**kw, "seed": 5}).token_ids != a.token_ids


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_sampling_follows_the_target_distribution(tiny, fitted, shape):
    """Budget 3: the first token is the prefill's draw, the second the first verified one: its
    frequency over 160 seeds against the target's exact distribution given the first (a
    chi-square over the likeliest tokens): the chain's rejection rule with q = the block's
    distribution, and the grown tree's multi-draft rule over its sampled nodes."""
    seeds, temperature = 160, 0.3
    prompt_ids = tiny.encode(PROMPTS[0], chat=False)
    firsts, seconds = [], []
    for seed in range(seeds):
        res = run(
            tiny,
            prompt_ids,
            3,
            fitted,
            temperature=temperature,
            seed=seed,
            size="fixed",
            shape=shape,
        )
        firsts.append(res.token_ids[0])
        seconds.append(res.token_ids[1])
    p = next_token_probs(tiny, [[*prompt_ids, t] for t in firsts], temperature)
    expected = p.sum(0)
    top = torch.topk(expected, 6).indices.tolist()
    observed = [sum(s == t for s in seconds) for t in top]
    cells = [(o, float(expected[t])) for o, t in zip(observed, top, strict=True)]
    cells = [(o, e) for o, e in cells if e >= 5]
    cells.append((seeds - sum(o for o, _ in cells), seeds - sum(e for _, e in cells)))
    assert len(cells) >= 3, cells  # a peaked enough target: the test can tell laws apart
    stat = sum((o - e) ** 2 / e for o, e in cells if e > 0)
    chi2_1e3 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46}
    assert stat < chi2_1e3[len(cells) - 1], (observed, cells)


@pytest.mark.slow
def test_the_shipped_head_on_the_embedded_model(embedded):
    """The shipped head drafts blocks the embedded model accepts, and the output stays greedy, as
    as the grown tree (its default) and as a chain, one draft forward per verify step."""
    prompt = "Explain in two sentences why the sky is blue."
    ids = embedded.encode(prompt)
    ref = greedy(embedded, ids, 48).token_ids
    for params in ({}, {"shape": "chain"}):
        res = run(embedded, ids, 48, **params)
        assert_greedy(embedded, res, ref)
        one_draft_forward_per_verify_step(res)
        # 1.12 (chain) and 1.17 (tree) here, 2026-12-02: blocks are kept, the head is weak yet
        assert res.stats["tokens_per_target_forward"] > 1.05, res.stats


def test_block_draft_is_registered_lossless_with_its_view():
    m = METHODS["block_draft"]
    assert m.claims_lossless({}) and m.views == ("block_fill",)


def test_int8_matrices_round_trip_within_a_row_scale():
    from decoders.trained.artifacts import INT8_SCALE, from_int8, to_int8

    torch.manual_seed(0)
    state = {"w": torch.randn(6, 40).half(), "b": torch.randn(40).half(), "i": torch.arange(3)}
    packed = to_int8(state)
    assert packed["w"].dtype == torch.int8 and packed["b"].dtype == torch.float16
    back = from_int8(packed)
    assert set(back) == set(state) and torch.equal(back["i"], state["i"])
    row = state["w"].float().abs().amax(1, keepdim=True) / 127
    assert ((back["w"] - state["w"].float()).abs() <= row / 2 + 1e-3).all()
    assert "w" + INT8_SCALE not in back
