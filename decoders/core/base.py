"""What every decoder receives and shares: its config, the output budget, and its registry entry."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decoders.core.events import Event
from decoders.core.params import RELAX_PARAMS, SAMPLING_PARAMS, Param
from decoders.core.sampling import Sampler


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int
    eos_ids: frozenset[int]
    params: Mapping[str, Any] = field(default_factory=dict)  # validated against the method's schema
    detail: bool = True  # emit optional detail events (top-k candidates); off for lean benchmarking
    top_k: int = 5

    def sampler(self) -> Sampler:
        p = self.params
        return Sampler(
            p.get("temperature", 0.0),
            p.get("top_p", 1.0),
            p.get("seed", 0),
            p.get("beta", 1),
            p.get("tolerance", 1.0),
            p.get("synthetic", 0.0),
        )


class Budget:
    """Tracks the output: stops at the first EOS (kept, as transformers does) or at max_new_tokens."""

    def __init__(self, max_new_tokens: int, eos_ids: frozenset[int]) -> None:
        self.max_new_tokens = max_new_tokens
        self.eos_ids = eos_ids
        self.tokens: list[int] = []
        self.finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def take(self, tokens: Sequence[int]) -> list[int]:
        """Append as many of `tokens` as the budget allows, through the first EOS; return those."""
        taken: list[int] = []
        for t in tokens:
            if self.done:
                break
            taken.append(t)
            self.tokens.append(t)
            if t in self.eos_ids:
                self.finish_reason = "eos"
            elif self.remaining == 0:
                self.finish_reason = "length"
        return taken


Decoder = Callable[[Any, list[int], DecodeConfig], Iterator[Event]]


# The families a method belongs to, in the order the page lists them.
FAMILIES = (
    "baseline",
    "draft and verify",
    "self-drafting",
    "parallel",
    "non-autoregressive",
    "early exit",
)


EVERY_RUN = ("Prefill", "Forward", "Commit", "Done")  # the events of any run, whatever its method


@dataclass(frozen=True)
class TourStop:
    """A method's stop on the guided tour (ui/tour.py draws it from its recorded run, made by
    `python scripts/make_tour.py` for every declared stop): where it sits in the lesson, what it
    says, what to look at, and the rule that picks its telling step."""

    chapter: str  # the lesson's chapter, by key: bottleneck, guess, tree, no_drafter, self, lossy
    place: int  # its order within the chapter
    title: str
    narration: str  # may quote the recordings: {{tour.<stop>.<reading>}} (decoders/core/facts.py)
    look: str  # the one thing to look at, said after "Look at:"
    rule: str = "most_committed"  # the telling step: one of ui/tour.py's RULES, by name
    key: str = ""  # its recording's name in assets/tour/ ("" = the method's name)
    params: Mapping[str, Any] = field(default_factory=dict)  # its run's settings (the defaults)
    # Legend entries (their names contain one of these) kept bright; the rest is dimmed.
    focus: tuple[str, ...] = ()
    same_run_as: str = ""  # another stop's recording, shown at another step
    view: str = ""  # the method's view the stop draws (one of its declared views; "": the first)
    # Its drafts come from a trained head, which may draft in bfloat16: a machine whose kernels
    # round it otherwise grows other trees from the same heads, lossless all the same.
    head_drafted: bool = False
    # Predict, then reveal: the question a class answers from the figure before its answer is
    # shown ("" = none), and the legend entries that carry the answer (hidden until the reveal;
    # the verdict colours are always painted over: ui/tour.question).
    ask: str = ""
    conceal: tuple[str, ...] = ()


@dataclass(frozen=True)
class Method:
    """A method's declaration, in its own module (`METHOD = Method(...)` in decoders/methods/):
    everything the registry, the CLI, the Run tab's controls, the Learn tab, Compare's presets
    and trace validation derive from. Its explainer is the markdown file beside the module."""

    name: str
    title: str
    decode: Decoder
    family: str = "draft and verify"  # one of FAMILIES
    rank: int = 0  # its place within the family on the page (the teaching order)
    params: tuple[Param, ...] = ()  # method-specific knobs
    lossless: bool = True  # greedy output must equal autoregressive greedy token for token
    sampling: bool = True  # accepts temperature / top_p / seed
    summary: str = ""
    # Checks that need the model (a draft's layer count, a skip set): run before decoding starts.
    check: Callable[[Any, Mapping[str, Any]], None] | None = None
    # Named parameter sets one click away (the defaults are each method at its best on this
    # machine; "paper" = the settings its paper reports). Values override the defaults.
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Draft-and-verify methods whose greedy verification takes SpecDec's relaxed rule (beta, tolerance)
    relaxable: bool = False
    # The views that draw it, by their names in visualizer/ (the first is the method's panel, the
    # rest are drawn under it, full width), and the Compare presets it brings: label -> specs.
    views: tuple[str, ...] = ("topk_panel",)
    compare: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    in_default_compare: bool = True  # one of Compare's "every method at its defaults" rows
    # Compare's default preset, "each family at its best": one method per family says it is its
    # family's best on this machine (at its defaults), so the default comparison stays short.
    family_best: bool = False
    # The event types its runs emit besides every run's (EVERY_RUN): the views read them, an
    # imported trace may hold no others (ui/traces.py), and a test holds each method to it.
    events: tuple[str, ...] = ()
    # Its stops on the guided tour, in the lesson's chapters (ui/tour.py orders and draws them).
    tour: tuple[TourStop, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: family {self.family!r} is not one of {FAMILIES}")
        if not self.views:
            raise ValueError(f"{self.name}: a method names at least the view that draws it")
        from .events import EVENT_TYPES

        unknown = set(self.events) - set(EVENT_TYPES)
        if unknown:
            raise ValueError(f"{self.name}: no such event types: {', '.join(sorted(unknown))}")

    @property
    def explainer_path(self) -> Path:
        """The method's explainer: the markdown file beside its module (kangaroo.py ->
        kangaroo.md): the idea, the algorithm, the paper, what each view shows."""
        module = sys.modules[self.decode.__module__]
        return Path(module.__file__ or "").with_name(f"{self.name}.md")

    def explainer(self) -> str:
        path = self.explainer_path
        if not path.is_file():
            return f"*No explainer yet for `{self.name}`.*"
        from . import facts  # its numbers: the tour's recording and the benchmark summaries

        return facts.fill(path.read_text())

    def preset(self, name: str) -> dict[str, Any]:
        """The full parameter values of a preset ("defaults" = the schema's defaults)."""
        values = {p.name: p.default for p in self.knobs}
        if name == "defaults":
            return values
        if name not in self.presets:
            known = ", ".join(["defaults", *self.presets])
            raise KeyError(f"{self.name} has no preset {name!r}; known: {known}")
        return values | dict(self.presets[name])

    @property
    def schema(self) -> tuple[Param, ...]:
        return (
            self.params
            + (RELAX_PARAMS if self.relaxable else ())
            + (SAMPLING_PARAMS if self.sampling else ())
        )

    @property
    def knobs(self) -> tuple[Param, ...]:
        """The method's own parameters and, where it has them, the relaxed-verification ones
        (what the UI draws as the method's controls; sampling has its own)."""
        return self.params + (RELAX_PARAMS if self.relaxable else ())

    def claims_lossless(self, params: Mapping[str, Any]) -> bool:
        """Whether a run with these parameters must equal autoregressive greedy: a lossless
        method, unless relaxed verification (β > 1) or synthetic acceptance is on."""
        return (
            self.lossless
            and int(params.get("beta", 1)) <= 1
            and float(params.get("synthetic", 0.0)) <= 0
        )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "family": self.family,
            "lossless": self.lossless,
            "relaxable": self.relaxable,
            "summary": self.summary,
            "params": [p.describe() for p in self.schema],
            "presets": {name: dict(values) for name, values in self.presets.items()},
        }
