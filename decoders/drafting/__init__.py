"""Drafting: who proposes the tokens a method verifies, between the trained parts and the methods.

The layers import downwards only: decoders/methods/ -> decoders/drafting/ -> decoders/trained/,
decoders/core/. A method composes proposers and never imports another method.

A proposer speaks one small protocol, in the shape of transformers' candidate generators
(`get_candidates`, then `update_candidate_strategy` with what was accepted):

    tree = proposer.propose(context, step, budget_left)  # a TreeDraft (a chain: parents -1..n-2)
                                                         # at most budget_left deep, or None
    ... the target verifies the tree (maybe merged with others) in one forward ...
    proposer.accepted(tree, accepted_nodes, logits)      # hear the verdict on the verified tree

Implemented by: `NgramProposer` (prompt lookup, ngram.py), `RetrievalProposer` (SAM's suffix
automata, retrieval.py), `RecycledProposer` (Token Recycling's matrix, recycled.py) and
`CopiedBranch` (token_tree's copied branch, copied.py; it also prices its chain against the tree
it joins, `cut`). Not by the model drafters: an EAGLE-2 or Medusa-style tree grows through a
drafter's own forwards, which the method begins, emits and ends (eagle.py's `Grower`), and
Medusa's heads read the verifier's features (trained/medusa_heads.py).

trees.py holds the tree itself and the one rule for its size on this machine (`worth`: keep the
likeliest nodes while they pay for their inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from decoders.drafting.copied import (
    COPY_NAMES,
    RECYCLE_TEMPLATE,
    CopiedBranch,
    CopyRates,
    adjacency,
    copy_branch,
)
from decoders.drafting.eagle import Grower, grow_dynamic, grow_static
from decoders.drafting.ngram import NgramProposer, find, lookup
from decoders.drafting.recycled import Adjacency, K, RecycledProposer, warm_start
from decoders.drafting.retrieval import RetrievalProposer, Retrieved, Retriever, retriever
from decoders.drafting.trees import (
    MAX_NODES,
    TreeDraft,
    children,
    draft_event,
    graft,
    graft_scored,
    keep_paying,
    node_cost,
    parse_choices,
    spelled,
    subtree,
    worth,
)

if TYPE_CHECKING:
    import torch


class Proposer(Protocol):
    """Proposes a draft tree each step and hears what the target accepted of it."""

    def propose(self, context: Sequence[int], step: int, budget_left: int) -> TreeDraft | None:
        """This step's draft under context[-1], at most `budget_left` deep; None: nothing."""
        ...

    def accepted(
        self, tree: TreeDraft, accepted_nodes: Sequence[int], logits: torch.Tensor
    ) -> None:
        """The verified tree (this proposal, maybe merged with others), the nodes the target
        accepted, and the verify forward's logits (row 0 = context[-1], then the tree's nodes)."""
        ...


__all__ = [
    "COPY_NAMES",
    "MAX_NODES",
    "RECYCLE_TEMPLATE",
    "Adjacency",
    "CopiedBranch",
    "CopyRates",
    "Grower",
    "K",
    "NgramProposer",
    "Proposer",
    "RecycledProposer",
    "RetrievalProposer",
    "Retrieved",
    "Retriever",
    "TreeDraft",
    "adjacency",
    "children",
    "copy_branch",
    "draft_event",
    "find",
    "graft",
    "graft_scored",
    "grow_dynamic",
    "grow_static",
    "keep_paying",
    "lookup",
    "node_cost",
    "parse_choices",
    "retriever",
    "spelled",
    "subtree",
    "warm_start",
    "worth",
]
