"""Branches grafted onto a model's draft tree (SpecInfer merges the trees of several drafters the
same way): a chain copied from the text (prompt lookup's n-gram, or SAM's automata), and a small
tree read from Token Recycling's matrix.

A copied chain is a point-mass draft (p = 1) to the verifier, but far from sure to be right: with
size=cost only as many copies join as pay, by how often copies were right (`CopyRates`).

Every copied chain carries its match length `n`, in tokens, for both sources alike: how long the
suffix of the context is that was found where the copy was taken from (SAM: the automaton's
longest match, in the context or the datastore; prompt lookup: its 1-3-token key, extended back
over the tokens that agree before it at the occurrence it copies). A long enough match wins
outright (`CopiedBranch.overrides`): the copy replaces the drafter's draft, as TensorRT-LLM's
suffix automaton does from `sa_spec_threshold` = 4 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from decoders.core.models import ModelBundle
from decoders.drafting.ngram import find
from decoders.drafting.recycled import Adjacency, warm_start
from decoders.drafting.retrieval import Retriever
from decoders.drafting.trees import TreeDraft, parse_choices, spelled, worth

if TYPE_CHECKING:
    import torch

COPY_NAMES = {"prompt": "prompt lookup", "context": "SAM context", "datastore": "SAM datastore"}
# The recycled branch's template: the likeliest successors first, 4 deep.
RECYCLE_TEMPLATE = parse_choices("0 1 2 0.0 0.1 1.0 0.0.0 0.0.0.0")


class CopyRates:
    """How often a copied token is accepted, for size=cost: the first one after a match of n
    tokens, and each one after an accepted copy. A copied chain is a point-mass draft (p = 1) to
    the verifier, but far from sure to be right. The priors (weighing 8 steps) were measured on
    the tuning prompts; each run updates them from its own verdicts, so a text that repeats itself
    earns longer copies. One table per source: prompt lookup's n-gram copy (after a 1-token match
    16 % of first copies were accepted, after 2 42 %, after 3 or more 67 %, about 3 in 4 of the next
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
        scores = [self.score(n, j) for j in range(k, len(branch))]
        k += worth(scores, cost, beside=(sum(tree.score), len(tree.tokens)))
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


def match_length(context: Sequence[int], at: int, n: int) -> int:
    """How many tokens the context's end matches at the earlier occurrence of its last n tokens
    that starts at `at`: n, plus every token before both that agrees (the same measure as a
    suffix automaton's match, for the occurrence prompt lookup copies from)."""
    end, k = len(context) - n, 0
    while at - 1 - k >= 0 and context[at - 1 - k] == context[end - 1 - k]:
        k += 1
    return n + k


def copy_branch(
    found: Retriever | None, context: Sequence[int], size: int, cap: int
) -> tuple[list[int], int, str]:
    """The copied branch for this step: (chain, match length in tokens, source), source "prompt"
    (prompt lookup's 1-3-token key, its match measured back by `match_length`), "context" or
    "datastore" (the sam method's automata: its chain, the most frequent path from the
    datastore); ([], 0, "") when nothing matched or size is 0."""
    if not size:
        return [], 0, ""
    if found is None:
        chain, n, at = find(context, 3, min(size, cap))
        return (chain, match_length(context, at, n), "prompt") if chain else ([], 0, "")
    found.catch_up(context)
    got = found.retrieve(min(size, cap), chain_only=True)
    return (list(got.tokens), got.n, got.source) if got else ([], 0, "")


class CopiedBranch:
    """The copied branch as a Proposer: `copy_branch`'s chain of up to `size` tokens (from
    `found`'s automata, else prompt lookup), priced against the tree it joins (`cut`, with a
    cost) and scored by its verdicts (`accepted`: the CopyRates of its source). `n`: this step's
    match length in tokens (0: no chain)."""

    def __init__(self, found: Retriever | None, size: int, cost: float | None) -> None:
        self.found, self.size, self.cost = found, size, cost
        self.rates = {source: CopyRates(source) for source in CopyRates.PRIORS}
        self.chain: list[int] = []
        self.n, self.source = 0, ""

    @property
    def name(self) -> str:
        """Where this step's chain came from, as a draft's label says it."""
        return COPY_NAMES[self.source]

    def propose(self, context: Sequence[int], step: int, budget_left: int) -> TreeDraft | None:
        self.chain, self.n, self.source = copy_branch(self.found, context, self.size, budget_left)
        return TreeDraft.from_chain(self.chain) if self.chain else None

    def overrides(self, threshold: int) -> bool:
        """A long enough match wins outright (TensorRT-LLM's `sa_spec_threshold`, SAM-Decoding's
        switch): a copy after a match of at least `threshold` tokens replaces the drafter's draft
        this step; 0 = never. The datastore's never does: its chain is the most frequent
        continuation of other text, not this text copied."""
        return (
            bool(self.chain)
            and threshold > 0
            and self.n >= threshold
            and self.source != "datastore"
        )

    def cut(self, tree: TreeDraft) -> list[int]:
        """The part of the chain worth grafting onto `tree` (all of it without a cost); the
        verdict is heard on that part."""
        if self.chain and self.cost is not None:
            self.chain = self.rates[self.source].cut(tree, self.chain, self.n, self.cost)
        return self.chain

    def accepted(
        self, tree: TreeDraft, accepted_nodes: Sequence[int], logits: torch.Tensor | None = None
    ) -> None:
        """Count the verdict on the grafted copies (size=cost: the rates learn this text)."""
        if self.chain and self.cost is not None:
            self.rates[self.source].update(tree, self.chain, self.n, accepted_nodes)


def adjacency(bundle: ModelBundle) -> Adjacency:
    """A fresh Token Recycling matrix for one run, warm-started from the datastore."""
    return Adjacency(int(bundle.model.config.vocab_size), warm_start(bundle))
