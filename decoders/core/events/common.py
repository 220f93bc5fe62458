"""The events every method shares: the prompt, each forward, a draft and its verdict, the commit,
the target's top-k, why a draft stopped, what a sized draft was priced by, and the end. Each
event checks its own fields when a trace is read from a file (`Event.check`)."""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from decoders.core.tracefile import TraceCheck

# "shallow": FREE's pass through the layers below its exit (every token); "sync": its synchronized
# pass (held-back tokens and the current one through the deep layers); "oracle": CALM's oracle
# peeking at the full model's token (an analysis pass, not counted as computed)
ForwardKind = Literal["prefill", "target", "draft", "verify", "shallow", "sync", "oracle"]
# Where a committed token came from (the colour language in docs/ARCHITECTURE.md keys on these).
# "mask": filled by a mask and never verified (a lossy method's token); "exit": predicted at an early
# exit, never verified by the full model (lossy); "relaxed": a draft that relaxed verification
# accepted where the exact rule would have rejected it (lossy).
Origin = Literal["target", "draft", "correction", "bonus", "mask", "exit", "relaxed"]


EVENT_TYPES: dict[str, type[Event]] = {}  # filled by Event.__init_subclass__


@dataclass(frozen=True)
class Event:
    """An event type registers itself by being defined: a subclass that names its `type` joins
    EVENT_TYPES (what a trace file may hold, what a method may declare)."""

    type: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("type")
        if isinstance(name, str):
            if name in EVENT_TYPES and EVENT_TYPES[name].__qualname__ != cls.__qualname__:
                raise TypeError(f"two event types named {name!r}")
            EVENT_TYPES[name] = cls

    def token_ids(self) -> list[int]:
        """Every token id the event names: what a view may need the text of."""
        return []

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

    def token_ids(self) -> list[int]:
        return list(self.prompt_ids)


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
    """Draft tokens as a tree: parents[i] is the index of node i's parent, -1 = the root (last
    commit). `copied`: the nodes a chain copied from the context added (token_tree's prompt-lookup
    branch), a chain in order; the copy's first tokens, where the drafter had proposed them too,
    are the first one's ancestors. `match`: the length in tokens of the match the copied chain
    follows (0: no copy, or a trace from before it was recorded); `override`: the threshold that
    match reached when the copy replaced the drafter's draft, the whole draft then (token_tree's
    `trust`; 0: it did not)."""

    type: ClassVar[str] = "Draft"
    step: int
    source: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    probs: tuple[float, ...]
    copied: tuple[int, ...] = ()
    match: int = 0
    override: int = 0

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
        c.need(
            all(0 <= i < len(self.tokens) for i in self.copied)
            and all(
                self.parents[b] == a for a, b in zip(self.copied, self.copied[1:], strict=False)
            ),
            f"{where}: copied must be a chain of drafted nodes",
        )
        c.need(
            whole(self.match, 0, len(c.prompt_ids) + c.max_new_tokens)
            and whole(self.override, 0, self.match)
            and (not self.override or len(self.copied) == len(self.tokens)),
            f"{where}: match must be a length within the text, and override a threshold it "
            "reached, with the copied chain the whole draft",
        )
        c.need(self.step not in c.drafted, f"{where}: step {self.step} drafts twice")
        c.drafted[self.step] = list(self.parents)

    def token_ids(self) -> list[int]:
        return list(self.tokens)


@dataclass(frozen=True)
class Verify(Event):
    """Indices of accepted draft nodes, and the token the target supplied after them.
    `target_probs[i]`: the target's probability of draft node i's token given its ancestors
    (what the verifier weighed it with); empty in traces from before it was recorded.
    `relaxed`: the accepted nodes that only relaxed verification (SpecDec's top-β, tolerance τ)
    accepted: the exact rule would have rejected them; `preferred[j]`: the target's own token
    where relaxed node `relaxed[j]` stands (empty in traces from before it was recorded)."""

    type: ClassVar[str] = "Verify"
    step: int
    accepted: tuple[int, ...]
    correction: int | None
    rule: str
    target_probs: tuple[float, ...] = ()
    relaxed: tuple[int, ...] = ()
    preferred: tuple[int, ...] = ()

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
        c.need(
            len(self.preferred) in (0, len(self.relaxed)),
            f"{where}: preferred must name one token per relaxed node",
        )
        c.tokens(self.preferred, f"{where}.preferred")

    def token_ids(self) -> list[int]:
        # the target's token, and its own where the relaxed rule took another
        return ([] if self.correction is None else [self.correction]) + list(self.preferred)


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

    def token_ids(self) -> list[int]:
        return list(self.tokens)


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

    def token_ids(self) -> list[int]:
        return list(self.tokens)


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
class Priced(Event):
    """What a run sized its drafts by (token_tree's size=cost, speculative's schedule=cost), from
    this machine's price table (costs.PriceTable, measured once and stored): `input_cost` = one
    more verified input, as a fraction of a one-token target forward; `draft_cost` = one draft
    forward, in one-token target forwards (0: not priced); `forward_ms` = the one-token forward
    those are fractions of."""

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
