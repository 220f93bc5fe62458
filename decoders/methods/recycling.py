"""Token Recycling (Luo et al. 2025): draft from the candidates every forward already computed.

A verify forward scores the whole vocabulary at every input, then keeps one token and throws the
rest away. Token Recycling keeps the top k of each row in an adjacency matrix, vocabulary × k:
row t = the k tokens the target ranked likeliest right after token t, the last time t was one of
its inputs. Drafting is then a lookup, with no model and no training: from the last committed
token, follow the matrix breadth-first along a fixed tree template.

    M = warm start (each token's k most frequent successors in the datastore; the paper's
        "hot start" carries M over from earlier queries, which would make a run depend on the
        ones before it)
    repeat:
        x = last committed token
        tree = the template's paths read from M: path (r1, r2, ...) = M[M[x][r1]][r2] ...
        logits = target([x, *tree]) with a tree mask     # ONE forward verifies every branch
        keep the target's path, commit
        for every input i of that forward: M[input_i] = top-k(logits_i)   # recycle
Greedy is token-for-token lossless (the verifier decides); sampling uses the multi-draft rule
for point-mass drafts. The template's nodes are kept while they pay on this machine (size=cost):
a node's chance is its path's product of the target's own probabilities, stored beside M.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from decoders.core.base import Budget, DecodeConfig, Method
from decoders.core.costs import forward_ms
from decoders.core.errors import InvalidParameter
from decoders.core.events import Draft, Event, Priced, Recycled
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.methods.token_tree import TreeDraft, _subtree, node_cost, parse_choices, worth
from decoders.trained.datastore import load_store

K = 8  # successors kept per token (the paper's k)
# A template 4 deep: wide at the first level, where the matrix is most often right.
DEFAULT_TEMPLATE = (
    "0 1 2 3 4 5 0.0 0.1 0.2 1.0 1.1 2.0 3.0 0.0.0 0.0.1 0.1.0 1.0.0 0.0.0.0 0.0.0.1 0.1.0.0"
)

PARAMS = (
    Param(
        "template",
        str,
        DEFAULT_TEMPLATE,
        f"the tree template: paths of successor ranks (0..{K - 1}), e.g. '0 1 0.0' = the two "
        "likeliest successors of the last token and the likeliest successor of the first",
    ),
    Param(
        "size",
        str,
        "fixed",
        "fixed = the whole template; cost = keep only the template's nodes worth their input on "
        "this machine by the target's stored probabilities (stale ones: on the tuning prompts it "
        "kept too few, 1.55 tokens per forward against the whole template's 1.74)",
        choices=("cost", "fixed"),
    ),
    Param(
        "warm",
        str,
        "auto",
        "auto = start the matrix from the datastore's most frequent successors (when one ships "
        "for this model); none = start it empty (every row its token's own id)",
        choices=("auto", "none"),
    ),
)


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


def check(bundle: ModelBundle, params) -> None:
    template = parse_choices(params["template"])
    if any(r >= K for path in template for r in path):
        raise InvalidParameter(f"template: ranks must be in 0..{K - 1} (the matrix keeps {K})")


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    template = parse_choices(p["template"])
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    matrix = Adjacency(
        int(bundle.model.config.vocab_size), warm_start(bundle) if p["warm"] == "auto" else None
    )
    cost = node_cost(bundle, "cost") if p["size"] == "cost" else None

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    if cost is not None:
        yield Priced(0, round(cost, 5), 0.0, forward_ms(bundle))
    step = 0
    while not budget.done:
        step += 1
        x = context[-1]
        tree = matrix.draft(x, template, budget.remaining - 1)
        if cost is not None and tree.tokens:  # the likeliest paths first, while they pay
            kept = sorted(range(len(tree.tokens)), key=lambda n: (-tree.score[n], n))
            kept = kept[: max(1, worth([tree.score[n] for n in kept], cost))]
            # keep the template's shape: a node comes with its ancestors
            closed = set()
            for n in kept:
                while n >= 0 and n not in closed:
                    closed.add(n)
                    n = tree.parents[n]
            tree = _subtree(tree, sorted(closed))
        if tree.tokens:
            rows = matrix.rows(x, tree)
            yield Recycled(
                step,
                tuple((t, *map(int, matrix.succ[t].tolist())) for t in rows),
                tuple(bool(matrix.fresh[t]) for t in rows),
                matrix.warm,
            )
            yield Draft(
                step,
                "token recycling",
                tuple(tree.tokens),
                tuple(tree.parents),
                tuple(round(v, 6) for v in tree.probs),
            )
        _, logits = yield from verify_tree(
            bundle, cache, context, tree.tokens, tree.parents, sampler, budget, step
        )
        matrix.update([x, *tree.tokens], logits)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    name="recycling",
    family="draft and verify",
    rank=1,
    title="Token Recycling (an adjacency matrix of the target's own candidates)",
    decode=decode,
    params=PARAMS,
    # Luo et al. 2025: k = 8 and a template searched for a GPU (80 nodes; ours is smaller), the
    # matrix starting empty (their hot start carries it across queries instead)
    presets={"paper": {"size": "fixed", "warm": "none"}},
    check=check,
    summary="Keeps each token's likeliest successors from every forward's logits; drafts a tree "
    "from them with no model; one forward verifies.",
    relaxable=True,
    views=("adjacency", "token_tree"),
    events=("Recycled", "Draft", "Priced", "Verify"),
)
