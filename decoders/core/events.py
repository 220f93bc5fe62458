"""Typed trace events: what a decoder did, step by step.

Events are frozen dataclasses holding plain token ids and numbers (never tensors), so a trace is
cheap to keep, safe to share between threads, and round-trips through JSON. A decoder yields them;
`generate()` folds them into stats; the UI draws them. `SCHEMA_VERSION` changes whenever a field's
meaning changes, so a saved trace from an older version is refused with a clear message.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, Union

from decoders.core.errors import TraceError

SCHEMA_VERSION = 2  # 2: Forward's split and shallow (version 1 traces are migrated on reading)
TRACE_FORMAT = "decoding-lab-trace"

# "shallow": FREE's pass through the layers below its exit (every token); "sync": its synchronized
# pass (held-back tokens and the current one through the deep layers); "oracle": CALM's oracle
# peeking at the full model's token (an analysis pass, not counted as computed)
ForwardKind = Literal["prefill", "target", "draft", "verify", "shallow", "sync", "oracle"]
# Where a committed token came from (the colour language in docs/ARCHITECTURE.md keys on these).
# "mask": filled by a mask and never verified (a lossy method's token); "exit": predicted at an early
# exit, never verified by the full model (lossy); "relaxed": a draft that relaxed verification
# accepted where the exact rule would have rejected it (lossy).
Origin = Literal["target", "draft", "correction", "bonus", "mask", "exit", "relaxed"]


@dataclass(frozen=True)
class Event:
    type: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}

    def check(self, c: TraceCheck, where: str) -> None:
        """Check this event's fields against the trace read so far (an event read from a file:
        its types are already coerced); raise TraceError naming the field."""


@dataclass(frozen=True)
class Prefill(Event):
    """The prompt, as token ids actually fed to the model."""

    type: ClassVar[str] = "Prefill"
    prompt_ids: tuple[int, ...]

    def check(self, c: TraceCheck, where: str) -> None:
        c.tokens(self.prompt_ids, f"{where}.prompt_ids")
        c.need(
            list(self.prompt_ids) == list(c.prompt_ids),
            f"{where}: prompt_ids differ from the trace's",
        )


@dataclass(frozen=True)
class Forward(Event):
    """One model forward pass. `kind` says whose pass it was (ForwardKind); prefill, target,
    verify and sync (FREE's catch-up) are target passes, which stats counts as such.
    A pass split at an early exit (Kangaroo, LayerSkip) names it: `split` = ℓ, the exit layer
    (0: not split), and `shallow` = how many of its inputs ran layers 1..ℓ in this pass (a draft
    pass: all of them; a verify pass resuming at ℓ: the inputs no draft pass had taken there)."""

    type: ClassVar[str] = "Forward"
    step: int
    kind: str  # ForwardKind
    n_input_tokens: int
    layers: int
    wall_ms: float
    split: int = 0
    shallow: int = 0

    def check(self, c: TraceCheck, where: str) -> None:
        kinds = typing.get_args(ForwardKind)
        c.need(self.kind in kinds, f"{where}: kind must be among {', '.join(sorted(kinds))}")
        c.need(
            whole(self.n_input_tokens, 0, c.max_new_tokens + len(c.prompt_ids)),
            f"{where}: bad n_input_tokens",
        )
        c.need(whole(self.layers, 0, c.n_layers), f"{where}: layers must be in 0..{c.n_layers}")
        c.need(math.isfinite(self.wall_ms) and self.wall_ms >= 0, f"{where}: wall_ms must be >= 0")
        c.need(
            whole(self.split, 0, c.n_layers - 1) and whole(self.shallow, 0, self.n_input_tokens),
            f"{where}: split must be in 0..{c.n_layers - 1} and shallow in 0..n_input_tokens",
        )


@dataclass(frozen=True)
class Draft(Event):
    """Draft tokens as a tree: parents[i] is the index of node i's parent, -1 = the root (last commit)."""

    type: ClassVar[str] = "Draft"
    step: int
    source: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    probs: tuple[float, ...]

    def check(self, c: TraceCheck, where: str) -> None:
        c.tokens(self.tokens, f"{where}.tokens")
        c.need(
            len(self.tokens) == len(self.parents) == len(self.probs),
            f"{where}: tokens, parents and probs must be equally long",
        )
        c.need(
            all(-1 <= p < j for j, p in enumerate(self.parents)),
            f"{where}: each parent must be -1 or an earlier node",
        )
        c.probs(self.probs, where)
        c.need(
            len(self.tokens) <= MAX_DRAFT_NODES,
            f"{where}: a draft has at most {MAX_DRAFT_NODES} nodes, got {len(self.tokens)}",
        )
        c.need(self.step not in c.drafted, f"{where}: step {self.step} drafts twice")
        c.drafted[self.step] = list(self.parents)


@dataclass(frozen=True)
class Verify(Event):
    """Indices of accepted draft nodes, and the token the target supplied after them.
    `target_probs[i]`: the target's probability of draft node i's token given its ancestors
    (what the verifier weighed it with); empty in traces from before it was recorded.
    `relaxed`: the accepted nodes that only relaxed verification (SpecDec's top-β, tolerance τ)
    accepted: the exact rule would have rejected them."""

    type: ClassVar[str] = "Verify"
    step: int
    accepted: tuple[int, ...]
    correction: int | None
    rule: str
    target_probs: tuple[float, ...] = ()
    relaxed: tuple[int, ...] = ()

    def check(self, c: TraceCheck, where: str) -> None:
        parents = c.drafted.get(self.step, [])
        c.need(
            all(whole(a, 0, len(parents) - 1) for a in self.accepted),
            f"{where}: accepted nodes must be among the step's {len(parents)} drafted",
        )
        # Acceptance walks down the tree from its root: each node is the previous one's child.
        c.need(
            all(
                parents[a] == (self.accepted[j - 1] if j else -1)
                for j, a in enumerate(self.accepted)
            ),
            f"{where}: accepted nodes must form a path from the draft's root",
        )
        if self.correction is not None:
            c.tokens([self.correction], f"{where}.correction")
        c.probs(self.target_probs, where)
        c.need(
            set(self.relaxed) <= set(self.accepted),
            f"{where}: relaxed nodes must be among the accepted ones",
        )


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


@dataclass(frozen=True)
class TopK(Event):
    """The target's most likely next tokens at one position (what the choice was made from)."""

    type: ClassVar[str] = "TopK"
    step: int
    position: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]

    def check(self, c: TraceCheck, where: str) -> None:
        c.tokens(self.tokens, f"{where}.tokens")
        c.need(
            len(self.tokens) == len(self.probs), f"{where}: tokens and probs must be equally long"
        )
        c.probs(self.probs, where)


@dataclass(frozen=True)
class Commit(Event):
    """Tokens appended to the output this step; `probs[i]`: the probability of token i under
    whatever wrote it: the target for its own and verified tokens; the exit's distribution for a
    token that left early (CALM, HASH EE) and the shallow exit's confidence for one FREE held
    back; the mask row's confidence for Mask-Predict's unverified tokens."""

    type: ClassVar[str] = "Commit"
    step: int
    tokens: tuple[int, ...]
    origins: tuple[str, ...]  # Origin per token
    probs: tuple[float, ...]

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            self.step > c.last_commit,
            f"{where}: step {self.step} commits again after step {c.last_commit}",
        )
        c.last_commit = self.step
        c.tokens(self.tokens, f"{where}.tokens")
        c.n_committed += len(self.tokens)
        c.need(
            len(self.tokens) == len(self.origins) == len(self.probs) > 0,
            f"{where}: tokens, origins and probs must be equally long and not empty",
        )
        origins = typing.get_args(Origin)
        c.need(
            set(self.origins) <= set(origins),
            f"{where}: origins must be among {', '.join(sorted(origins))}",
        )
        c.probs(self.probs, where)


@dataclass(frozen=True)
class DraftStop(Event):
    """Why a confidence-gated draft (Draft & Verify, Kangaroo, speculative's stop) stopped at one
    step. `confidences[i]`: what each paper's rule weighs against `threshold` (θ, η) for draft
    token i: the draft's top probability (Draft & Verify, Kangaroo) or the drafted token's own
    (speculative's stop, EAGLE-2's confidence); the same under greedy drafting;
    `reason`: "confidence" (the last token fell below θ), "max_draft", "eos" (the draft proposed an
    end token), "budget" (max_new_tokens left no room) or "cost" (the next token's path
    probability did not pay for its input: speculative's schedule=cost; it was not kept);
    `rate`: the smoothed acceptance rate θ's update has seen before this step."""

    type: ClassVar[str] = "DraftStop"
    step: int
    threshold: float
    confidences: tuple[float, ...]
    reason: str
    rate: float = 0.0

    def check(self, c: TraceCheck, where: str) -> None:
        c.probs((self.threshold, self.rate, *self.confidences), where)
        c.need(
            self.reason in DRAFT_STOP_REASONS,
            f"{where}: reason must be one of {', '.join(sorted(DRAFT_STOP_REASONS))}, "
            f"got {self.reason!r}",
        )


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


@dataclass(frozen=True)
class Priced(Event):
    """What a run sized its drafts by (token_tree's size=cost, speculative's schedule=cost), as
    this machine measured it (runtime.calibrate, at model load; re-measured when a run's own
    forwards disagree): `input_cost` = one more verified input, as a fraction of a one-token
    target forward; `draft_cost` = one draft forward, in one-token target forwards (0: not
    priced); `forward_ms` = the one-token forward those are fractions of."""

    type: ClassVar[str] = "Priced"
    step: int
    input_cost: float
    draft_cost: float = 0.0
    forward_ms: float = 0.0

    def check(self, c: TraceCheck, where: str) -> None:
        c.need(
            all(math.isfinite(v) and 0.0 <= v <= 100.0 for v in (self.input_cost, self.draft_cost))
            and math.isfinite(self.forward_ms)
            and self.forward_ms >= 0.0,
            f"{where}: costs must be finite, in 0..100 forwards, and forward_ms >= 0",
        )


@dataclass(frozen=True)
class Done(Event):
    """End of a run: why it stopped ("eos" | "length" | "cancelled") and the metrics."""

    type: ClassVar[str] = "Done"
    finish_reason: str
    stats: dict[str, Any]


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Prefill,
        Forward,
        Draft,
        Verify,
        JacobiIteration,
        NgramPool,
        LookaheadWindow,
        AttentionMask,
        TopK,
        Commit,
        DraftStop,
        CopySource,
        HeadProposals,
        MaskGroups,
        MaskPredictStep,
        LayerExit,
        CatchUp,
        Priced,
        Done,
    )
}


def token_ids(event: Event) -> list[int]:
    """Every token id an event names: what a view may need the text of (the window's guesses,
    the pool's n-grams, the mask's inputs, not only the drafts and commits)."""
    if isinstance(event, Prefill):
        return list(event.prompt_ids)
    if isinstance(event, Draft | Commit | TopK | JacobiIteration | MaskPredictStep):
        return list(event.tokens)
    if isinstance(event, Verify):
        return [] if event.correction is None else [event.correction]
    if isinstance(event, LookaheadWindow):
        return [t for level in event.levels for t in level] + list(event.outputs)
    if isinstance(event, NgramPool):  # a `top` entry is (hit count, *n-gram)
        return [t for gram in event.added for t in gram] + [t for e in event.top for t in e[1:]]
    if isinstance(event, AttentionMask):
        return list(event.input_ids)
    if isinstance(event, HeadProposals):
        return [t for row in event.heads for t in row]
    if isinstance(event, MaskGroups):
        return [*event.candidates, *(t for row in event.groups for t in row), *event.guesses]
    return []


# --- JSON -----------------------------------------------------------------------------------------


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check `value` (from JSON) against a field's type hint and turn lists back into tuples."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        return _coerce(value, next(o for o in options if o is not type(None)), where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise TraceError(f"{where}: expected a list, got {type(value).__name__}")
        (item_hint, _) = typing.get_args(hint)
        return tuple(_coerce(v, item_hint, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise TraceError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TraceError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TraceError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TraceError(f"{where}: expected an object, got {type(value).__name__}")
        return value
    raise TypeError(f"unsupported field type {hint!r}")  # a programming error, not bad input


def event_from_dict(data: Any) -> Event:
    if not isinstance(data, dict):
        raise TraceError(f"an event must be an object, got {type(data).__name__}")
    name = data.get("type")
    cls = EVENT_TYPES.get(name)  # type: ignore[arg-type]
    if cls is None:
        raise TraceError(f"unknown event type {name!r}; known: {', '.join(EVENT_TYPES)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is not MISSING:  # added after schema 1 shipped: old traces omit it
                continue
            raise TraceError(f"{name} event is missing field {f.name!r}")
        kwargs[f.name] = _coerce(data[f.name], hints[f.name], f"{name}.{f.name}")
    return cls(**kwargs)


def events_to_json(events: list[Event]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events]


def events_from_json(items: Any) -> list[Event]:
    if not isinstance(items, list):
        raise TraceError("'events' must be a list")
    return [event_from_dict(item) for item in items]


# --- Trace files ----------------------------------------------------------------------------------

MAX_TRACE_BYTES = 32 * 1024 * 1024


def trace_to_dict(meta: dict[str, Any], events: list[Event]) -> dict[str, Any]:
    """A self-contained, versioned trace: run metadata plus every event."""
    return {
        "format": TRACE_FORMAT,
        "version": SCHEMA_VERSION,
        **meta,
        "events": events_to_json(events),
    }


def trace_from_json(
    text: str | bytes, max_bytes: int = MAX_TRACE_BYTES
) -> tuple[dict, list[Event]]:
    """Parse and validate a trace file. Returns (metadata, events); raises TraceError on any flaw."""
    if len(text) > max_bytes:
        raise TraceError(f"trace is {len(text)} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"not valid JSON: {exc}") from None
    except RecursionError:  # e.g. 100,000 nested brackets: valid JSON, never a trace
        raise TraceError("not a Decoding Lab trace: JSON nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceError(f'not a Decoding Lab trace (missing "format": "{TRACE_FORMAT}")')
    version = data.get("version")
    if version not in MIGRATIONS and version != SCHEMA_VERSION:
        raise TraceError(
            f"trace schema version {version!r} is not supported (this build reads "
            f"{', '.join(map(str, [*MIGRATIONS, SCHEMA_VERSION]))})"
        )
    events = events_from_json(data.get("events"))
    meta = {k: v for k, v in data.items() if k not in ("format", "version", "events")}
    while version != SCHEMA_VERSION:  # older formats, brought up to this one, step by step
        meta, events, version = *MIGRATIONS[version](meta, events), version + 1
    return meta, events


def _split_passes_from_layers(meta: dict, events: list[Event]) -> tuple[dict, list[Event]]:
    """Version 1 -> 2: Kangaroo's and LayerSkip's passes did not say where they were split. A
    draft pass that ran the shallow layers ran ℓ of them plus the exit head (layers = ℓ + 1); the
    verify pass ran layers 1..ℓ, when it ran all L layers, for the inputs no draft pass fed."""
    if meta.get("method") not in ("kangaroo", "layerskip"):
        return meta, events
    forwards = [e for e in events if isinstance(e, Forward)]
    ell = next(
        (e.layers - 1 for e in forwards if e.kind == "draft" and e.step > 0 and e.layers >= 2), 0
    )
    depth = next((e.layers for e in forwards if e.kind == "prefill"), 0)
    fed: dict[int, int] = {}
    for e in forwards:
        if e.kind == "draft":
            fed[e.step] = fed.get(e.step, 0) + e.n_input_tokens
    out: list[Event] = []
    for e in events:
        if isinstance(e, Forward) and ell and e.kind == "draft" and e.layers >= 2:
            e = replace(e, split=ell, shallow=e.n_input_tokens)  # (an adapter-only pass: not split)
        elif isinstance(e, Forward) and ell and e.kind in ("verify", "target"):
            ran_shallow = e.layers > depth - ell
            shallow = max(1, e.n_input_tokens - fed.get(e.step, 0)) if ran_shallow else 0
            e = replace(e, split=ell, shallow=min(shallow, e.n_input_tokens))
        out.append(e)
    return meta, out


# version -> how a trace of that version becomes one of the next
MIGRATIONS = {1: _split_passes_from_layers}


# --- checking a trace read from a file: each event checks its own fields -----------------------------

MAX_LAYERS = 1024
MAX_VOCAB = 10_000_000
# The largest draft any method proposes in one step: lookahead's pool trie, G ≤ 16 candidates of
# N − 1 ≤ 11 tokens (token_tree: MAX_NODES = 64 grown + a 32-token copied branch).
MAX_DRAFT_NODES = 16 * 11
MAX_HEADS = 16  # Medusa heads' guesses: rows (heads) and columns (ranks) per step
NGRAM_SIZES = range(2, 13)  # lookahead's N; 0 in traces made before the field existed
EXIT_RULES = ("confidence", "hash")
DRAFT_STOP_REASONS = frozenset({"confidence", "max_draft", "eos", "budget", "cost"})


def whole(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


@dataclass
class TraceCheck:
    """What checking a trace's events needs to know: the trace's bounds (`vocab`, `n_layers`,
    the prompt, the budget) and what the events before the one checked established (which steps
    committed how much, drafted, exited). Events check themselves against it (`Event.check`);
    a broken rule raises TraceError naming the event and the field."""

    vocab: int
    n_layers: int
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    n_events: int
    layers_given: bool = False  # the trace names its model's layer count
    last_commit: int = -1
    n_committed: int = 0
    committed_before: dict[int, int] = field(default_factory=dict)  # step -> tokens before it
    drafted: dict[int, list[int]] = field(default_factory=dict)  # step -> its draft's parents
    exited: set[int] = field(default_factory=set)  # steps with a LayerExit
    caught: set[int] = field(default_factory=set)  # steps with a CatchUp
    left_early: set[int] = field(default_factory=set)  # output positions that left early

    @staticmethod
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise TraceError(message)

    def tokens(self, ids: Any, where: str) -> None:
        self.need(
            isinstance(ids, list | tuple) and all(whole(t, 0, self.vocab - 1) for t in ids),
            f"trace field '{where}' must hold token ids in 0..{self.vocab - 1}",
        )

    def probs(self, probs: Sequence[float], where: str) -> None:
        self.need(all(0.0 <= p <= 1.0 for p in probs), f"{where}: probabilities must be in [0, 1]")

    def position(self, position: int, step: int, where: str) -> None:
        """An output position an event names: the tokens the earlier steps committed."""
        before = self.committed_before[step]
        self.need(
            position == before,
            f"{where}: position must be the {before} tokens committed before step {step}, "
            f"got {position!r}",
        )

    def step(self, event: Event, where: str) -> None:
        """The order every stepped event keeps: steps rise one at a time, from 0."""
        step = getattr(event, "step", None)
        if step is None:
            return
        self.need(
            whole(step, 0, self.n_events), f"{where}: step {step} is outside 0..{self.n_events}"
        )
        self.need(
            step <= self.last_commit + 1,
            f"{where}: step {step} comes before step {self.last_commit + 1}",
        )
        self.committed_before.setdefault(step, self.n_committed)
