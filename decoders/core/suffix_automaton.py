"""Suffix automata for retrieval drafting (SAM-Decoding, Hu et al. 2024).

A suffix automaton of a text is the smallest automaton that accepts exactly the text's suffixes:
each state is a class of substrings that end at the same set of positions (their `endpos`), a
transition appends one token, and a suffix link drops tokens from the front until the class
changes. It has fewer than 2n states and 3n transitions, it grows by one token in amortised
constant time, and it finds the longest suffix of a growing query that occurs in the text, also in
amortised constant time per query token: follow the transition, or the suffix links until one
exists.

- `SuffixAutomaton`: grown token by token (the prompt and the output so far); a match state tells
  the first earlier occurrence of the matched suffix (`first_end`), whose continuation is copied.
- `StaticAutomaton`: built once over a datastore (documents joined by a separator no query
  contains), frozen into flat arrays; each state knows how often its strings occur, so the
  continuations of a match come ranked by frequency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEPARATOR = -1  # between documents of a datastore; never a query token, never drafted


class SuffixAutomaton:
    """An online suffix automaton over a growing token sequence (dict transitions)."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]  # where the state's strings first end in the text
        self.clone: list[bool] = [False]
        self.text: list[int] = []
        self.last = 0
        for t in tokens:
            self.extend(t)

    def __len__(self) -> int:
        return len(self.next)

    def _new(self, length: int, link: int, end: int, trans: dict[int, int], clone: bool) -> int:
        self.next.append(trans)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(end)
        self.clone.append(clone)
        return len(self.next) - 1

    def extend(self, token: int) -> None:
        """Append one token (Blumer et al.'s construction)."""
        pos = len(self.text)
        self.text.append(token)
        cur = self._new(self.length[self.last] + 1, -1, pos, {}, False)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                c = self._new(
                    self.length[p] + 1, self.link[q], self.first_end[q], dict(self.next[q]), True
                )
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = c
                    p = self.link[p]
                self.link[q] = self.link[cur] = c
        self.last = cur

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The match of (the matched suffix + token): the longest suffix of it that occurs."""
        while state and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], length + 1
        return 0, 0


class ContextMatch:
    """The longest suffix of the context (prompt + output) that also occurs EARLIER in it, kept up
    to date as tokens arrive: each token is matched against the automaton of the text before it,
    then added to it."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.sam = SuffixAutomaton()
        self.state, self.length = 0, 0
        self.feed(tokens)

    def feed(self, tokens: Sequence[int]) -> None:
        sam = self.sam
        for t in tokens:
            self.state, self.length = sam.step(self.state, self.length, t)
            sam.extend(t)
            # A state the extension split keeps the longer strings; ours may now be its clone.
            while self.state and sam.length[sam.link[self.state]] >= self.length:
                self.state = sam.link[self.state]

    def continuation(self, k: int) -> tuple[list[int], int]:
        """(up to k tokens that followed the matched suffix's first earlier occurrence, where that
        occurrence starts); ([], -1) without a match."""
        if not self.length:
            return [], -1
        end = self.sam.first_end[self.state]
        text = self.sam.text
        return list(text[end + 1 : end + 1 + k]), end + 1 - self.length


@dataclass(frozen=True)
class Continuation:
    """A node of a frequency-ranked continuation tree: its token, its parent (-1: the match), how
    often the datastore continues its parent's string with it (`count`) and its share of the
    parent's continuations (`share`)."""

    token: int
    parent: int
    count: int
    share: float


class StaticAutomaton:
    """A suffix automaton over a datastore, frozen into flat arrays (transitions sorted by token
    per state, CSR-style) with each state's occurrence count."""

    def __init__(self, docs: Sequence[Sequence[int]]) -> None:
        sam = SuffixAutomaton()
        for doc in docs:
            for t in doc:
                sam.extend(int(t))
            sam.extend(SEPARATOR)
        n = len(sam)
        length = np.asarray(sam.length, dtype=np.int32)
        link = np.asarray(sam.link, dtype=np.int32)
        count = np.asarray([0 if c else 1 for c in sam.clone], dtype=np.int64)
        count[0] = 0
        for s in np.argsort(-length, kind="stable"):  # longest first: endpos sizes flow up links
            if link[s] >= 0:
                count[link[s]] += count[s]
        offsets = np.zeros(n + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(d) for d in sam.next])
        tokens = np.empty(offsets[-1], dtype=np.int32)
        targets = np.empty(offsets[-1], dtype=np.int32)
        for s, trans in enumerate(sam.next):
            if trans:
                keys = sorted(trans)
                tokens[offsets[s] : offsets[s + 1]] = keys
                targets[offsets[s] : offsets[s + 1]] = [trans[k] for k in keys]
        self.length, self.link, self.count = length, link, count
        self.offsets, self.tokens, self.targets = offsets, tokens, targets
        self.size = int(sum(len(d) for d in docs))
        self.build_s = 0.0  # set by whoever times the build

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (self.length, self.link, self.count, self.offsets, self.tokens, self.targets)
        )

    def child(self, state: int, token: int) -> int:
        lo, hi = int(self.offsets[state]), int(self.offsets[state + 1])
        i = lo + int(np.searchsorted(self.tokens[lo:hi], token))
        return int(self.targets[i]) if i < hi and self.tokens[i] == token else -1

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The longest suffix of (matched suffix + token) that occurs in the datastore."""
        while True:
            nxt = self.child(state, token)
            if nxt >= 0:
                return nxt, length + 1
            if state == 0:
                return 0, 0
            state = int(self.link[state])
            length = int(self.length[state])

    def ranked(self, state: int, width: int) -> list[tuple[int, int, int]]:
        """The `width` most frequent continuations of a state: (token, count, next state)."""
        lo, hi = int(self.offsets[state]), int(self.offsets[state + 1])
        targets = self.targets[lo:hi]
        counts = self.count[targets]
        order = np.argsort(-counts, kind="stable")
        out = []
        for i in order:
            token = int(self.tokens[lo + i])
            if token != SEPARATOR:
                out.append((token, int(counts[i]), int(targets[i])))
                if len(out) == width:
                    break
        return out

    def tree(self, state: int, depth: int, width: int, nodes: int) -> list[Continuation]:
        """A continuation tree from a match state: the most frequent continuations, best first,
        as long as they keep at least one occurrence, `width` children a node at most, `nodes` in
        all, `depth` deep (the most frequent paths are expanded first)."""
        out: list[Continuation] = []
        frontier = [(1.0, -1, state, 0)]  # (path share, node, state, depth)
        while frontier and len(out) < nodes:
            frontier.sort(key=lambda f: -f[0])
            share, node, s, d = frontier.pop(0)
            if d >= depth:
                continue
            total = int(self.count[s])
            for token, count, nxt in self.ranked(s, width):
                if len(out) == nodes:
                    break
                out.append(Continuation(token, node, count, count / max(total, 1)))
                frontier.append((share * count / max(total, 1), len(out) - 1, nxt, d + 1))
        return out
