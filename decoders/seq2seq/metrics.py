"""How a translation stands against its references: valid (equal to one of them), mixed (it
combines the choices the references make apart: both registers, or both word orders), the
adjacent repeats a non-autoregressive decoder is known for beyond the references' own, and
sentence BLEU against the closest reference."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

from .tasks import N_WORDS, REG, SRC, TAIL

Tokens = Sequence[int]


def valid(output: Tokens, references: Sequence[Tokens]) -> bool:
    return tuple(output) in {tuple(r) for r in references}


def registers(output: Tokens) -> set[int]:
    """The registers an output's words are written in (a phrase's second token counts as 1)."""
    seen = set()
    for t in output:
        if REG[0] <= t < REG[1]:
            seen.add(0)
        elif REG[1] <= t < TAIL + N_WORDS:
            seen.add(1)
    return seen


def words(output: Tokens) -> list[int]:
    """An output's word indices in order (a phrase counted once, by its first token)."""
    return [(t - REG[0]) % (REG[1] - REG[0]) for t in output if REG[0] <= t < TAIL]


def mixed(output: Tokens, source: Tokens) -> bool:
    """Whether an output mixes the choices its references make apart: words in both registers,
    or some positions in the source's order and others in the reversed order (where the two
    orders differ)."""
    if len(registers(output)) > 1:
        return True
    got = words(output)
    forward = [s - SRC for s in source]
    backward = forward[::-1]
    ahead = any(g == f != b for g, f, b in zip(got, forward, backward, strict=False))
    behind = any(g == b != f for g, f, b in zip(got, forward, backward, strict=False))
    return ahead and behind


def repeats(tokens: Tokens) -> int:
    return sum(a == b for a, b in itertools.pairwise(tokens))


def excess_repeats(output: Tokens, references: Sequence[Tokens]) -> int:
    """Adjacent repeated tokens beyond the fewest any reference has (a source may repeat a word)."""
    return max(0, repeats(output) - min((repeats(r) for r in references), default=0))


def bleu(output: Tokens, reference: Tokens, n: int = 4) -> float:
    """Sentence BLEU (up to `n`-grams, add-one smoothing above unigrams, brevity penalty), 0-100."""
    out, ref = list(output), list(reference)
    if not out or not ref:
        return 0.0
    logs = []
    for k in range(1, n + 1):
        grams = Counter(tuple(out[i : i + k]) for i in range(len(out) - k + 1))
        refs = Counter(tuple(ref[i : i + k]) for i in range(len(ref) - k + 1))
        hits = sum(min(c, refs[g]) for g, c in grams.items())
        total = max(len(out) - k + 1, 0)
        if k == 1 and hits == 0:
            return 0.0
        smooth = 0 if k == 1 else 1
        logs.append(math.log((hits + smooth) / (total + smooth)) if total + smooth else 0.0)
    brevity = min(0.0, 1 - len(ref) / len(out))
    return 100 * math.exp(brevity + sum(logs) / n)


def best_bleu(output: Tokens, references: Sequence[Tokens]) -> float:
    """BLEU against the closest reference."""
    return max((bleu(output, r) for r in references), default=0.0)
