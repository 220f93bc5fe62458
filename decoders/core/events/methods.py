"""The events particular to a family of methods: Jacobi and Lookahead (iterations, the window, the
n-gram pool, the attention mask), prompt lookup's copy, retrieval from the datastore, Token Recycling's adjacency rows, the Medusa heads' guesses, SPACE's mask
groups, Mask-Predict's iterations, early exit's exits and FREE's catch-ups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from decoders.core.events.common import (
    EXIT_RULES,
    MAX_DRAFT_NODES,
    MAX_HEADS,
    MAX_LAYERS,
    NGRAM_SIZES,
    Event,
    whole,
)

if TYPE_CHECKING:
    from decoders.core.tracefile import TraceCheck


@dataclass(frozen=True)
class JacobiIteration(Event):
    """The block of guesses one Jacobi iteration fed: `tokens[i]` is the guess for output position
    `start + i` (`start` = tokens committed before this iteration; -1 in older traces);
    `changed[i]`: whether that guess differs from the previous iteration's for the same position."""

    type: ClassVar[str] = "JacobiIteration"
    step: int
    iteration: int
    tokens: tuple[int, ...]
    changed: tuple[bool, ...]
    start: int = -1

    def check(self, c: TraceCheck, where: str) -> None:
        c.tokens(self.tokens, f"{where}.tokens")
        c.need(
            len(self.tokens) == len(self.changed),
            f"{where}: tokens and changed must be equally long",
        )
        c.need(
            len(self.tokens) <= MAX_DRAFT_NODES,
            f"{where}: a Jacobi block has at most {MAX_DRAFT_NODES} tokens",
        )
        c.need(
            whole(self.iteration, 0, c.n_events),
            f"{where}: iteration must be a whole number in 0..{c.n_events}",
        )
        # The block guesses absolute output positions start, start + 1, ...: those right after
        # what the earlier steps committed (-1: a trace made before the field existed).
        before = c.committed_before[self.step]
        c.need(
            whole(self.start, -1, c.n_committed) and self.start in (-1, before),
            f"{where}: start must be the {before} tokens committed before step {self.step} "
            f"(or -1), got {self.start!r}",
        )

    def token_ids(self) -> list[int]:
        return list(self.tokens)


@dataclass(frozen=True)
class NgramPool(Event):
    """The n-gram pool after a lookahead step: `added` = n-grams the window yielded this step;
    `hits` = candidates found for the last committed token (what the verify branch checked);
    `size` = n-grams held; `top` = the most used n-grams with their hit counts so far;
    `n` = the n-gram size N (0 in older traces)."""

    type: ClassVar[str] = "NgramPool"
    step: int
    added: tuple[tuple[int, ...], ...]
    hits: int
    size: int = 0
    top: tuple[tuple[int, ...], ...] = ()  # each: (hit count, *n-gram tokens)
    n: int = 0

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            whole(self.n, 0, max(NGRAM_SIZES)) and (self.n == 0 or self.n in NGRAM_SIZES),
            f"{where}: n must be in {min(NGRAM_SIZES)}..{max(NGRAM_SIZES)} (or 0), got {self.n!r}",
        )
        for gram in self.added:
            c.tokens(gram, f"{where}.added")
        for entry in self.top:
            c.need(len(entry) >= 2 and entry[0] >= 0, f"{where}: top entries are (count, *tokens)")
            c.tokens(entry[1:], f"{where}.top")

    def token_ids(self) -> list[int]:
        # a `top` entry is (hit count, *n-gram)
        return [t for gram in self.added for t in gram] + [t for e in self.top for t in e[1:]]


@dataclass(frozen=True)
class LookaheadWindow(Event):
    """Lookahead's 2D window at one step: `levels[j][i]` is the token at Jacobi level j (0 = the
    oldest), window position i; `outputs[i]` is the target's new guess on top of column i."""

    type: ClassVar[str] = "LookaheadWindow"
    step: int
    levels: tuple[tuple[int, ...], ...]
    outputs: tuple[int, ...]

    def check(self, c: TraceCheck, where: str) -> None:
        for level in self.levels:
            c.tokens(level, f"{where}.levels")
        c.tokens(self.outputs, f"{where}.outputs")
        width = len(self.outputs)
        c.need(
            all(len(level) == width for level in self.levels),
            f"{where}: every level and the outputs must be equally wide",
        )
        c.need(
            width <= MAX_DRAFT_NODES and len(self.levels) <= max(NGRAM_SIZES),
            f"{where}: the window is at most {MAX_DRAFT_NODES} wide and "
            f"{max(NGRAM_SIZES)} levels deep",
        )

    def token_ids(self) -> list[int]:
        return [t for level in self.levels for t in level] + list(self.outputs)


@dataclass(frozen=True)
class AttentionMask(Event):
    """The attention pattern of one forward among its new inputs (the cached context is visible
    to all): `visible[i]` lists the input indices input i attends to; `labels[i]` names its branch
    and slot, e.g. "x", "look L1·3", "verify n2·d1"; `input_ids[i]` is input i's token and
    `branches[i]` its group ("x", "lookahead", "verify"); both empty in older traces."""

    type: ClassVar[str] = "AttentionMask"
    step: int
    labels: tuple[str, ...]
    visible: tuple[tuple[int, ...], ...]
    input_ids: tuple[int, ...] = ()
    branches: tuple[str, ...] = ()

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(len(self.visible) == len(self.labels), f"{where}: one visible list per label")
        c.need(
            all(0 <= j < len(self.labels) for row in self.visible for j in row),
            f"{where}: visible indices must be among the {len(self.labels)} inputs",
        )
        c.tokens(self.input_ids, f"{where}.input_ids")
        c.need(
            len(self.input_ids) in (0, len(self.labels))
            and len(self.branches) in (0, len(self.labels)),
            f"{where}: input_ids and branches must have one entry per label",
        )

    def token_ids(self) -> list[int]:
        return list(self.input_ids)


@dataclass(frozen=True)
class CopySource(Event):
    """Where a copied draft came from (prompt lookup): the context as the model sees it (the prompt
    ids, chat template included, then the output so far; `context_len` tokens at this step) ends
    with an n-gram that also occurs at `start`; the draft copies what followed that occurrence,
    context[start + n : start + n + len(draft)]."""

    type: ClassVar[str] = "CopySource"
    step: int
    start: int
    n: int
    context_len: int

    def check(self, c: TraceCheck, where: str) -> None:
        # The copy's source must lie in the context the model saw at that step.
        longest = len(c.prompt_ids) + c.max_new_tokens
        c.need(
            self.start >= 0 and self.n >= 1 and self.start + self.n <= self.context_len <= longest,
            f"{where}: the copied span must lie within the {self.context_len}-token context",
        )


@dataclass(frozen=True)
class StoreMatch(Event):
    """Where a retrieved draft came from when it came from the datastore (SAM-Decoding's static
    automaton): the context's last `n` tokens occur `occurrences` times in the datastore, and the
    draft's retrieved nodes (the Draft's nodes `first` onwards, in order) continue them as often
    as `counts` says."""

    type: ClassVar[str] = "StoreMatch"
    step: int
    n: int
    occurrences: int
    counts: tuple[int, ...]
    first: int = 0

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            whole(self.n, 1, c.max_new_tokens + len(c.prompt_ids))
            and whole(self.occurrences, 1, 10**9)
            and whole(self.first, 0, MAX_DRAFT_NODES),
            f"{where}: a datastore match needs n >= 1 tokens, occurring at least once",
        )
        c.need(
            len(self.counts) <= MAX_DRAFT_NODES
            and all(whole(k, 1, self.occurrences) for k in self.counts),
            f"{where}: each retrieved node's count must be in 1..{self.occurrences}",
        )


@dataclass(frozen=True)
class Recycled(Event):
    """The rows of Token Recycling's adjacency matrix a draft was read from: `rows[i]` is a
    token followed by its successors, best first, as the target's latest forwards ranked them
    (`refreshed[i]`: whether that row has been written by this run's forwards yet; False = still
    the warm start, the datastore's most frequent successors when `warm`, else empty)."""

    type: ClassVar[str] = "Recycled"
    step: int
    rows: tuple[tuple[int, ...], ...]
    refreshed: tuple[bool, ...] = ()
    warm: bool = False

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            1 <= len(self.rows) <= MAX_DRAFT_NODES and all(len(r) >= 2 for r in self.rows),
            f"{where}: 1..{MAX_DRAFT_NODES} rows, each a token and at least one successor",
        )
        for i, row in enumerate(self.rows):
            c.tokens(row, f"{where}.rows[{i}]")
        c.need(
            not self.refreshed
            or (
                len(self.refreshed) == len(self.rows)
                and all(isinstance(f, bool) for f in self.refreshed)
            ),
            f"{where}: refreshed must say true or false for every row",
        )

    def token_ids(self) -> list[int]:
        return [t for row in self.rows for t in row]


@dataclass(frozen=True)
class HeadProposals(Event):
    """What the Medusa heads guessed at one step (medusa, blockwise): `heads[i]` = head i + 1's
    top tokens, best first, with `probs[i]` their probabilities under the head. Head i + 1 guesses
    output position `position + i` (`position` = tokens committed before this step; head 1
    guesses the token right after the root, the last committed one)."""

    type: ClassVar[str] = "HeadProposals"
    step: int
    position: int
    heads: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            len(self.heads) == len(self.probs) <= MAX_HEADS
            and all(
                len(t) == len(p) <= MAX_HEADS for t, p in zip(self.heads, self.probs, strict=True)
            ),
            f"{where}: heads and probs must have the same shape, at most {MAX_HEADS} x {MAX_HEADS}",
        )
        for row in self.heads:
            c.tokens(row, f"{where}.heads")
        c.probs(tuple(p for row in self.probs for p in row), where)
        # Head 1 guesses the first position after what the earlier steps committed.
        c.position(self.position, self.step, where)

    def token_ids(self) -> list[int]:
        return [t for row in self.heads for t in row]


@dataclass(frozen=True)
class BlockFill(HeadProposals):
    """What the block drafter filled in its one forward at a step (block_draft): `heads[i]` =
    position i's top tokens, best first (position 0 guesses the token right after the root x, the
    last committed one; position i the i-th after that), `probs[i]` their probabilities. The same
    shape as the Medusa heads' guesses, but every position came out of one forward that let the
    positions attend to each other."""

    type: ClassVar[str] = "BlockFill"


@dataclass(frozen=True)
class MaskGroups(Event):
    """SPACE's relay at one step: `candidates` = the guesses verified this step (c_1 .. c_m);
    `groups[g]` = the top token of each of the k masks in group g (after x for g = 0, after c_g
    otherwise), `probs[g]` their probabilities; `handed` = the group after the last accepted input,
    whose guesses `guesses` (drawn from it when sampling) the next step verifies. `position` =
    output tokens committed before this step. Step 0 is the prefill's single group."""

    type: ClassVar[str] = "MaskGroups"
    step: int
    position: int
    candidates: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]
    handed: int
    guesses: tuple[int, ...] = ()

    def check(self, c: TraceCheck, where: str) -> None:
        c.tokens(self.candidates, f"{where}.candidates")
        c.tokens(self.guesses, f"{where}.guesses")
        c.need(
            len(self.groups) == len(self.probs) <= MAX_DRAFT_NODES
            and all(
                len(t) == len(p) <= MAX_DRAFT_NODES
                for t, p in zip(self.groups, self.probs, strict=True)
            )
            and len(self.candidates) <= MAX_DRAFT_NODES,
            f"{where}: groups and probs must have the same shape, at most "
            f"{MAX_DRAFT_NODES} x {MAX_DRAFT_NODES}",
        )
        for row in self.groups:
            c.tokens(row, f"{where}.groups")
        c.probs(tuple(p for row in self.probs for p in row), where)
        c.need(
            whole(self.handed, -1, max(0, len(self.groups) - 1)),
            f"{where}: handed must name one of the {len(self.groups)} groups",
        )
        c.position(self.position, self.step, where)

    def token_ids(self) -> list[int]:
        return [*self.candidates, *(t for row in self.groups for t in row), *self.guesses]


@dataclass(frozen=True)
class MaskPredictStep(Event):
    """One Mask-Predict iteration on a block: `tokens[j]` = the block's current fill of output
    position `position` + j and `probs[j]` its confidence when it was predicted; `updated` = the
    positions predicted in this iteration (the masked ones), `remasked` = those masked again for
    the next iteration (empty on a block's last)."""

    type: ClassVar[str] = "MaskPredictStep"
    step: int
    position: int
    iteration: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    updated: tuple[int, ...]
    remasked: tuple[int, ...]

    def check(self, c: TraceCheck, where: str) -> None:
        c.tokens(self.tokens, f"{where}.tokens")
        c.probs(self.probs, where)
        width = len(self.tokens)
        c.need(
            len(self.probs) == width <= MAX_DRAFT_NODES,
            f"{where}: tokens and probs must be equally long, at most {MAX_DRAFT_NODES}",
        )
        c.need(
            all(whole(j, 0, width - 1) for j in (*self.updated, *self.remasked)),
            f"{where}: updated and remasked must be positions in the block (0..{width - 1})",
        )
        c.need(
            whole(self.iteration, 0, MAX_DRAFT_NODES),
            f"{where}: iteration must be a whole number in 0..{MAX_DRAFT_NODES}",
        )
        c.position(self.position, self.step, where)

    def token_ids(self) -> list[int]:
        return list(self.tokens)


@dataclass(frozen=True)
class LayerExit(Event):
    """Where one token left the model (CALM, FREE, HASH EE): the token at output index `position`
    came from the exit after `layer` of the model's `n_layers` decoder layers (`layer ==
    n_layers`: no early exit, the full model's LM head). On the way up, exits `layers[i]` were
    offered with `confidences[i]` weighed against `threshold` (CALM and FREE, rule "confidence":
    exit at the first confidence above it); HASH EE (rule "hash") offers none: the input token's
    hash chose `layer`."""

    type: ClassVar[str] = "LayerExit"
    step: int
    position: int
    layer: int
    n_layers: int
    layers: tuple[int, ...]
    confidences: tuple[float, ...]
    threshold: float
    rule: str

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            whole(self.n_layers, 1, MAX_LAYERS)
            and (not c.layers_given or self.n_layers == c.n_layers)
            and whole(self.layer, 1, self.n_layers),
            f"{where}: layer must be in 1..n_layers, the model's {c.n_layers} layers",
        )
        c.need(
            list(self.layers) == sorted(set(self.layers))
            and all(whole(ell, 1, self.n_layers - 1) for ell in self.layers)
            and len(self.confidences) == len(self.layers),
            f"{where}: layers must rise within 1..{c.n_layers - 1}, one confidence each",
        )
        c.probs((*self.confidences, self.threshold), where)
        c.need(self.rule in EXIT_RULES, f"{where}: rule must be one of {', '.join(EXIT_RULES)}")
        c.need(self.step not in c.exited, f"{where}: step {self.step} exits twice")
        c.exited.add(self.step)
        if self.layer < self.n_layers:
            c.left_early.add(self.position)
        c.position(self.position, self.step, where)


@dataclass(frozen=True)
class CatchUp(Event):
    """FREE's synchronized parallel pass at a step: the held-back tokens at output indices
    `positions` (they left at the shallow exit) ran the deep layers in one forward together with
    this step's token, which filled their deep keys and values. `agreed[i]`: whether the deep
    model would have written the same token as the shallow exit did; `threshold`: the shallow
    exit's threshold after this step's samples (the Beta-mixture estimate when adaptive)."""

    type: ClassVar[str] = "CatchUp"
    step: int
    positions: tuple[int, ...]
    agreed: tuple[bool, ...]
    threshold: float

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            len(self.positions) == len(self.agreed) > 0
            and list(self.positions) == sorted(set(self.positions))
            and all(whole(x, 0, c.committed_before[self.step] - 1) for x in self.positions),
            f"{where}: positions must be earlier output tokens, rising, one agreed flag each",
        )
        c.need(
            set(self.positions) <= c.left_early,
            f"{where}: positions must be tokens that left at an early exit",
        )
        c.probs((self.threshold,), where)
        c.need(self.step not in c.caught, f"{where}: step {self.step} catches up twice")
        c.caught.add(self.step)
