"""Token-tree buffers from a parent array: attention mask, position ids, root-to-leaf paths.

A draft tree is a parent array: parents[i] is the index of node i's parent, -1 for children of the
root (the last committed token, already in the cache). Parents come before children. Verifying the
tree in ONE forward needs each node to see the whole cache plus its own ancestors, at position
cache_len + depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only where a mask is built: the pure helpers serve the visualizer
    import torch


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node; children of the root have depth 0."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent must come before its child (or be -1)")
        out.append(0 if p == -1 else out[p] + 1)
    return out


def ancestors(parents: Sequence[int], node: int) -> list[int]:
    """Path from the root's child down to `node`, inclusive."""
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_positions(parents: Sequence[int], start: int) -> list[int]:
    return [start + d for d in depths(parents)]


def tree_mask(
    parents: Sequence[int], cache_len: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Additive 4D mask [1, 1, n, cache_len + n]: 0 where node i may attend, the dtype's min
    elsewhere (float32 unless `dtype` says otherwise)."""
    import torch

    dtype = dtype or torch.float32
    n = len(parents)
    allowed = torch.zeros(n, cache_len + n, dtype=torch.bool)
    allowed[:, :cache_len] = True
    for i in range(n):
        allowed[i, [cache_len + a for a in ancestors(parents, i)]] = True
    mask = torch.zeros(n, cache_len + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, n, cache_len + n)


def leaf_paths(parents: Sequence[int]) -> list[list[int]]:
    """Every root-to-leaf path, as node indices (Medusa's 'retrieve indices')."""
    has_child = {p for p in parents if p != -1}
    return [ancestors(parents, i) for i in range(len(parents)) if i not in has_child]


def chain(n: int) -> tuple[int, ...]:
    """The parent array of a plain chain of n drafts: (-1, 0, 1, …)."""
    return tuple(range(-1, n - 1))


def feed_mask(
    parents: Sequence[int],
    fed: Sequence[int],
    feed: Sequence[int],
    cache_len: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Mask for growing a tree a few nodes at a time (drafting): the cache holds `cache_len` context
    positions, then the nodes in `fed` (in that order); `feed` are the nodes now appended. Each sees
    the context and its own ancestors, wherever they sit. Every ancestor must already be fed."""
    import torch

    dtype = dtype or torch.float32
    slot = {node: cache_len + i for i, node in enumerate([*fed, *feed])}
    total = cache_len + len(fed) + len(feed)
    allowed = torch.zeros(len(feed), total, dtype=torch.bool)
    allowed[:, :cache_len] = True
    for row, node in enumerate(feed):
        allowed[row, [slot[a] for a in ancestors(parents, node)]] = True
    mask = torch.zeros(len(feed), total, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, len(feed), total)


def with_root(parents: Sequence[int], between: Sequence[int] = ()) -> tuple[int, ...]:
    """The parent array of [root, *between, *nodes]: for verifying when the root is fed with the
    tree. `between` are the parents of inputs fed between the root and the tree (lookahead's
    window), already indexing the whole array; the tree's own roots hang off the root."""
    offset = 1 + len(between)  # the tree's first node
    return (-1, *between, *(offset + p if p >= 0 else 0 for p in parents))
