"""Block drafting (the DFlash line, Chen et al. 2026; PARD, An et al. 2025): a small drafter fills
a whole block of draft positions in ONE forward, and the target verifies it in one more.

    features = the target's states after a low and a middle layer and its final ones, at every
               position verification kept (prefill, then each verify forward)
    repeat:
        x = last committed token
        q_0 .. q_{k-1} = block_head(entries for the new context, x's entry, k - 1 masks)
                                   # ONE draft forward: the masks attend to the context and each other
        tree (default): grow a tree from the block: a node at depth d takes position d's top_k
               candidates (q_d, whichever token its parent holds); keep the nodes whose path
               probability (the product of the q's along it) pays for its input in the verifying
               forward on this machine (the token tree's EAGLE-2 rule, `grow_dynamic`, size=cost)
               lookup > 0: graft the prompt-lookup chain (what followed the last 1-3 tokens'
               earlier occurrence) onto it, as much of it as pays; it never replaces the block
        chain: d_i = argmax q_i (sampling: d_i ~ q_i), cut where the path probability no longer
               pays for its input (`costs.pays`; size=fixed: all k)
        static: the paths of ranks in `choices` over the positions' candidates (Medusa-style:
               the top-2 of the first positions by default)
        p = target([x, *draft])    # ONE target forward, verified as a chain or with a tree mask
        greedy:   the longest prefix (path) the target agrees with, then its own token
        sampling: the exact rejection rule (a chain: each d_i was drawn from q_i, a distribution
                  of the context alone; a tree: the multi-draft residual rule)

The EAGLE chain pays one head forward per drafted token, one after another; the block head pays
one per step, however long its draft. Its positions do not see each other's tokens, only each
other's states, so a later position guesses with less to go on than a chain would give it: the
block trades acceptance for drafting cost, and wins where drafting is what the chain pays for. A
tree wins back some of the acceptance: where a position is unsure, its second and third candidates
ride in the same verifying forward, at the price of their inputs only.
The head is trained by `python -m decoders.train block` (decoders/trained/block.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from decoders.core.base import Budget, DecodeConfig, Method
from decoders.core.costs import draft_price, forward_ms, input_cost, pays
from decoders.core.errors import InvalidParameter
from decoders.core.events import BlockFill, Event, Priced
from decoders.core.models import ModelBundle
from decoders.core.params import Param, validate_params
from decoders.core.runtime import new_cache
from decoders.core.sampling import Sampler
from decoders.core.steps import chain_draft, start, verify_chain, verify_tree
from decoders.drafting.copied import CopiedBranch
from decoders.drafting.eagle import Grower, grow_dynamic
from decoders.drafting.trees import MAX_NODES, TreeDraft, draft_event, graft, parse_choices
from decoders.trained.block import BlockDrafter, BlockHead, BlockTreeDrafter, load_block

TOP = 4  # candidates per position recorded for the view (and the deepest rank a tree may use)
DEFAULT_CHOICES = "0 1 0.0 0.1 1.0 0.0.0 0.0.1 0.0.0.0 0.0.0.0.0 0.0.0.0.0.0"

PARAMS = (
    Param(
        "shape",
        str,
        "tree",
        "tree = grow a tree from the block's one forward: a node at depth d takes position d's "
        "candidates, and the paths whose probability pays for their inputs are kept (the token "
        "tree's EAGLE-2 rule); chain = each position's top token (sampling: a draw from it), "
        "verified as a chain; static = the paths of ranks in `choices`",
        choices=("tree", "chain", "static"),
    ),
    Param(
        "block",
        int,
        0,
        "draft positions verified at most (0 = all the head fills in its forward)",
        0,
        16,
    ),
    Param(
        "size",
        str,
        "cost",
        "cost = keep only what pays for its input in the verifying forward on this machine "
        "(measured once per model: a chain is cut where its path probability no longer pays, a "
        "tree keeps the nodes that do); fixed = a chain verifies every position, a tree the "
        "`nodes` most confident",
        choices=("cost", "fixed"),
    ),
    Param("top_k", int, 3, "tree: candidates per position, and nodes expanded per depth", 1, TOP),
    Param("nodes", int, 24, "tree: draft nodes kept for verification (at most)", 1, MAX_NODES),
    Param(
        "lookup",
        int,
        16,
        "tree: also graft up to this many tokens copied from an earlier occurrence of the last "
        "1-3 tokens (prompt lookup) onto the tree, as many as pay; the block head still drafts "
        "every step; 0 = off",
        0,
        32,
    ),
    Param(
        "choices",
        str,
        DEFAULT_CHOICES,
        "static: paths of ranks over the block's positions, e.g. '0 1 0.0' = position 1's top "
        f"two tokens and position 2's top token under the first (ranks below {TOP})",
    ),
)


def _paths(params: Mapping[str, Any], depth: int) -> list[tuple[int, ...]]:
    paths = parse_choices(params["choices"])
    if params["choices"] == DEFAULT_CHOICES:  # the default tree, cut at the head's depth
        paths = [q for q in paths if len(q) <= depth]
    if max(map(len, paths)) > depth:
        raise InvalidParameter(
            f"choices: a path {max(map(len, paths))} deep needs {max(map(len, paths))} "
            f"positions; the block head fills {depth}"
        )
    if max(r for p in paths for r in p) >= TOP:
        raise InvalidParameter(f"choices: ranks below {TOP}, got {params['choices']!r}")
    return sorted(paths, key=lambda p: (len(p), p))


def _positions(params: Mapping[str, Any], filled: int) -> int:
    return min(params["block"] or filled, filled)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    head = load_block(bundle)
    if params["block"] > head.block:
        raise InvalidParameter(
            f"block = {params['block']}: the block head shipped for {bundle.model_id} fills "
            f"{head.block} positions per forward"
        )
    if params["shape"] == "static":
        _paths(params, _positions(params, head.block))


def chain_from(
    dists: torch.Tensor, sampler: Sampler, room: int, cost: float | None
) -> tuple[list[int], list[torch.Tensor]]:
    """Position i's token (greedy: the top one; sampling: a draw from q_i), in order, while the
    path's probability still pays for its input (`cost` None: all `room`)."""
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    path, total = 1.0, 0.0
    for q in dists[:room]:
        token = int(q.argmax()) if sampler.greedy else sampler.pick(torch.log(q), q)
        path *= float(q[token])
        if cost is not None and not pays(path, total, len(tokens), cost):
            break
        tokens.append(token)
        rows.append(q)
        total += path
    return tokens, rows


def tree_from(
    paths: list[tuple[int, ...]], ranked: torch.Tensor, probs: torch.Tensor, room: int
) -> tuple[list[int], list[int], list[float]]:
    """Path (r_1, .., r_d) -> position d's rank-r_d token under the node of (r_1, .., r_{d-1})."""
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, node_probs = [], [], []
    for path in paths:
        if len(path) > room:
            continue
        depth, rank = len(path) - 1, path[-1]
        index[path] = len(tokens)
        tokens.append(int(ranked[depth, rank]))
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        node_probs.append(round(float(probs[depth, rank]), 6))
    return tokens, parents, node_probs


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    yield from decode_with(bundle, prompt_ids, cfg, load_block(bundle))


def decode_with(
    bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig, head: BlockHead
) -> Iterator[Event]:
    """`decode` with the given head (the shipped one, or a file being evaluated)."""
    p = cfg.params
    shape = p["shape"]
    grown = shape == "tree"
    drafter = BlockTreeDrafter(bundle, head) if grown else BlockDrafter(bundle, head)
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    positions = _positions(p, head.block)
    paths = _paths(p, positions) if shape == "static" else []
    cost = input_cost(bundle) if p["size"] == "cost" and shape != "static" else None
    draft = block_price(bundle, head) if grown and cost is not None else 0.0
    copies = CopiedBranch(None, p["lookup"], cost) if grown and p["lookup"] else None

    context = yield from start(bundle, cache, prompt_ids, sampler, budget, drafter)
    if cost is not None:  # what the drafts are sized by here, for the run's record
        yield Priced(0, round(cost, 5), round(draft, 5), forward_ms(bundle))
    step = 0
    while not budget.done:
        step += 1
        # The target adds one token of its own, so never draft past remaining - 1.
        room = min(positions, budget.remaining - 1)
        if room <= 0:  # the last token: a plain target step
            yield from verify_chain(
                bundle, cache, context, [], sampler, budget, step, None, drafter
            )
            continue
        copied = None
        if grown:  # the block's one forward runs as the tree's root; its rows give every depth
            assert isinstance(drafter, BlockTreeDrafter)
            left = budget.remaining - 1  # a copy may reach past the block
            copied = copies.propose(context, step, left) if copies is not None else None
            drafter.begin(context, step)
            grower = Grower(drafter, sampler, step)
            tree = grow_dynamic(grower, context[-1], room, p["top_k"], p["nodes"], cost, draft)
            rows = drafter.rows
            drafter.end()
            yield from grower.events
            assert rows is not None, "the tree's root runs the block's forward"
        else:
            filled = drafter.fill(context, step)
            yield filled.event
            rows = filled.logits
        # The positions' distributions and candidates: what the chain and the static tree draft
        # from, and what the view shows (a grown tree's were read by its grower already).
        dists = sampler.distribution(rows) if cfg.detail or not grown else None
        top = torch.topk(dists, TOP, dim=-1) if dists is not None else None
        if cfg.detail and top is not None:
            yield BlockFill(
                step,
                len(budget.tokens),
                tuple(tuple(int(t) for t in row) for row in top.indices.tolist()),
                tuple(tuple(round(float(q), 6) for q in row) for row in top.values.tolist()),
            )
        if not grown and not paths:  # the chain
            assert dists is not None
            draft_tokens, q_rows = chain_from(dists, sampler, room, cost)
            if draft_tokens:
                yield chain_draft(step, drafter.label, draft_tokens, q_rows)
            yield from verify_chain(
                bundle, cache, context, draft_tokens, sampler, budget, step, q_rows, drafter
            )
            continue
        if paths:  # the static tree: ranks over the positions' candidates
            assert top is not None
            tree = TreeDraft.from_nodes(*tree_from(paths, top.indices, top.values, room))
        label, grafted = drafter.label, 0
        if copied is not None and copies is not None and (chain := copies.cut(tree)):
            grafted = graft(tree, chain)
            label += f" + {copies.name} (n={copies.n}, {grafted} new nodes)"
        own = range(len(tree.tokens) - grafted, len(tree.tokens))  # graft appends
        event = draft_event(step, label, tree, copied=own)
        yield dataclasses.replace(event, match=copies.n if copied is not None else 0)
        verdict, logits = yield from verify_tree(
            bundle,
            cache,
            context,
            tree.tokens,
            tree.parents,
            sampler,
            budget,
            step,
            drafter=drafter,
        )
        if copies is not None:
            copies.accepted(tree, verdict.accepted, logits)


def block_price(bundle: ModelBundle, head: BlockHead) -> float:
    """One block forward, in one-token target forwards (`costs.draft_price`: measured the first
    time it is needed on a short fixed-size run, then stored under the drafter's label, which
    `token_tree` with draft=block shares), so that every run grows the same trees."""

    def runs() -> Iterator[Event]:
        params = validate_params(PARAMS, {"size": "fixed", "lookup": 0}, "block_draft")
        cfg = DecodeConfig(16, frozenset(), params, detail=False)
        prompt = [i % bundle.model.config.vocab_size for i in range(7, 71)]
        return decode_with(bundle, prompt, cfg, head)

    return draft_price(bundle, BlockDrafter(bundle, head).label, None, runs)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    name="block_draft",
    family="draft and verify",
    rank=5,
    title="Block drafting (one drafter forward fills the whole draft, DFlash-style)",
    decode=decode,
    params=PARAMS,
    # DFlash verifies the whole block as one chain. The default (a grown tree, top_k 3, 24 nodes,
    # the prompt-lookup branch) from a sweep on the 16 tuning prompts (64 tokens, one thread):
    # modelled 2.14x (top_k 2 2.07x, 4 2.13x; without lookup 1.82x), speculative 1.64x in the
    # same run; the chain 1.20x on the same prompts a day before (docs/BENCHMARKS.md).
    presets={"paper": {"shape": "chain", "size": "fixed", "block": 0, "lookup": 0}},
    check=check,
    summary="A small head fills a whole block of draft positions in one forward; the target verifies it in one more.",
    relaxable=True,
    views=("block_fill",),
    events=("BlockFill", "Draft", "Priced", "Verify"),
    compare={
        "drafting in one pass vs one token at a time": (
            "block_draft",
            "block_draft:shape=chain",
            "speculative",
            "medusa",
            "token_tree",
        ),
    },
)
