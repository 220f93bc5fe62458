"""Lookahead decoding (Fu et al. 2024): Jacobi iteration generates n-grams, one forward verifies them.

Each step is ONE target forward over three groups of new inputs, all hanging off x, the last
committed token:

    lookahead branch   a 2D window: W positions × (N − 1) levels of Jacobi history. Level 0 reads
                       like a sequence after x; each higher level climbs its column, so every
                       window token sees x, level 0 up to its column, then its column below it.
                       The top level's outputs are the next Jacobi guesses; each column's history
                       plus its new guess is an N-gram for the pool.
    verification       up to G n-grams from the pool whose first token is x, merged into a trie
                       (shared prefixes once), each node seeing x and its trie ancestors. Those
                       seen after the token before x come first (an option beyond the paper).
    x                  itself, predicting the next token as in autoregressive decoding.

Because every group is a tree rooted at x, the shared tree-mask builder makes the combined mask and
the position ids (position = depth). Greedy: follow the target's argmax down the trie (lossless).
Sampling: the trie's children are point-mass drafts: the multi-draft residual rule (lossless in
distribution). The window's KV is discarded each step; x and the accepted trie path are kept.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import Draft, Event, LookaheadWindow, NgramPool
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import RideAlong, start, verify_tree

PARAMS = (
    Param("N", int, 6, "n-gram size: the window keeps N − 1 levels of Jacobi history", 2, 12),
    Param("W", int, 1, "window: positions guessed ahead in parallel (0 = no lookahead)", 0, 16),
    Param("G", int, 3, "most candidate n-grams verified per step (0 = no verification)", 0, 16),
    Param("pool_from_prompt", bool, True, "seed the n-gram pool with the prompt's n-grams"),
    Param(
        "pool_from_output",
        bool,
        True,
        "also add the output's own n-grams as they are committed (beyond the paper)",
    ),
    Param(
        "rank_by_context",
        bool,
        True,
        "verify first the n-grams seen after the same token as now (beyond the paper)",
    ),
    Param("pool_cap", int, 8, "most n-grams kept per first token (oldest dropped)", 1, 64),
)


class NgramStore:
    """n-grams keyed by their first token, newest last, at most `cap` per key; counts hits.

    Each n-gram also remembers the token that came just before it where it was seen (None for
    the window's columns), so candidates can be ranked by the context they were seen in."""

    def __init__(self, n: int, cap: int) -> None:
        self.n, self.cap = n, cap
        self.by_first: dict[int, OrderedDict[tuple[int, ...], int | None]] = {}
        self.hits: Counter[tuple[int, ...]] = Counter()

    def add(self, gram: Sequence[int], before: int | None = None) -> bool:
        gram = tuple(gram)
        bucket = self.by_first.setdefault(gram[0], OrderedDict())
        new = gram not in bucket
        if new or before is not None:  # a column's repeat keeps the context it was seen in
            bucket[gram] = before
        bucket.move_to_end(gram)
        if len(bucket) > self.cap:
            bucket.popitem(last=False)
        return new

    def seed(self, tokens: Sequence[int], start: int = 0) -> None:
        """Add the n-grams of `tokens` that begin at `start` or later, each with its context."""
        for i in range(max(0, start), len(tokens) - self.n + 1):
            self.add(tokens[i : i + self.n], tokens[i - 1] if i else None)

    def candidates(self, first: int, g: int, before: int | None = None) -> list[tuple[int, ...]]:
        """The g n-grams starting with `first`, without that first token: newest first, but those
        seen right after `before` (the token before `first` now) ahead of the rest."""
        newest = list(self.by_first.get(first, {}).items())[::-1]
        ranked = sorted(newest, key=lambda item: before is None or item[1] != before)
        return [gram[1:] for gram, _ in ranked[:g]]

    def __len__(self) -> int:
        return sum(len(b) for b in self.by_first.values())

    def top(self, k: int = 8) -> tuple[tuple[int, ...], ...]:
        return tuple((count, *gram) for gram, count in self.hits.most_common(k))


def trie(paths: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Merge token paths into a prefix tree: (tokens, parents), parents before children."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for path in paths:
        node = -1
        for t in path:
            if (node, t) not in child:
                tokens.append(t)
                parents.append(node)
                child[(node, t)] = len(tokens) - 1
            node = child[(node, t)]
    return tokens, parents


def window_parents(levels: Sequence[Sequence[int]], offset: int) -> list[int]:
    """Parent array of the lookahead window (flattened level by level), as nodes `offset`.. of a
    tree rooted at input 0 (x): level 0 is a chain; each higher token's parent is the one below."""
    w = len(levels[0])
    parents = []
    for j in range(len(levels)):
        for i in range(w):
            if j == 0:
                parents.append(0 if i == 0 else offset + i - 1)
            else:
                parents.append(offset + (j - 1) * w + i)
    return parents


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    n, w, g = p["N"], p["W"], p["G"]
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    pool = NgramStore(n, p["pool_cap"])
    if p["pool_from_prompt"]:
        pool.seed(prompt_ids)
    # Level 0 starts as tokens drawn from the prompt (seeded): Jacobi converges from any guess.
    rng = random.Random(p.get("seed", 0))
    levels: list[list[int]] = [[rng.choice(prompt_ids) for _ in range(w)]] if w else []

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        x = context[-1]
        # Verification branch: pool n-grams for x, cut to the budget (the target adds one token).
        room = budget.remaining - 1
        before = context[-2] if p["rank_by_context"] and len(context) > 1 else None
        full = pool.candidates(x, g, before) if room > 0 else []
        grams = list(dict.fromkeys(c[:room] for c in full))  # cut, and once each
        v_tokens, v_parents = trie(grams)

        if v_tokens:
            yield Draft(
                step,
                f"n-gram pool ({len(grams)} candidates)",
                tuple(v_tokens),
                tuple(v_parents),
                (1.0,) * len(v_tokens),
            )
        # ONE forward over one tree rooted at x: [x] + the window (level by level, riding along)
        # + the trie. The shared tree phase verifies the trie, keeps x and the accepted path (the
        # window's KV goes) and commits.
        window = RideAlong(
            tokens=[t for level in levels for t in level],
            parents=window_parents(levels, 1) if levels else [],
            labels=_window_labels(levels),
            branch="lookahead",
        )
        committed_before = len(context)
        verdict, logits = yield from verify_tree(
            bundle,
            cache,
            context,
            v_tokens,
            v_parents,
            sampler,
            budget,
            step,
            ride=window,
            record_mask=cfg.detail,
        )
        if v_tokens:
            accepted = tuple(v_tokens[i] for i in verdict.accepted)
            for c in full:  # a hit: the n-gram's continuation was (partly) accepted
                if accepted and c[: len(accepted)] == accepted[: len(c)]:
                    pool.hits[(x, *c)] += 1

        # Lookahead: the top level's outputs are the new guesses; full columns yield n-grams.
        added: list[tuple[int, ...]] = []
        if levels:
            v_offset = 1 + len(window.tokens)
            top = logits[1 + (len(levels) - 1) * w : v_offset].argmax(dim=-1).tolist()
            yield LookaheadWindow(step, tuple(map(tuple, levels)), tuple(top))
            if len(levels) == n - 1:
                for i in range(w):
                    gram = (*(level[i] for level in levels), top[i])
                    if pool.add(gram):
                        added.append(gram)
                levels = [*levels[1:], top]
            else:  # warming up: the window grows a level per step until it holds N - 1
                levels = [*levels, top]
        if levels or g:
            yield NgramPool(step, tuple(added), len(grams), len(pool), pool.top(), n=n)
        if p["pool_from_output"]:  # n-grams that end in the tokens just committed
            pool.seed(context, start=committed_before - n + 1)


def _window_labels(levels: Sequence[Sequence[int]]) -> list[str]:
    """Names of the window's inputs for the attention-mask view: level j, column i."""
    return [f"look L{j}·{i}" for j, level in enumerate(levels) for i in range(len(level))]


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="no_drafter",
        place=2,
        title="Guessing without a drafter: Lookahead decoding",
        narration=(
            "Lookahead keeps Jacobi's parallel guessing, but does not throw the trajectories "
            "away: every window of guesses leaves n-grams behind in a pool. When the last token "
            "matches the start of a pooled n-gram, that n-gram becomes a candidate, and the same "
            "forward that advances the guessing window also verifies the candidates. Code that "
            "repeats itself fills the pool quickly."
        ),
        look=(
            "the candidate n-grams from the pool, one per row after x: the green ones the target "
            "accepted in the same forward that moved the window."
        ),
        view="pool_candidates",
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="lookahead",
    family="parallel",
    rank=2,
    title="Lookahead decoding (Jacobi window + n-gram verification)",
    decode=decode,
    params=PARAMS,
    # Fu et al. 2024 on a 7B model: W = 15, N = 5, G = 15; the pool from the window only
    presets={
        "paper": {
            "N": 5,
            "W": 15,
            "G": 15,
            "pool_from_output": False,
            "rank_by_context": False,
        }
    },
    summary="Jacobi trajectories fill an n-gram pool; matching n-grams are verified in the same forward.",
    relaxable=True,
    views=(
        "lookahead_panel",
        "lookahead_window",
        "pool_candidates",
        "ngram_pool",
    ),
    events=("AttentionMask", "Draft", "LookaheadWindow", "NgramPool", "Verify"),
)
