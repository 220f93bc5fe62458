"""Growing a draft tree with a drafter, one batched draft forward per depth (EAGLE-2, Medusa).

    dynamic (EAGLE-2, Li et al. 2024): expand the top_k nodes with the highest cumulative draft
             probability at each depth, then keep the `keep` most confident nodes overall
    static  (a Medusa-style choice list): the paths are fixed ranks, e.g. "0.1" = the 2nd most
             likely child of the most likely first token

Any drafter (core/drafter.py) grows either; the caller begins and ends the drafter's step and
emits the grower's forwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from decoders.core.drafter import Drafter
from decoders.core.events import Forward
from decoders.core.sampling import Sampler
from decoders.core.tree import depths, feed_mask
from decoders.drafting.trees import TreeDraft, _value, children, keep_paying


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
        if out.event is not None:  # (a block drafter's deeper levels run nothing)
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
    ends the growth. A parallel drafter (`reach`: a block head) drafted every level in its
    first forward, so a level costs only its inputs."""
    tree = TreeDraft()
    level = 0.0 if grower.drafter.reach else draft  # what drafting one more level costs
    root = grower.root(x)
    sure = [float(root.max())]  # the drafter's top probability in each distribution this step
    frontier = children(tree, -1, root, top_k)
    for _ in range(depth - 1):
        best = sorted(frontier, key=lambda n: -tree.score[n])[:top_k]
        if cost is not None:
            rate = _value(tree.score, cost, keep, draft * len(grower.events))
            gain = sum(sure) / len(sure) * sum(tree.score[n] for n in best)
            if gain <= rate * (level + cost * len(best)):
                break
        dists = grower.expand(tree, best)
        sure += [float(d.max()) for d in dists]
        frontier = [
            c for n, dist in zip(best, dists, strict=True) for c in children(tree, n, dist, top_k)
        ]
    return keep_paying(tree, cost, keep, draft * len(grower.events))


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
