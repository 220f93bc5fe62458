"""Draft trees: what every proposer hands the verifier, and the one rule for how big they get.

A draft is a tree of tokens under the last committed token x (parents first; -1 = under x). A
chain is the tree whose parents are -1, 0, .., n-2. Trees merge (`graft`, `graft_scored`) and are
cut to the nodes worth verifying on this machine (`worth`, `keep_paying`): with E[tokens] ≈ 1 +
Σ path probabilities and a forward costing 1 + c per input, a node pays while its path
probability beats c × (tokens per unit of time so far) (`costs.pays`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from decoders.core.costs import input_cost, pays
from decoders.core.errors import InvalidParameter
from decoders.core.events import Draft
from decoders.core.models import ModelBundle

MAX_NODES = 64


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

    @classmethod
    def from_nodes(
        cls, tokens: Sequence[int], parents: Sequence[int], probs: Sequence[float]
    ) -> TreeDraft:
        """A tree from its parent array (parents first)."""
        tree = cls()
        for token, parent, prob in zip(tokens, parents, probs, strict=True):
            tree.add(token, parent, prob)
        return tree

    @classmethod
    def from_chain(cls, tokens: Sequence[int]) -> TreeDraft:
        """A copied chain: point-mass drafts (probability 1), each under the one before."""
        return cls.from_nodes(tokens, range(-1, len(tokens) - 1), [1.0] * len(tokens))


def draft_event(step: int, source: str, tree: TreeDraft, copied: Sequence[int] = ()) -> Draft:
    """The trace's record of a draft tree (probabilities to 6 places)."""
    return Draft(
        step,
        source,
        tuple(tree.tokens),
        tuple(tree.parents),
        tuple(round(v, 6) for v in tree.probs),
        copied=tuple(copied),
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


def children(tree: TreeDraft, parent: int, dist: torch.Tensor, k: int) -> list[int]:
    """Add the k likeliest tokens of `dist` under `parent`; returns the new nodes."""
    values, tokens = torch.topk(dist, k)
    return [tree.add(int(t), parent, float(v)) for v, t in zip(values, tokens, strict=True)]


def subtree(tree: TreeDraft, nodes: list[int]) -> TreeDraft:
    """The tree restricted to `nodes` (ancestor-closed, in creation order), renumbered."""
    index = {n: i for i, n in enumerate(nodes)}
    out = TreeDraft()
    for n in nodes:
        out.add(tree.tokens[n], index.get(tree.parents[n], -1), tree.probs[n])
    return out


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


def graft(tree: TreeDraft, branch: Sequence[int]) -> int:
    """Merge a chain into the tree: walk the nodes that already spell its prefix, add the rest
    (point-mass drafts, probability 1). Returns the number of nodes added."""
    path = spelled(tree, branch)
    node = path[-1] if path else -1
    for token in branch[len(path) :]:
        node = tree.add(token, node, 1.0)
    return len(branch) - len(path)


def graft_scored(tree: TreeDraft, other: TreeDraft | None, cost: float | None, cap: int) -> int:
    """Merge another draft tree into `tree`: its nodes join, likeliest path first (`other.score`),
    where their parent is in (or joins) the tree, while each `pays` beside the tree's nodes
    (every one up to `cap` when cost is None). A node the tree already spells is free. Returns
    the number of nodes added (0 for no tree)."""
    if other is None:
        return 0
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


# --- keep what pays ---------------------------------------------------------------------------------


def worth(
    scores: Sequence[float], cost: float, spent: float = 0.0, beside: tuple[float, int] = (0.0, 0)
) -> int:
    """How many of `scores` (descending path probabilities) to verify for the most tokens per
    unit of time: nodes join, most probable first, while each `pays` for its input (`spent`:
    the drafting already done this step, in one-token forwards; `beside`: the sum of the path
    probabilities and the count of the nodes already in the draft)."""
    total, count = beside
    n = 0
    for s in scores:
        if not pays(s, total, count, cost, spent):
            break
        n, total, count = n + 1, total + s, count + 1
    return n


def _value(scores: Sequence[float], cost: float, cap: int, spent: float = 0.0) -> float:
    """Tokens per unit of step time of the best selection among `scores` so far."""
    top = sorted(scores, reverse=True)[:cap]
    n = worth(top, cost, spent)
    return (1.0 + sum(top[:n])) / (1.0 + spent + cost * n)


def keep_paying(
    tree: TreeDraft, cost: float | None, cap: int | None = None, spent: float = 0.0
) -> TreeDraft:
    """The tree cut to its likeliest `cap` nodes (ties: older first) and, with a cost, to those
    `worth` verifying (at least the likeliest: one input, and a step to show), each with its
    ancestors. A child's score never exceeds its parent's, so the likeliest nodes are a tree."""
    kept = sorted(range(len(tree.tokens)), key=lambda n: (-tree.score[n], n))[:cap]
    if cost is not None:
        kept = kept[: max(1, worth([tree.score[n] for n in kept], cost, spent))]
    closed: set[int] = set()
    for n in kept:
        while n >= 0 and n not in closed:
            closed.add(n)
            n = tree.parents[n]
    return subtree(tree, sorted(closed))


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
