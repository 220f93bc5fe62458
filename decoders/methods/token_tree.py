"""Token-tree speculative decoding: draft a TREE of likely continuations, verify it in ONE forward.

A chain draft dies at its first wrong token; a tree keeps alternatives at every depth, so the
target can follow whichever branch it agrees with (SpecInfer, Medusa, EAGLE).

    repeat:
        x = last committed token
        grow the tree with the drafter, one batched forward per depth (draft=block: the block
        head's ONE forward gives every depth, a node at depth d reading position d + 1):
            static  (Medusa-style choice list): the paths are fixed ranks, e.g. "0.1" = the 2nd most
                     likely child of the most likely first token
            dynamic (EAGLE-2): expand the top_k nodes with the highest cumulative draft
                     probability at each depth, then keep the `nodes` most confident nodes overall
                     size=cost: keep fewer, only the nodes worth verifying on this machine: with
                     E[tokens] ≈ 1 + Σ path probabilities and a forward costing 1 + c per input,
                     a node pays while its path probability > c × (tokens per unit so far);
                     growth stops once no frontier node would pay (nothing deeper can)
        lookup > 0: graft the prompt-lookup continuation (the tokens that followed the first earlier
                     occurrence of the context's suffix) onto the tree as one more branch
                     (SpecInfer merges the trees of several drafters the same way); with
                     size=cost only as many copies as pay, by how often copies were right
        trust = t > 0: a long enough match wins outright: when the copied chain's match is
                     >= t tokens (copy=sam: the longest suffix of the context found earlier in
                     the context, by its suffix automaton; copy=prompt: the 1-3-token key,
                     extended back over the tokens that agree before it where it was found),
                     the copy REPLACES the drafter's tree this step and the drafter is skipped
                     (TensorRT-LLM's suffix automaton overrides the draft from
                     sa_spec_threshold = 4 tokens; SAM-Decoding switches the same way); a
                     datastore match never does (its chain is other text's likeliest sequel)
        p = target([x, *tree]) with a tree attention mask: node i sees the context + its ancestors
        greedy:   follow the target's argmax down the tree while the tree has that child
        sampling: at each node try its children in order with the multi-draft residual rule
        keep the KV of x and the accepted path only (compacted), commit path + the target's token

The parts live in decoders/drafting/: eagle.py grows the tree, copied.py the grafted branches
(copied, recycled), trees.py the tree and the rule for its size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.costs import draft_price, forward_ms
from decoders.core.events import Event, Priced
from decoders.core.models import ModelBundle
from decoders.core.params import Param, validate_params
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.drafting.copied import RECYCLE_TEMPLATE, CopiedBranch, adjacency
from decoders.drafting.eagle import Grower, grow_dynamic, grow_static
from decoders.drafting.recycled import RecycledProposer
from decoders.drafting.retrieval import retriever
from decoders.drafting.trees import (
    MAX_NODES,
    TreeDraft,
    draft_event,
    graft,
    graft_scored,
    node_cost,
    parse_choices,
)
from decoders.trained.drafters import DRAFT_HELP, SelfDrafter, check_draft, make_drafter

# A Medusa-style static tree: 15 nodes, 4 deep, wider where the draft is usually right.
DEFAULT_CHOICES = "0 1 2 3 0.0 0.1 0.2 1.0 1.1 2.0 0.0.0 0.0.1 0.1.0 1.0.0 0.0.0.0"
# The longest match `trust` can ask for: as long as the longest copied chain (lookup's bound).
MAX_TRUST = 32

PARAMS = (
    Param("draft", str, "auto", DRAFT_HELP),
    Param(
        "shape",
        str,
        "dynamic",
        "dynamic = EAGLE-2 (expand the most confident nodes); static = the choice list below",
        choices=("dynamic", "static"),
    ),
    Param("depth", int, 6, "dynamic: tree depth (draft forwards per step, at most)", 1, 10),
    Param(
        "top_k", int, 3, "dynamic: nodes expanded per depth, and children per expanded node", 1, 8
    ),
    Param("nodes", int, 24, "dynamic: draft nodes kept for verification (at most)", 1, MAX_NODES),
    Param(
        "size",
        str,
        "cost",
        "dynamic: cost = verify only the nodes worth their price on this machine (a node joins "
        "while its path probability beats what one more input costs a forward here, measured "
        "once per model) and stop growing when no deeper node could; a number = assume that "
        "cost per input (a fraction of a one-token forward: 0 keeps every node, as on a GPU); "
        "fixed = always the `nodes` most confident",
    ),
    Param(
        "choices",
        str,
        DEFAULT_CHOICES,
        "static: the tree as paths of child ranks, e.g. '0 1 0.0' (0 = the draft's top token)",
    ),
    Param(
        "lookup",
        int,
        16,
        "prompt-lookup branch: also graft up to this many tokens copied from an earlier "
        "occurrence of the last 1-3 tokens (as prompt_lookup drafts) onto the tree; 0 = off",
        0,
        32,
    ),
    Param(
        "copy",
        str,
        "prompt",
        "where the copied branch comes from: sam = the longest earlier match of the context's end "
        "in the context or the datastore (suffix automata, as the sam method drafts); prompt = "
        "prompt lookup's 1-3-token match in the context",
        choices=("sam", "prompt"),
    ),
    Param(
        "recycle",
        int,
        0,
        "Token Recycling branch: also graft up to this many nodes (of an 8-node template) read "
        "from an adjacency matrix of the target's own top successors (as the recycling method "
        "drafts; no forward), with size=cost only those that pay; 0 = off",
        0,
        8,
    ),
    # Default from a sweep on 8 of assets/tuning_prompts.jsonl (64 tokens, one thread, the other
    # defaults): t = 3 skipped 26 of 312 draft forwards at 2.00 tokens per forward (t = 0: 2.01)
    # for the least work, 1.187x modelled (t = 0 1.183x, 4 1.184x, 8 1.186x: within the price
    # table's error); copy=sam drafted 2.05-2.07 tokens per forward but its datastore branches
    # cost more inputs (1.172-1.175x), and letting datastore matches override too did worse
    # (1.153x); every run identical to greedy. Fresh answers rarely repeat 3+ tokens; a text
    # that repeats itself (code edits, lists) is where the override pays.
    Param(
        "trust",
        int,
        3,
        "with lookup > 0, a long enough match wins outright: when the copied chain's match is at "
        "least this many tokens (copy=sam: the longest suffix of the context found earlier in "
        "the context; prompt: the 1-3-token key extended back over the tokens that agree before "
        "it), the copy replaces the drafter's draft this step and the drafter is skipped "
        "(TensorRT-LLM's sa_spec_threshold, SAM-Decoding's switch; a datastore match never "
        "does); 0 = always grow the tree (no effect without a lookup branch)",
        0,
        MAX_TRUST,
    ),
)


def draft_cost(bundle: ModelBundle, spec: str) -> float:
    """What one draft forward of drafter `spec` costs, in one-token target forwards, from the
    price table (costs.draft_price), so that every run grows the same trees: the target's first
    k layers (self:k) by the table's depth rule; a trained head or another model by its price in
    the table, measured the first time it is needed and stored (the median draft forward of a
    short fixed-size tree run on a synthetic prompt, against the table's one-token forward).
    About 0.05 for a bfloat16 EAGLE head beside this repo's embedded model on a 2-core CPU."""
    drafter = make_drafter(spec, bundle, new_cache(bundle))
    depth = (drafter.depth or 0) if isinstance(drafter, SelfDrafter) else None

    def runs() -> Iterator[Event]:
        params = validate_params(
            PARAMS, {"draft": spec, "size": "fixed", "lookup": 0}, "token_tree"
        )
        cfg = DecodeConfig(16, frozenset(), params, detail=False)
        prompt = [i % bundle.model.config.vocab_size for i in range(7, 71)]
        return decode(bundle, prompt, cfg)

    return draft_price(bundle, drafter.label, depth, runs)


def check(bundle: ModelBundle, params) -> None:
    check_draft(bundle, params, trees=True)
    if params["size"] not in ("cost", "fixed"):
        node_cost(bundle, params["size"])
    if params["shape"] == "static":
        parse_choices(params["choices"])


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    choices = parse_choices(p["choices"]) if p["shape"] == "static" else []
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    drafter = make_drafter(p["draft"], bundle, cache)
    cost = node_cost(bundle, p["size"]) if p["shape"] == "dynamic" else None
    # size=cost prices the drafting too; a cost given by number prices inputs only
    draft = draft_cost(bundle, p["draft"]) if cost is not None and p["size"] == "cost" else 0.0
    found = retriever(bundle, prompt_ids, "auto") if p["lookup"] and p["copy"] == "sam" else None
    copies = CopiedBranch(found, p["lookup"], cost)
    recycled = RecycledProposer(adjacency(bundle), RECYCLE_TEMPLATE) if p["recycle"] else None

    context = yield from start(bundle, cache, prompt_ids, sampler, budget, drafter)
    if cost is not None:  # what the tree is sized by here, for the run's record
        yield Priced(0, round(cost, 5), round(draft, 5), forward_ms(bundle))
    step = 0
    while not budget.done:
        step += 1
        x = context[-1]
        # The target adds one token after the accepted path: keep paths within remaining - 1.
        depth_cap = budget.remaining - 1
        tree, label, grafted = TreeDraft(), drafter.label, 0
        copied = copies.propose(context, step, depth_cap)
        more = recycled.propose(context, step, depth_cap) if recycled is not None else None
        override = p["trust"] if copied and copies.overrides(p["trust"]) else 0
        if override:  # a long match wins outright: the copied chain alone, no drafter
            grafted = graft(tree, copies.cut(tree))
            label = f"{copies.name} (n={copies.n} ≥ {override}: replaces the drafter's draft)"
        elif depth_cap > 0:
            for catch_up in drafter.begin(context, step):
                yield catch_up.event
            grower = Grower(drafter, sampler, step)
            reach = min(depth_cap, drafter.reach or depth_cap)  # a block head fills `reach`
            if choices:
                tree = grow_static(grower, x, choices, min(reach, max(map(len, choices))))
            else:
                tree = grow_dynamic(
                    grower, x, min(p["depth"], reach), p["top_k"], p["nodes"], cost, draft
                )
            drafter.end()
            yield from grower.events
            if added := graft_scored(tree, more, cost, p["recycle"]):
                label += f" + token recycling ({added} nodes)"
            if copied and (chain := copies.cut(tree)):
                grafted = graft(tree, chain)
                label += f" + {copies.name} (n={copies.n}, {grafted} new nodes)"
        if tree.tokens:  # graft appends: the copy's own nodes are the last ones
            copy = range(len(tree.tokens) - grafted, len(tree.tokens))
            match = copies.n if copied else 0
            event = draft_event(step, label, tree, copied=copy)
            yield dataclasses.replace(event, match=match, override=override)

        # ONE target forward over x and the whole tree; keep x and the accepted path, commit.
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
        copies.accepted(tree, verdict.accepted, logits)
        if recycled is not None:
            recycled.accepted(tree, verdict.accepted, logits)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="tree",
        place=1,
        title="Many guesses at once: the token tree",
        narration=(
            "Why bet on one guess? A tree drafts several continuations, branching where the "
            "drafter is unsure, and the target checks every branch in a single forward: a "
            "tree-shaped attention mask lets each node see only its own ancestors. The longest "
            "branch the target agrees with wins, and one more token of the target's own comes "
            "free. A wider forward costs a little more than a one-token forward, so the tree's "
            "size is chosen by this machine's measured cost of each extra input."
        ),
        look=("the green path: every node on it was accepted, all checked in one forward."),
        focus=("accepted", "bonus", "correction", "root"),
        head_drafted=True,
    ),
    TourStop(
        chapter="tree",
        place=2,
        title="A copied branch joins the tree",
        narration=(
            "The tree takes guesses from two sources. Beside the trained drafter, a chain copied "
            "from the context (prompt lookup: the tokens that followed the last few tokens' "
            "earlier occurrence) is grafted onto the tree, outlined in purple. Copying is free "
            "and code repeats its own names, so when the match is long the tree trusts the copy "
            "alone and skips the drafter. Whichever branch the target agrees with wins; the "
            "figure's subtitle says which."
        ),
        look=("the purple-outlined copied branch and how far along it the target agreed."),
        rule="copied_won",
        key="token_tree_copy",
        focus=("accepted", "copied", "bonus", "correction", "root"),
        same_run_as="token_tree",
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    family_best=True,  # Compare's "each family at its best"
    name="token_tree",
    family="draft and verify",
    rank=3,
    title="Token tree (static Medusa-style or dynamic EAGLE-2-style)",
    decode=decode,
    params=PARAMS,
    # EAGLE-2 (Li et al. 2024): depth 6, top-k 10 (8 is our cap), 60 nodes, no copied branch
    presets={
        "paper": {
            "shape": "dynamic",
            "depth": 6,
            "top_k": 8,
            "nodes": 60,
            "size": "fixed",
            "lookup": 0,
            "trust": 0,
        }
    },
    check=check,
    summary="Drafts a tree of alternatives; one forward with a tree mask verifies every branch.",
    relaxable=True,
    views=("token_tree",),
    events=("Draft", "Priced", "Verify"),
)
