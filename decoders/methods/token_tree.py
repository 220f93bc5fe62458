"""Token-tree speculative decoding: draft a TREE of likely continuations, verify it in ONE forward.

A chain draft dies at its first wrong token; a tree keeps alternatives at every depth, so the
target can follow whichever branch it agrees with (SpecInfer, Medusa, EAGLE).

    repeat:
        x = last committed token
        grow the tree with the drafter, one batched forward per depth:
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
                     size=cost only as many copies as pay, by how often copies were right;
                     with trust = t, a match of >= t tokens is the whole draft and the
                     drafter is skipped (SAM-Decoding switches on match length the same way)
        p = target([x, *tree]) with a tree attention mask: node i sees the context + its ancestors
        greedy:   follow the target's argmax down the tree while the tree has that child
        sampling: at each node try its children in order with the multi-draft residual rule
        keep the KV of x and the accepted path only (compacted), commit path + the target's token
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from decoders.core.base import Budget, DecodeConfig, Method
from decoders.core.costs import drafter_price, forward_ms, input_cost, pays, price_table
from decoders.core.drafter import Drafter
from decoders.core.errors import InvalidParameter
from decoders.core.events import Draft, Event, Forward, Priced
from decoders.core.models import ModelBundle
from decoders.core.params import Param, validate_params
from decoders.core.prices import drafter_key
from decoders.core.runtime import new_cache
from decoders.core.sampling import Sampler
from decoders.core.steps import start, verify_tree
from decoders.core.tree import depths, feed_mask
from decoders.methods.prompt_lookup import lookup
from decoders.methods.sam import Retriever, retriever
from decoders.methods.speculative import DRAFT_HELP
from decoders.trained.drafters import SelfDrafter, check_draft, make_drafter

# A Medusa-style static tree: 15 nodes, 4 deep, wider where the draft is usually right.
DEFAULT_CHOICES = "0 1 2 3 0.0 0.1 0.2 1.0 1.1 2.0 0.0.0 0.0.1 0.1.0 1.0.0 0.0.0.0"
MAX_NODES = 64

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
    Param(
        "trust",
        int,
        3,
        "with lookup > 0: when the copied chain matched at least this many tokens (1-3), draft it "
        "alone and skip the drafter this step (SAM-Decoding's switch); 0 = always grow the tree "
        "(no effect without a lookup branch)",
        0,
        3,
    ),
)


def parse_choices(text: str) -> list[tuple[int, ...]]:
    """'0 1 0.0' -> [(0,), (1,), (0, 0)], sorted by depth; every path's parent must be listed."""
    try:
        paths = [tuple(int(r) for r in item.split(".")) for item in text.replace(",", " ").split()]
    except ValueError:
        raise InvalidParameter(
            f"choices {text!r}: expected paths like '0 1 0.0' (dot-separated child ranks)"
        ) from None
    if not paths or len(paths) > MAX_NODES:
        raise InvalidParameter(f"choices: give 1..{MAX_NODES} paths, got {len(paths)}")
    known = set(paths)
    for path in paths:
        if any(r < 0 or r >= 16 for r in path):
            raise InvalidParameter(
                f"choices: ranks must be in 0..15, got {'.'.join(map(str, path))}"
            )
        if len(path) > 1 and path[:-1] not in known:
            raise InvalidParameter(
                f"choices: path {'.'.join(map(str, path))} needs its parent "
                f"{'.'.join(map(str, path[:-1]))} in the list"
            )
    return sorted(known, key=lambda p: (len(p), p))


@dataclass
class TreeDraft:
    """A draft tree under construction; node order = the order nodes were created (parents first)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # draft probability given the parent
    score: list[float] = field(default_factory=list)  # cumulative draft probability of the path

    def add(self, token: int, parent: int, prob: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(prob)
        self.score.append(prob * (self.score[parent] if parent >= 0 else 1.0))
        return len(self.tokens) - 1


class Grower:
    """Feeds tree nodes to the drafter a level at a time and returns their next-token distributions."""

    def __init__(self, drafter: Drafter, sampler: Sampler, step: int) -> None:
        self.drafter, self.sampler, self.step = drafter, sampler, step
        self.fed: list[int] = []
        self.events: list[Forward] = []

    def root(self, x: int) -> torch.Tensor:
        out = self.drafter.forward([x], self.step, logits_to_keep=1)
        self.events.append(out.event)
        self.base = self.drafter.cache_length + 1  # context + x
        return self._dist(out.logits)[0]

    def expand(self, tree: TreeDraft, nodes: Sequence[int]) -> list[torch.Tensor]:
        mask = feed_mask(tree.parents, self.fed, nodes, self.base)
        positions = [self.base + d for d in (depths(tree.parents)[n] for n in nodes)]
        # Inputs this step: x, then the fed nodes in order; a node continues its parent's input.
        slot = {-1: 0, **{node: 1 + i for i, node in enumerate(self.fed)}}
        parents = [slot[tree.parents[n]] for n in nodes]
        out = self.drafter.forward(
            [tree.tokens[n] for n in nodes], self.step, positions, mask, parents=parents
        )
        self.events.append(out.event)
        self.fed.extend(nodes)
        return list(self._dist(out.logits))

    def _dist(self, logits: torch.Tensor) -> torch.Tensor:
        # Greedy: rank by the plain softmax. Sampling: by the tempered / truncated distribution.
        return self.sampler.distribution(logits)


def grow_dynamic(
    grower: Grower,
    x: int,
    depth: int,
    top_k: int,
    keep: int,
    cost: float | None = None,
    draft: float = 0.0,
) -> TreeDraft:
    """EAGLE-2: expand the top_k most confident frontier nodes per depth, then rerank globally.

    cost (size=cost): what one more verified input costs, as a fraction of a one-token forward.
    Then only the nodes worth it are kept (`worth`; at least the most probable one). A level is
    expanded only while it is worth its draft forward too: the children it should bring (the
    expanded nodes' path probabilities × how sure the drafter has been this step) must beat what
    that forward (`draft`, in one-token target forwards) and their inputs cost at the step's
    current rate. A child's score never exceeds its parent's, so a level not worth drafting
    ends the growth."""
    tree = TreeDraft()
    root = grower.root(x)
    sure = [float(root.max())]  # the drafter's top probability in each distribution this step
    frontier = _children(tree, -1, root, top_k)
    for _ in range(depth - 1):
        best = sorted(frontier, key=lambda n: -tree.score[n])[:top_k]
        if cost is not None:
            rate = _value(tree.score, cost, keep, draft * len(grower.events))
            gain = sum(sure) / len(sure) * sum(tree.score[n] for n in best)
            if gain <= rate * (draft + cost * len(best)):
                break
        dists = grower.expand(tree, best)
        sure += [float(d.max()) for d in dists]
        frontier = [
            c for n, dist in zip(best, dists, strict=True) for c in _children(tree, n, dist, top_k)
        ]
    # A child's score never exceeds its parent's, so the top `keep` (ties: older first) is a tree.
    kept = sorted(range(len(tree.tokens)), key=lambda n: (-tree.score[n], n))[:keep]
    if cost is not None:  # the best guess is always checked: one input, and a step to show
        spent = draft * len(grower.events)
        kept = kept[: max(1, worth([tree.score[n] for n in kept], cost, spent))]
    return _subtree(tree, sorted(kept))


def worth(scores: Sequence[float], cost: float, spent: float = 0.0) -> int:
    """How many of `scores` (descending path probabilities) to verify for the most tokens per
    unit of time: nodes join, most probable first, while each `pays` for its input (`spent`:
    the drafting already done this step, in one-token forwards)."""
    n, total = 0, 0.0
    for s in scores:
        if not pays(s, total, n, cost, spent):
            break
        n, total = n + 1, total + s
    return n


def _value(scores: Sequence[float], cost: float, cap: int, spent: float = 0.0) -> float:
    """Tokens per unit of step time of the best selection among `scores` so far."""
    top = sorted(scores, reverse=True)[:cap]
    n = worth(top, cost, spent)
    return (1.0 + sum(top[:n])) / (1.0 + spent + cost * n)


def draft_cost(bundle: ModelBundle, spec: str) -> float:
    """What one draft forward of drafter `spec` costs, in one-token target forwards, from the
    price table (costs.PriceTable), so that every run grows the same trees: the target's first
    k layers (self:k) by the table's depth rule; a trained head or another model by its price in
    the table, measured the first time it is needed and stored (the median draft forward of a
    short fixed-size tree run on a synthetic prompt, against the table's one-token forward).
    About 0.05 for a bfloat16 EAGLE head beside this repo's embedded model on a 2-core CPU."""
    drafter = make_drafter(spec, bundle, new_cache(bundle))
    if isinstance(drafter, SelfDrafter):
        return price_table(bundle).forward(1, drafter.depth or 0, bundle.n_layers)

    def measure() -> float:
        params = validate_params(
            PARAMS, {"draft": spec, "size": "fixed", "lookup": 0}, "token_tree"
        )
        cfg = DecodeConfig(16, frozenset(), params, detail=False)
        prompt = [i % bundle.model.config.vocab_size for i in range(7, 71)]
        times = [
            e.wall_ms
            for e in decode(bundle, prompt, cfg)
            if isinstance(e, Forward) and e.kind == "draft" and e.step > 1
        ]
        return statistics.median(times) / forward_ms(bundle) if times else 0.0

    return drafter_price(bundle, drafter_key(drafter.label), measure)


def grow_static(grower: Grower, x: int, choices: list[tuple[int, ...]], depth: int) -> TreeDraft:
    """Medusa-style: each path is a list of child ranks under the draft's distribution."""
    tree = TreeDraft()
    node_of: dict[tuple[int, ...], int] = {}
    dist_of: dict[tuple[int, ...], torch.Tensor] = {(): grower.root(x)}
    for level in range(1, depth + 1):
        paths = [p for p in choices if len(p) == level and p[:-1] in dist_of]
        for path in paths:
            parent = node_of.get(path[:-1], -1)
            order = torch.argsort(dist_of[path[:-1]], descending=True)
            token = int(order[path[-1]])
            node_of[path] = tree.add(token, parent, float(dist_of[path[:-1]][token]))
        parents_next = [
            p for p in paths if any(len(c) == level + 1 and c[:-1] == p for c in choices)
        ]
        if level < depth and parents_next:
            dists = grower.expand(tree, [node_of[p] for p in parents_next])
            dist_of.update(zip(parents_next, dists, strict=True))
    return tree


def graft(tree: TreeDraft, branch: Sequence[int]) -> int:
    """Merge a chain into the tree: walk the nodes that already spell its prefix, add the rest
    (point-mass drafts, probability 1). Returns the number of nodes added."""
    path = spelled(tree, branch)
    node = path[-1] if path else -1
    for token in branch[len(path) :]:
        node = tree.add(token, node, 1.0)
    return len(branch) - len(path)


def graft_scored(tree: TreeDraft, other: TreeDraft, cost: float | None, cap: int) -> int:
    """Merge another draft tree into `tree`: its nodes join, likeliest path first (`other.score`),
    where their parent is in (or joins) the tree, while each `pays` beside the tree's nodes
    (every one up to `cap` when cost is None). A node the tree already spells is free. Returns
    the number of nodes added."""
    where: dict[int, int] = {-1: -1}  # other's node -> tree's node
    added = 0
    total, count = sum(tree.score), len(tree.tokens)
    for n in sorted(range(len(other.tokens)), key=lambda n: (-other.score[n], n)):
        parent = where.get(other.parents[n])
        if parent is None:
            continue
        same = next(
            (
                c
                for c, q in enumerate(tree.parents)
                if q == parent and tree.tokens[c] == other.tokens[n]
            ),
            None,
        )
        if same is not None:
            where[n] = same
            continue
        score = other.score[n]
        if added >= cap or (cost is not None and not pays(score, total, count, cost)):
            continue
        where[n] = tree.add(other.tokens[n], parent, other.probs[n])
        total, count, added = total + score, count + 1, added + 1
    return added


def spelled(tree: TreeDraft, branch: Sequence[int]) -> list[int]:
    """The nodes that spell `branch` from the root, as far as the tree holds it."""
    path, node = [], -1
    for token in branch:
        node = next(
            (c for c, p in enumerate(tree.parents) if p == node and tree.tokens[c] == token), None
        )
        if node is None:
            break
        path.append(node)
    return path


class CopyRates:
    """How often a copied token is accepted, for size=cost: the first one after a match of n
    tokens, and each one after an accepted copy. A copied chain is a point-mass draft (p = 1) to
    the verifier, but far from sure to be right. The priors (weighing 8 steps) were measured on
    the tuning prompts; each run updates them from its own verdicts, so a text that repeats itself
    earns longer copies. One table per source: prompt lookup's n-gram copy (after a 1-token match
    16 % of first copies were accepted, after 2 42 %, after 3 67 %, about 3 in 4 of the next
    ones once on track), the context's automaton (SAM: the longest match, so longer n) and the
    datastore's (the most frequent continuation of text the model wrote elsewhere)."""

    PRIOR_WEIGHT = 8.0
    PRIORS: ClassVar[dict[str, tuple[dict[int, float], float]]] = {
        "prompt": ({1: 0.16, 2: 0.42, 3: 0.67}, 0.75),
        "context": ({1: 0.16, 2: 0.42, 3: 0.67, 4: 0.72, 5: 0.77, 6: 0.8}, 0.75),
        "datastore": ({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.45, 6: 0.5}, 0.6),
    }

    def __init__(self, source: str = "prompt") -> None:
        w = self.PRIOR_WEIGHT
        first, then = self.PRIORS[source]
        self.first = {n: [r * w, w] for n, r in first.items()}  # [accepted, seen]
        self.then = [then * w, w]
        self.longest = max(first)

    def _first(self, n: int) -> list[float]:
        return self.first[min(max(n, 1), self.longest)]

    def score(self, n: int, k: int) -> float:
        """The chance that the k-th copied token (from 0) is accepted, after a match of n."""
        (a, seen), (b, after) = self._first(n), self.then
        return a / seen * (b / after) ** k

    def cut(self, tree: TreeDraft, branch: Sequence[int], n: int, cost: float) -> list[int]:
        """The prefix of `branch` worth grafting onto `tree`: what the tree already spells is free;
        each further copy joins while it `pays` beside the tree's nodes."""
        k = len(spelled(tree, branch))
        total, count = sum(tree.score), len(tree.tokens)
        while k < len(branch) and pays(self.score(n, k), total, count, cost):
            total, count, k = total + self.score(n, k), count + 1, k + 1
        return list(branch[:k])

    def update(self, tree: TreeDraft, branch: Sequence[int], n: int, accepted: Sequence[int]):
        """Count the verdict on each copied token the target compared (the first, and each one
        whose parent it accepted)."""
        kept = set(accepted)
        for k, node in enumerate(spelled(tree, branch)):
            counts = self._first(n) if k == 0 else self.then
            counts[0] += node in kept
            counts[1] += 1
            if node not in kept:
                break


def _children(tree: TreeDraft, parent: int, dist: torch.Tensor, k: int) -> list[int]:
    values, tokens = torch.topk(dist, k)
    return [tree.add(int(t), parent, float(v)) for v, t in zip(values, tokens, strict=True)]


def _subtree(tree: TreeDraft, nodes: list[int]) -> TreeDraft:
    """The tree restricted to `nodes` (ancestor-closed, in creation order), renumbered."""
    index = {n: i for i, n in enumerate(nodes)}
    out = TreeDraft()
    for n in nodes:
        out.add(tree.tokens[n], index.get(tree.parents[n], -1), tree.probs[n])
    return out


# The recycled branch's template: the likeliest successors first, 4 deep.
RECYCLE_TEMPLATE = parse_choices("0 1 2 0.0 0.1 1.0 0.0.0 0.0.0.0")


def adjacency(bundle: ModelBundle):
    """A fresh Token Recycling matrix for one run, warm-started from the datastore."""
    from decoders.methods.recycling import Adjacency, warm_start  # it builds on this module

    return Adjacency(int(bundle.model.config.vocab_size), warm_start(bundle))


COPY_NAMES = {"prompt": "prompt lookup", "context": "SAM context", "datastore": "SAM datastore"}


def copy_branch(
    found: Retriever | None, context: list[int], size: int, cap: int
) -> tuple[list[int], int, str]:
    """The copied branch for this step: (chain, match length, source), source "prompt" (prompt
    lookup's n-gram), "context" or "datastore" (the sam method's automata: its chain, the most
    frequent path from the datastore); ([], 0, "") when nothing matched or size is 0."""
    if not size:
        return [], 0, ""
    if found is None:
        chain, n = lookup(context, 3, min(size, cap))
        return chain, n, "prompt"
    found.catch_up(context)
    got = found.retrieve(min(size, cap), chain_only=True)
    return (list(got.tokens), got.n, got.source) if got else ([], 0, "")


def node_cost(bundle: ModelBundle, size: str) -> float | None:
    """The per-input verification cost `size` asks for; None = fixed size. Raises on a bad value."""
    if size == "fixed":
        return None
    if size == "cost":
        return input_cost(bundle)
    try:
        cost = float(size)
    except ValueError:
        cost = -1.0
    if not 0.0 <= cost <= 10.0:
        raise InvalidParameter(
            f"size {size!r}: expected 'cost', 'fixed' or a cost per input between 0 and 10"
        )
    return cost


def check(bundle: ModelBundle, params) -> None:
    check_draft(bundle, params)
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
    rates = {source: CopyRates(source) for source in CopyRates.PRIORS}
    found = retriever(bundle, prompt_ids, "auto") if p["lookup"] and p["copy"] == "sam" else None
    recycled = adjacency(bundle) if p["recycle"] else None

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
        copied, n, source = copy_branch(found, context, p["lookup"], depth_cap)
        name = COPY_NAMES[source] if copied else ""
        if copied and p["trust"] and n >= p["trust"] and source != "datastore":
            if cost is not None:
                copied = rates[source].cut(tree, copied, n, cost)
            grafted = graft(tree, copied)  # a long match: the copied chain alone is the draft
            label = f"{name} (n={n}, trusted: drafter skipped)"
        elif depth_cap > 0:
            for catch_up in drafter.begin(context, step):
                yield catch_up.event
            grower = Grower(drafter, sampler, step)
            if choices:
                tree = grow_static(grower, x, choices, min(depth_cap, max(map(len, choices))))
            else:
                tree = grow_dynamic(
                    grower, x, min(p["depth"], depth_cap), p["top_k"], p["nodes"], cost, draft
                )
            drafter.end()
            yield from grower.events
            if recycled is not None:
                more = graft_scored(
                    tree, recycled.draft(x, RECYCLE_TEMPLATE, depth_cap), cost, p["recycle"]
                )
                if more:
                    label += f" + token recycling ({more} nodes)"
            if copied and cost is not None:
                copied = rates[source].cut(tree, copied, n, cost)
            if copied:
                grafted = graft(tree, copied)
                label += f" + {name} (n={n}, {grafted} new nodes)"
        if tree.tokens:
            yield Draft(
                step,
                label,
                tuple(tree.tokens),
                tuple(tree.parents),
                tuple(round(v, 6) for v in tree.probs),
                # graft appends: the copy's own nodes are the last ones
                copied=tuple(range(len(tree.tokens) - grafted, len(tree.tokens))),
            )

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
        if copied and cost is not None:
            rates[source].update(tree, copied, n, verdict.accepted)
        if recycled is not None:
            recycled.update([x, *tree.tokens], logits)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
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
