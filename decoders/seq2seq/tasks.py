"""Translation tasks with several right answers, generated deterministically from a seed.

A source sentence is 5-9 words from a vocabulary of 20. Its translation maps each word to one of
two synonyms, chosen for the whole sentence by a *register* (0 or 1), and writes the words in the
source's order or reversed, chosen by an *order*. How many of these choices a task leaves open is
its difficulty:

- `control`: register 0, source order: one right translation per source;
- `register`: either register, source order: two;
- `modes`: either register, either order: four (fewer when the source reads the same reversed);
- `length`: either register, source order, where register 1 writes some words as a two-token
  phrase, so the right translations differ in length (why length prediction matters).

A model that predicts each position independently (a vanilla NAT) tends to mix the choices:
register 0 here and register 1 there, or the first half in one order and the second in the
other: no right translation at all.

Token ids: PAD, BOS, EOS, MASK, then the source words, then each register's synonyms, then the
second tokens of register 1's phrases, then the tasks' tags. The encoder reads the task's tag and
the source (`tagged`), so one model of each kind translates every task. Training draws from seed TRAIN_SEED; every other seed is a
held-out set (`examples` refuses nothing; the evaluation refuses TRAIN_SEED).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PAD, BOS, EOS, MASK = 0, 1, 2, 3
N_WORDS = 20
SRC = 4  # source word i is SRC + i
REG = (SRC + N_WORDS, SRC + 2 * N_WORDS)  # register r's synonym of word i is REG[r] + i
TAIL = SRC + 3 * N_WORDS  # the second token of word i's register-1 phrase (task `length`)
TASKS = ("control", "register", "modes", "length")
# the task's tag, first in the encoder's input (as a multilingual model's language tag): one model
# of each kind serves every task
TAG = {task: TAIL + N_WORDS + i for i, task in enumerate(TASKS)}
VOCAB = TAIL + N_WORDS + len(TASKS)
MIN_WORDS, MAX_WORDS = 5, 9
MAX_TARGET = 2 * MAX_WORDS  # a `length` translation: every word a two-token phrase at most
# (register, reversed) choices each task leaves open, all equally right
CHOICES: dict[str, tuple[tuple[int, bool], ...]] = {
    "control": ((0, False),),
    "register": ((0, False), (1, False)),
    "modes": ((0, False), (1, False), (0, True), (1, True)),
    "length": ((0, False), (1, False)),
}
TRAIN_SEED = 0


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    return task


def is_phrase(word: int) -> bool:
    """Whether word index `word` is a two-token phrase in register 1 (task `length`)."""
    return word % 2 == 0


def translate(source: tuple[int, ...], register: int, reverse: bool, task: str) -> tuple[int, ...]:
    """The translation of `source` (source token ids) in `register`, its words reversed or not."""
    out: list[int] = []
    for s in reversed(source) if reverse else source:
        word = s - SRC
        out.append(REG[register] + word)
        if task == "length" and register == 1 and is_phrase(word):
            out.append(TAIL + word)
    return tuple(out)


@dataclass(frozen=True)
class Example:
    """A source sentence and every right translation of it (distinct, sorted)."""

    source: tuple[int, ...]
    references: tuple[tuple[int, ...], ...]


def example(rng: random.Random, task: str) -> Example:
    n = rng.randint(MIN_WORDS, MAX_WORDS)
    source = tuple(SRC + rng.randrange(N_WORDS) for _ in range(n))
    refs = {translate(source, r, rev, task) for r, rev in CHOICES[check_task(task)]}
    return Example(source, tuple(sorted(refs)))


def examples(task: str, seed: int, n: int) -> list[Example]:
    """`n` examples of `task`, the same for the same seed on every machine."""
    rng = random.Random(f"{check_task(task)}:{seed}")
    return [example(rng, task) for _ in range(n)]


def tagged(task: str, source: tuple[int, ...]) -> tuple[int, ...]:
    """The encoder's input: the task's tag, then the source's words."""
    return (TAG[check_task(task)], *source)


def is_word(token: int) -> bool:
    return SRC <= token < REG[0]


def training_pairs(
    task: str, n: int, seed: int = TRAIN_SEED
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tagged source, target) pairs to train on: each target one of the source's right
    translations, each choice as likely as the others (the data is as multimodal as the task)."""
    rng = random.Random(f"{check_task(task)}:train:{seed}")
    pairs = []
    for _ in range(n):
        ex = example(rng, task)
        register, reverse = rng.choice(CHOICES[task])
        pairs.append((tagged(task, ex.source), translate(ex.source, register, reverse, task)))
    return pairs


# how many training pairs of each task a mixture draws per unit: `modes` is the hardest to learn
# (its word order is a choice too), the others' right answers follow from fewer examples
SHARE = {"control": 1, "register": 1, "modes": 3, "length": 1}


def mixture(n: int, seed: int = TRAIN_SEED) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """About `n` training pairs of every task, shared out by SHARE, interleaved."""
    unit = max(1, n * len(TASKS) // sum(SHARE.values()))
    by_task = [training_pairs(task, unit * SHARE[task], seed) for task in TASKS]
    out = []
    for i in range(max(len(g) for g in by_task)):
        out += [g[i] for g in by_task if i < len(g)]
    return out


def describe(tokens: tuple[int, ...] | list[int]) -> list[str]:
    """Each token as a reader sees it: source words `w7`, synonyms `a7` (register 0) and `b7`
    (register 1), a phrase's second token `b7'`, and the specials."""
    names = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", MASK: "<mask>"}
    out = []
    for t in tokens:
        if t in names:
            out.append(names[t])
        elif SRC <= t < REG[0]:
            out.append(f"w{t - SRC}")
        elif REG[0] <= t < REG[1]:
            out.append(f"a{t - REG[0]}")
        elif REG[1] <= t < TAIL:
            out.append(f"b{t - REG[1]}")
        elif TAIL <= t < TAIL + N_WORDS:
            out.append(f"b{t - TAIL}'")
        elif t in TAG.values():
            out.append(f"<{TASKS[t - TAG[TASKS[0]]]}>")
        else:
            out.append(f"?{t}")
    return out
