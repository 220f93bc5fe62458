"""Medusa-1 (Cai et al. 2024): extra decoding heads on the target's last features propose a tree;
the target verifies it in the same forward that gives the heads their next features.

Head i reads the final features at the position where the target chose the root x (the last
committed token) and guesses the token i positions after x. Medusa's tree takes combinations of
their top-k: the path (0, 1) is head 1's top token followed by head 2's second. The heads do not
condition on each other, so every node at depth i is one of head i's candidates.

    f = the target's final features where it chose x           # prefill, then each verify forward
    repeat:
        top-k of head_i(f) for i = 1..depth                    # no decoder layer runs
        tree = the static choice list, each path (r_1, .., r_d) -> head d's rank-r_d token
        p, F = target([x, *tree]) with a tree mask             # ONE forward: logits and features
        greedy:   follow p's argmax down the tree while the tree has that child
        sampling: at each node try its children in order with the multi-draft residual rule
                  (tree nodes are point masses: chosen by rank, not sampled)
        keep the KV of x and the accepted path; commit path + the target's token (the next x)
        f = F at the last accepted node                        # where the target chose the next x

Medusa's "typical acceptance" (accept a node the target finds plausible enough) is lossy and left
out: every rule here gives exactly the target's output (greedy) or distribution (sampling).
The tree is the first `nodes` paths of the paper's 63-node tree (mc_sim_7b_63, listed in the order
its greedy search added them, so every prefix is a tree), or a list of one's own (`choices`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import Draft, Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.drafting.trees import parse_choices
from decoders.trained.medusa_heads import HEADS_HELP, HeadReader, Heads, Proposal, heads_for

# Medusa's sparse tree for Vicuna-7B (mc_sim_7b_63): 63 paths of head ranks, at most 4 deep,
# ranks below 10, in the order the paper's greedy search added them.
PAPER_TREE = (
    "0 0.0 1 0.1 2 0.0.0 1.0 0.2 3 0.3 4 0.4 2.0 0.5 0.0.1 5 0.6 6 0.7 0.1.0 1.1 7 0.8 0.0.2 "
    "3.0 0.9 8 9 1.0.0 0.2.0 1.2 0.0.3 4.0 2.1 0.0.4 0.0.5 0.0.0.0 0.1.1 0.0.6 0.3.0 5.0 1.3 "
    "0.0.7 0.0.8 0.0.9 6.0 0.4.0 1.4 7.0 0.1.2 2.0.0 3.1 2.2 8.0 0.5.0 1.5 1.0.1 0.2.1 9.0 "
    "0.6.0 0.0.0.1 1.6 0.7.0"
)
PAPER_PATHS = tuple(tuple(int(r) for r in p.split(".")) for p in PAPER_TREE.split())
MAX_TOP_K = 16  # parse_choices allows ranks 0..15

PARAMS = (
    Param(
        "nodes",
        int,
        8,
        "tree size: the first N paths of Medusa's 63-node tree (the order the paper's search "
        "added them); cut at the shipped heads' depth",
        1,
        len(PAPER_PATHS),
    ),
    Param(
        "top_k",
        int,
        10,
        "candidates per head: paths through a rank ≥ top_k are left out (1 = the chain of each "
        "head's top token)",
        1,
        MAX_TOP_K,
    ),
    Param(
        "choices",
        str,
        "",
        "a tree of your own instead of `nodes`: paths of head ranks, e.g. '0 1 0.0' = head 1's "
        "top two tokens, and head 2's top token under head 1's top (empty = Medusa's tree)",
    ),
    Param("heads", str, "", HEADS_HELP),
)


def tree_paths(params: Mapping[str, Any], n_heads: int) -> list[tuple[int, ...]]:
    """The static tree the parameters name, sorted by depth (parents first)."""
    if params["choices"].strip():
        paths = parse_choices(params["choices"])
        deepest = max(map(len, paths))
        if deepest > n_heads:
            raise InvalidParameter(
                f"choices: a path {deepest} deep needs {deepest} heads; {n_heads} are shipped"
            )
        widest = max(r for p in paths for r in p)
        if widest >= params["top_k"]:
            raise InvalidParameter(
                f"choices: rank {widest} needs top_k ≥ {widest + 1}, got {params['top_k']}"
            )
        return paths
    # A prefix of the paper's list is a tree; dropping a rank drops its subtree with it.
    kept = [
        p for p in PAPER_PATHS[: params["nodes"]] if len(p) <= n_heads and max(p) < params["top_k"]
    ]
    return sorted(kept, key=lambda p: (len(p), p))


def build_tree(
    paths: list[tuple[int, ...]], proposal: Proposal
) -> tuple[list[int], list[int], list[float]]:
    """Path (r_1, .., r_d) -> head d's rank-r_d token under the node of (r_1, .., r_{d-1}).
    Returns tokens, parents (-1 = under the root x) and each node's head probability."""
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, probs = [], [], []
    for path in paths:  # parents first
        head, rank = len(path) - 1, path[-1]
        index[path] = len(tokens)
        tokens.append(proposal.tokens[head][rank])
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        probs.append(proposal.probs[head][rank])
    return tokens, parents, probs


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    heads = heads_for(bundle, params["heads"])
    tree_paths(params, heads.n_heads)
    if params["top_k"] > len(heads.vocab):
        raise InvalidParameter(
            f"top_k = {params['top_k']}: the heads score only {len(heads.vocab)} tokens"
        )


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    yield from decode_with(bundle, prompt_ids, cfg, heads_for(bundle, cfg.params["heads"]))


def decode_with(
    bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig, heads: Heads
) -> Iterator[Event]:
    """`decode` with the given heads (the shipped ones, or a file being evaluated)."""
    paths = tree_paths(cfg.params, heads.n_heads)
    top_k = cfg.params["top_k"]
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    reader = HeadReader(bundle, heads)  # is handed the features of every forward's kept inputs

    context = yield from start(bundle, cache, prompt_ids, sampler, budget, reader)
    step = 0
    while not budget.done:
        step += 1
        # Propose: the heads on the features where the target chose x. The target adds one token
        # after the accepted path, so the tree stops at remaining - 1 levels.
        step_paths = [p for p in paths if len(p) <= budget.remaining - 1]
        tokens: list[int] = []
        parents: list[int] = []
        if step_paths:
            depth = max(map(len, step_paths))
            proposal = yield from reader.read(depth, top_k, step, len(budget.tokens), cfg.detail)
            tokens, parents, probs = build_tree(step_paths, proposal)
            yield Draft(step, "medusa", tuple(tokens), tuple(parents), tuple(probs))

        # Verify (and score the next proposal): ONE target forward over x and the tree.
        yield from verify_tree(
            bundle, cache, context, tokens, parents, sampler, budget, step, drafter=reader
        )


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="self",
        place=4,
        title="The model drafts for itself: Medusa's heads",
        narration=(
            "Medusa adds several small heads on the last layer: head k predicts the token k+1 "
            "positions ahead, all from the same forward. Their top choices combine into a tree of "
            "candidates that the next forward verifies with a tree mask. One forward both "
            "verifies the last guesses and produces the next ones, so drafting costs almost "
            "nothing. The heads are small and trained on this model's own outputs; how far ahead "
            "they can see is the limit: the first head is often right, the last rarely."
        ),
        look=("each head's candidates and which ones the target accepted."),
        head_drafted=True,
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="medusa",
    family="draft and verify",
    rank=4,
    title="Medusa (extra decoding heads, a static tree)",
    decode=decode,
    params=PARAMS,
    # Cai et al. 2024: the 63-node tree mc_sim_7b_63 over each head's top 10 (it fits here)
    presets={"paper": {"nodes": 63, "top_k": 10, "choices": ""}},
    check=check,
    summary="Heads on the target's last features guess the next tokens; their tree is verified in the forward that feeds them.",
    relaxable=True,
    # each head's guesses, then the tree they formed, verified
    views=(
        "heads_grid",
        "token_tree",
    ),
    events=("Draft", "HeadProposals", "Verify"),
)
