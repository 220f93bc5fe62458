"""Prompt lookup's draft (Saxena 2023): the tokens that followed an earlier occurrence of the
context's last n-gram. No model: the text itself is the drafter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from decoders.drafting.trees import TreeDraft

if TYPE_CHECKING:
    import torch


def find(
    context: Sequence[int], max_ngram: int, k: int, match: str = "earliest"
) -> tuple[list[int], int, int]:
    """The k tokens that followed an earlier occurrence of the longest matching suffix (the first
    occurrence, or the latest). Returns (draft, n, start): n the matched n-gram's length and start
    the index of its earlier occurrence in the context; ([], 0, -1) when nothing matches."""
    size = len(context)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = list(context[size - n :])
        # A match must leave at least one token after it, before the suffix itself.
        starts = range(size - n) if match == "earliest" else range(size - n - 1, -1, -1)
        for at in starts:
            if context[at : at + n] == suffix:
                return list(context[at + n : at + n + k]), n, at
    return [], 0, -1


def lookup(
    context: Sequence[int], max_ngram: int, k: int, match: str = "earliest"
) -> tuple[list[int], int]:
    """`find` without the position: (draft, n), ([], 0) when nothing matches."""
    draft, n, _ = find(context, max_ngram, k, match)
    return draft, n


class NgramProposer:
    """`find` as a Proposer: a chain of up to k copied tokens. `n` and `start`: the last match's
    length and where it occurred (0 and -1: none)."""

    def __init__(self, max_ngram: int, k: int, match: str = "earliest") -> None:
        self.max_ngram, self.k, self.match = max_ngram, k, match
        self.n, self.start = 0, -1

    def propose(self, context: Sequence[int], step: int, budget_left: int) -> TreeDraft | None:
        draft, self.n, self.start = find(
            context, self.max_ngram, min(self.k, budget_left), self.match
        )
        return TreeDraft.from_chain(draft) if draft else None

    def accepted(
        self, tree: TreeDraft, accepted_nodes: Sequence[int], logits: torch.Tensor
    ) -> None:
        """Nothing to learn: the next lookup reads the grown context."""
