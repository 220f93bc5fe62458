"""Token Recycling's adjacency matrix (Luo et al. 2025): the candidates every forward computed.

A verify forward scores the whole vocabulary at every input, then keeps one token. The matrix
keeps the top K of each row: row t = the K tokens the target ranked likeliest right after token
t, the last time t was one of its inputs. Drafting is a lookup along a tree template: no model,
no training, no forward.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from decoders.core.models import ModelBundle
from decoders.drafting.trees import TreeDraft
from decoders.trained.datastore import load_store

K = 8  # successors kept per token (the paper's k)


class Adjacency:
    """The matrix: `succ[t]` = the k likeliest successors of token t, best first, and `prob[t]`
    their probabilities as the target gave them; `fresh[t]`: row t was written by this run."""

    def __init__(self, vocab: int, warm: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.warm = warm is not None and len(warm[0]) == vocab
        if self.warm:
            self.succ = torch.from_numpy(warm[0].copy())
            self.prob = torch.from_numpy(warm[1].copy())
        else:  # nothing known: a row drafts its own token (right only in repetitions)
            self.succ = torch.arange(vocab).unsqueeze(1).repeat(1, K)
            self.prob = torch.zeros(vocab, K)
        self.fresh = torch.zeros(vocab, dtype=torch.bool)

    def update(self, inputs: Sequence[int], logits: torch.Tensor) -> None:
        """Recycle a forward: row inputs[i] := the top k of logits[i] (a token fed twice keeps
        its last row)."""
        last = {t: i for i, t in enumerate(inputs)}
        rows = torch.tensor(list(last.values()), device=logits.device)
        probs = torch.softmax(logits[rows].float(), dim=-1).cpu()  # the matrix lives on the CPU
        top = probs.topk(K, dim=-1)
        ids = torch.tensor(list(last.keys()))
        self.succ[ids] = top.indices
        self.prob[ids] = top.values
        self.fresh[ids] = True

    def draft(self, x: int, template: Sequence[tuple[int, ...]], depth: int) -> TreeDraft:
        """The template's paths (up to `depth`) read from the matrix; a path whose token a
        sibling already drafted is left out with its subtree."""
        tree = TreeDraft()
        node_of: dict[tuple[int, ...], int] = {}
        token_of: dict[tuple[int, ...], int] = {(): x}
        for path in template:
            parent_token = token_of.get(path[:-1])
            if len(path) > depth or parent_token is None:
                continue
            parent = node_of.get(path[:-1], -1)
            token = int(self.succ[parent_token, path[-1]])
            if any(tree.tokens[c] == token for c, q in enumerate(tree.parents) if q == parent):
                continue
            node_of[path] = tree.add(token, parent, float(self.prob[parent_token, path[-1]]))
            token_of[path] = token
        return tree

    def rows(self, x: int, tree: TreeDraft) -> list[int]:
        """The rows a tree was read from: its root's and each parent node's token, in order."""
        out = [x]
        for parent in tree.parents:
            if parent >= 0 and tree.tokens[parent] not in out:
                out.append(tree.tokens[parent])
        return out


_warm: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
_warm_lock = threading.Lock()


def warm_start(bundle: ModelBundle) -> tuple[np.ndarray, np.ndarray] | None:
    """Each token's K most frequent successors in the model's datastore, with their shares (a
    token never seen there: itself, share 0). None when no datastore ships. Computed once."""
    store = load_store(bundle)
    if store is None:
        return None
    vocab = int(bundle.model.config.vocab_size)
    with _warm_lock:
        if bundle.model_id not in _warm:
            succ = np.repeat(np.arange(vocab, dtype=np.int64)[:, None], K, axis=1)
            prob = np.zeros((vocab, K), dtype=np.float32)
            for t in range(vocab):
                state = store.child(0, t)
                if state < 0:
                    continue
                total = max(int(store.count[state]), 1)
                for r, (token, count, _) in enumerate(store.ranked(state, K)):
                    succ[t, r], prob[t, r] = token, count / total
            _warm[bundle.model_id] = (succ, prob)
        return _warm[bundle.model_id]


class RecycledProposer:
    """An Adjacency as a Proposer: the template read from the matrix under the context's last
    token (`root`), up to `budget_left` deep; what the verifier computed for the root and the
    verified tree is recycled into the matrix."""

    def __init__(self, matrix: Adjacency, template: Sequence[tuple[int, ...]]) -> None:
        self.matrix, self.template = matrix, template
        self.root = -1

    def propose(self, context: Sequence[int], step: int, budget_left: int) -> TreeDraft | None:
        self.root = context[-1]
        tree = self.matrix.draft(self.root, self.template, budget_left)
        return tree if tree.tokens else None

    def accepted(
        self, tree: TreeDraft, accepted_nodes: Sequence[int], logits: torch.Tensor
    ) -> None:
        """Recycle the verify forward over [root, *tree]: every row, accepted or not."""
        self.matrix.update([self.root, *tree.tokens], logits)
