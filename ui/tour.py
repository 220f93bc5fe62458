"""The guided tour: an ordered set of stops for a class, each a recorded run of the embedded model
opened at its most telling step, with a short narration and the one thing to look at marked on
the figure. No gradio here (ui/tour_tab.py draws it), and no model compute but the trained
heads' fingerprint (`draft_fingerprint`, asked for when a live run differs from its recording):
the runs are recorded by `python scripts/make_tour.py` into assets/tour/, and
`tests/test_tour.py` re-runs every stop against the current decoders, so a recording cannot go
stale.

How a stop's step is chosen is a rule, said on the page beside the figure (`Stop.rule`) and
computed from the trace's events (`Stop.pick`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from decoders.core import facts
from decoders.core.events import (
    Commit,
    Done,
    Draft,
    Event,
    LayerExit,
    MaskPredictStep,
    Prefill,
    Priced,
    Verify,
)
from decoders.core.readings import fmt_share
from decoders.engine import has_float

from .live import Trace
from .traces import EXAMPLE_PROMPTS

TOUR = Path(__file__).resolve().parents[1] / "assets" / "tour"
PROMPT = EXAMPLE_PROMPTS[0]  # code that repeats its prompt's names: every family has work to do
BUDGET = 48
SIDE_BY_SIDE = "side_by_side"  # the comparison stop's file: a Compare of every stop's run
TRANSLATION = "translation"  # the stop after it: the Translation lab (decoders/seq2seq)
TRANSLATION_SOURCE = "w3 w1 w4 w15 w9 w2"  # its sentence (task `modes`)
ROUNDS = 3  # the recorded Compare's rounds (each speedup a median with its spread)

# --- step rules -------------------------------------------------------------------------------


def _steps(trace: Trace) -> list[int]:
    return sorted({e.step for e in trace.events if isinstance(e, Commit) and e.step > 0})


def most_committed(trace: Trace) -> int:
    """The first step that committed the most tokens."""
    commits = [e for e in trace.events if isinstance(e, Commit) and e.step > 0]
    best = max(commits, key=lambda e: len(e.tokens), default=None)
    return best.step if best else trace.last_step


def least_sure(trace: Trace) -> int:
    """The step whose token the model was least sure of (its lowest probability)."""
    commits = [e for e in trace.events if isinstance(e, Commit) and e.step > 0 and e.probs]
    best = min(commits, key=lambda e: min(e.probs), default=None)
    return best.step if best else trace.last_step


def copied_won(trace: Trace) -> int:
    """The step where the most accepted tokens were copied from the context; else the most
    committed."""
    verdicts = {e.step: e for e in trace.events if isinstance(e, Verify)}
    scored = [
        (len([a for a in verdicts[d.step].accepted if a in set(d.copied)]), -d.step)
        for d in trace.events
        if isinstance(d, Draft) and d.copied and d.step in verdicts
    ]
    best = max(scored, default=(0, 0))
    return -best[1] if best[0] else most_committed(trace)


def most_relaxed(trace: Trace) -> int:
    """The step where the relaxed rule accepted the most drafts the exact rule would have
    rejected; else the most committed."""
    scored = [(len(e.relaxed), -e.step) for e in trace.events if isinstance(e, Verify)]
    best = max(scored, default=(0, 0))
    return -best[1] if best[0] else most_committed(trace)


def shallowest_exit(trace: Trace) -> int:
    """The step whose token left the model earliest; ties: the last such step (more of the
    heatmap drawn)."""
    exits = [e for e in trace.events if isinstance(e, LayerExit)]
    best = min(exits, key=lambda e: (e.layer, -e.step), default=None)
    return best.step if best else trace.last_step


def most_refilled(trace: Trace) -> int:
    """The block where refinement changed the most tokens (a re-masked token came back as a
    different one); ties: the first."""
    fills: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for e in trace.events:
        if isinstance(e, MaskPredictStep):
            fills.setdefault(e.step, []).append((e.iteration, e.tokens))
    changed = {
        step: sum(
            a != b
            for (_, before), (_, after) in itertools.pairwise(rows)
            for a, b in zip(before, after, strict=False)
        )
        for step, rows in ((s, sorted(r)) for s, r in fills.items())
    }
    if not changed:
        return most_committed(trace)
    return max(changed, key=lambda s: (changed[s], -s))


# --- the stops --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stop:
    """One stop: a recorded run (`key`.json in assets/tour/) of `method` with `params` on the
    tour's prompt, the narration, the one thing to look at, and the step rule."""

    key: str
    chapter: str
    title: str
    method: str
    narration: str
    look: str
    pick: Callable[[Trace], int]
    rule: str
    params: Mapping[str, Any] = field(default_factory=dict)
    # Legend entries (their names contain one of these) kept bright; the rest of the figure is
    # dimmed, so the eye goes where `look` says. Empty: nothing dimmed.
    focus: tuple[str, ...] = ()
    # Another stop's recorded run, shown at another step (the token tree's two stops).
    same_run_as: str = ""
    # The method's view the stop draws (by name, one of its declared views); "": its first.
    view: str = ""
    # Its drafts come from a trained head (EAGLE, Kangaroo's adapter, Medusa's heads), which may
    # draft in bfloat16: a machine whose kernels round it otherwise (another draft_fingerprint)
    # grows other trees from the same heads, lossless all the same.
    head_drafted: bool = False

    @property
    def recording(self) -> str:
        return self.same_run_as or self.key

    @property
    def path(self) -> Path:
        return TOUR / f"{self.recording}.json"


BOTTLENECK = "1 · One token per forward"
GUESS = "2 · Guess and check"
TREE = "3 · Many guesses checked at once"
NO_DRAFTER = "4 · Guessing without a drafter"
SELF = "5 · The model drafts for itself"


def _lossy_chapter() -> str:
    """The lossy chapter's title, from what its runs showed in the side-by-side recording: how
    many of them were faster than plain decoding (by the verdict rule, on modelled speedups)."""
    rows = facts.tour_rows()
    lossy = [r for r in rows.values() if r.get("lossy")]
    faster = [r for r in lossy if facts.said(r, rows) == facts.SAID["faster"]]
    return f"6 · Giving up exactness: {len(faster)} of {len(lossy)} faster here"


LESS = _lossy_chapter()
ALL = "7 · All of them side by side"
BEYOND = "8 · Beyond language models: translation"

STOPS: tuple[Stop, ...] = (
    Stop(
        "autoregressive",
        BOTTLENECK,
        "The bottleneck: one token per forward",
        "autoregressive",
        "A language model writes by predicting one token, appending it and running again. Each "
        "forward pass reads every weight of the model to produce a single token, so on most "
        "hardware the time goes into moving weights, not into arithmetic, and the machine could "
        "have checked several tokens for nearly the same price. Every method in this tour "
        "attacks that: it guesses tokens cheaply and lets one forward check many of them. This "
        "run is the reference every other stop is measured against.",
        "the model's top candidates at one step: it was unsure, and still it spent a whole "
        "forward to write one token.",
        least_sure,
        "the step whose token the model was least sure of",
    ),
    Stop(
        "prompt_lookup",
        GUESS,
        "Guess by copying from the prompt",
        "prompt_lookup",
        "The cheapest guess costs nothing: code and edits repeat what is already written. "
        "Prompt lookup finds the last few tokens earlier in the context and proposes whatever "
        "followed them there. The target model then runs once over the guess: it keeps the "
        "longest prefix that matches what it would have written itself and adds one token of its "
        "own. A wrong guess costs only a slightly wider forward; the output is exactly greedy's.",
        "where the copy came from in the context, and how much of it the target kept.",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "sam",
        GUESS,
        "Copy the longest match, from the text or a datastore: SAM",
        "sam",
        "Prompt lookup copies after a match of at most three tokens. SAM-Decoding keeps two "
        "suffix automata, structures that find the longest suffix of a growing text seen before "
        "in constant time per token: one over the prompt and output, one over a datastore of the "
        "model's own writing. The longer match wins: a context match is copied as a chain, a "
        "datastore match drafts its most frequent continuations as a small tree. Still no draft "
        "model, and the target still decides every token.",
        "where the draft came from, the matched suffix, and how much of it the target kept.",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "speculative",
        GUESS,
        "Guess and check: speculative decoding",
        "speculative",
        "A small drafter (here a one-layer head trained on this model's features) proposes a "
        "few tokens; the target verifies them all in one forward. Each draft token is kept while "
        "it equals the target's own choice; at the first mismatch the target's token replaces "
        "it, so nothing the target would not write ever survives. The gain is the accepted "
        "length per forward minus what drafting cost. Under sampling, the same accept/reject "
        "rule keeps the output distribution exactly the target's.",
        "the drafted tokens the target accepted (green) and the one it corrected.",
        most_committed,
        "the step that committed the most tokens",
        head_drafted=True,
    ),
    Stop(
        "token_tree",
        TREE,
        "Many guesses at once: the token tree",
        "token_tree",
        "Why bet on one guess? A tree drafts several continuations, branching where the drafter "
        "is unsure, and the target checks every branch in a single forward: a tree-shaped "
        "attention mask lets each node see only its own ancestors. The longest branch the "
        "target agrees with wins, and one more token of the target's own comes free. A wider "
        "forward costs a little more than a one-token forward, so the tree's size is chosen by "
        "this machine's measured cost of each extra input.",
        "the green path: every node on it was accepted, all checked in one forward.",
        most_committed,
        "the step that committed the most tokens",
        focus=("accepted", "bonus", "correction", "root"),
        head_drafted=True,
    ),
    Stop(
        "token_tree_copy",
        TREE,
        "A copied branch joins the tree",
        "token_tree",
        "The tree takes guesses from two sources. Beside the trained drafter, a chain copied "
        "from the context (prompt lookup: the tokens that followed the last few tokens' "
        "earlier occurrence) is grafted onto the tree, outlined in purple. Copying is free and "
        "code repeats its own names, so when the match is long the tree trusts the copy alone "
        "and skips the drafter. Whichever branch the target agrees with wins; the figure's "
        "subtitle says which.",
        "the purple-outlined copied branch and how far along it the target agreed.",
        copied_won,
        "the step where the most accepted tokens were copied from the context",
        focus=("accepted", "copied", "bonus", "correction", "root"),
        same_run_as="token_tree",
    ),
    Stop(
        "jacobi",
        NO_DRAFTER,
        "Guessing without a drafter: Jacobi iteration",
        "jacobi",
        "Jacobi decoding needs no drafter at all. It guesses a whole block of future tokens, "
        "runs the model once over the block, and replaces every guess with the model's "
        "prediction at that position. Tokens at the front become correct first; a guess that "
        "stays the same between iterations has reached a fixed point and can be committed. "
        "Lossless, because each committed token is verified against the model's own choice, "
        "but plain guesses rarely converge more than a token or two ahead.",
        "the block's guesses changing between iterations, and which settled.",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "lookahead",
        NO_DRAFTER,
        "Guessing without a drafter: Lookahead decoding",
        "lookahead",
        "Lookahead keeps Jacobi's parallel guessing, but does not throw the trajectories away: "
        "every window of guesses leaves n-grams behind in a pool. When the last token matches "
        "the start of a pooled n-gram, that n-gram becomes a candidate, and the same forward "
        "that advances the guessing window also verifies the candidates. Code that repeats "
        "itself fills the pool quickly.",
        "the candidate n-grams from the pool, one per row after x: the green ones the target "
        "accepted in the same forward that moved the window.",
        most_committed,
        "the step that committed the most tokens",
        view="pool_candidates",
    ),
    Stop(
        "recycling",
        NO_DRAFTER,
        "Guessing without a drafter: Token Recycling",
        "recycling",
        "Every verify forward scores the whole vocabulary at every input and keeps one token. "
        "Token Recycling keeps the runners-up: an adjacency matrix holds, for each token, the "
        "eight tokens the target ranked likeliest right after it the last time it saw it. A "
        "draft is a tree read from that table, starting at the last token; after the forward, "
        "every input's row is overwritten with its new top eight. No model drafts, and nothing "
        "is trained.",
        "the rows the draft was read from, and which of their cells the target accepted.",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "kangaroo",
        SELF,
        "The model drafts for itself: Kangaroo",
        "kangaroo",
        "A separate drafter is one more model to train and load. Kangaroo drafts with the "
        "target's own first layers plus a small trained adapter: a shallow sub-network that "
        "shares the big model's embeddings and head. It keeps drafting while its confidence "
        "stays above a threshold η, then the full model verifies. The deep layers that a draft "
        "skipped are computed once, for all the drafted tokens, in the verify pass.",
        "each draft token's confidence against η, and where drafting stopped.",
        most_committed,
        "the step that committed the most tokens",
        head_drafted=True,
    ),
    Stop(
        "self_speculative",
        SELF,
        "The model drafts for itself: Draft & Verify",
        "self_speculative",
        "Draft & Verify drafts with the full model minus some of its layers (a skip set searched "
        "once for this model). No training, nothing extra to load. Whether it wins depends on "
        "how much cheaper the skipping draft is than a full forward, and how many of its "
        "tokens survive: a draft forward here skips only a few layers, so a step must accept "
        "several tokens to pay for itself. The verdict under the figure does that sum.",
        "the drafted tokens' confidence against θ (the last one, below it, ended the draft and "
        "was still verified) and the sentence under the bars: did drafting pay?",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "layerskip",
        SELF,
        "The model drafts for itself: LayerSkip",
        "layerskip",
        "LayerSkip exits early: the first layers of the target, read out through its own LM "
        "head, draft; the remaining layers verify, reusing the draft's early layers instead of "
        "recomputing them. It works best on a model trained so that its early layers already "
        "predict well; on this untuned model the early exit guesses less often, which the "
        "confidence view shows.",
        "the exit's confidence per draft token, and how many the full model kept.",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "medusa",
        SELF,
        "The model drafts for itself: Medusa's heads",
        "medusa",
        "Medusa adds several small heads on the last layer: head k predicts the token k+1 "
        "positions ahead, all from the same forward. Their top choices combine into a tree of "
        "candidates that the next forward verifies with a tree mask. One forward both "
        "verifies the last guesses and produces the next ones, so drafting costs almost "
        "nothing. The heads are small and trained on this model's own outputs; how far ahead "
        "they can see is the limit: the first head is often right, the last rarely.",
        "each head's candidates and which ones the target accepted.",
        most_committed,
        "the step that committed the most tokens",
        head_drafted=True,
    ),
    Stop(
        "blockwise",
        SELF,
        "The model drafts for itself: Blockwise parallel decoding",
        "blockwise",
        "Blockwise parallel decoding is Medusa's ancestor: k heads, each guessing one position "
        "ahead, but only their top token, as one chain. The target verifies the chain and keeps "
        "the longest prefix it agrees with. Simple, and weaker than a tree: one wrong head "
        "ends the step, and a head far ahead is right less often than the one before it. "
        "Its guesses come from the same forward that verified the last ones, as Medusa's do.",
        "the chain of head guesses and where the target first disagreed.",
        most_committed,
        "the step that committed the most tokens",
        head_drafted=True,
    ),
    Stop(
        "space",
        SELF,
        "The model drafts for itself: SPACE",
        "space",
        "SPACE appends mask tokens to the input, so one forward both verifies the previous "
        "guesses and fills the masks with new ones: semi-autoregressive drafting and "
        "verification in the same pass, the model correcting its own guesses as it goes. The "
        "relay shows it step by step: the guesses a step's masks made are verified by the next "
        "step's forward, which fills new masks at the same time. No drafter, no extra head: the "
        "model was tuned to fill masks.",
        "the relay: last step's guesses verified while the masks propose the next.",
        most_committed,
        "the step that committed the most tokens",
    ),
    Stop(
        "calm",
        LESS,
        "Doing less per token: CALM's early exit",
        "calm",
        "Instead of writing more tokens per forward, spend fewer layers per token. CALM reads "
        "the model out after each layer and stops as soon as it is confident enough, skipping "
        "the deep layers for easy tokens. That is a trade: a token from an early exit was never "
        "checked by the full model, so the output can differ from greedy. The heatmap shows "
        "where each token left.",
        "the shallowest exit in the heatmap, and how much the output agrees with greedy.",
        shallowest_exit,
        "the step whose token left the model earliest",
    ),
    Stop(
        "free",
        LESS,
        "Doing less per token: FREE's shallow-deep module",
        "free",
        "FREE has one fixed early exit. A confident token leaves there; the deep layers for the "
        "tokens that left early are caught up later in parallel, in a synchronized pass with "
        "the next deep token, so their keys and values exist when later tokens attend to them. "
        "Less compute per token, paid for by tokens the full model never chose.",
        "the tokens that left at the shallow exit (◆ on its row) and the confidence each "
        "reached; the deep layers they skipped run later, caught up in one pass.",
        shallowest_exit,
        "the step whose token left the model earliest",
    ),
    Stop(
        "hash_ee",
        LESS,
        "Doing less per token: HASH EE",
        "hash_ee",
        "HASH EE decides each token's depth before running it, from a hash of the input token: "
        "no confidence to compute, no learned router. Tokens of the same kind always leave at "
        "the same layer. Cheap and predictable, and lossy: the exit is chosen without asking "
        "whether the model is sure. The heatmap shows the depth the hash gave each token; "
        "the badge, how much of the output still agrees with greedy.",
        "which layer each token's hash sent it to.",
        shallowest_exit,
        "the step whose token left the model earliest",
    ),
    Stop(
        "relaxed",
        LESS,
        "Accepting more than the target would: relaxed verification",
        "speculative",
        "Speculative decoding's exact rule keeps only what the target itself would write. "
        "Relaxed verification (SpecDec's β and τ) also accepts a draft token that is among the "
        "target's top β candidates and within τ of its best score. More tokens per forward "
        "({{tour.relaxed.tpf}} here, against the exact rule's {{tour.speculative.tpf}}), and "
        "an output that drifts from greedy: the lab marks every token only the relaxed rule "
        "accepted, and reports how much of the output agrees with greedy.",
        "the tokens only the relaxed rule accepted, beside the target's own choice.",
        most_relaxed,
        "the step where the relaxed rule accepted the most drafts the exact rule would reject",
        params={"draft": "eagle", "beta": 4, "tolerance": 2},
        head_drafted=True,
    ),
    Stop(
        "mask_predict",
        LESS,
        "Writing a block at once: Mask-Predict",
        "mask_predict",
        "Non-autoregressive decoding writes all the tokens of a block at once, then refines: "
        "Mask-Predict re-masks the tokens it is least confident about and predicts them again, "
        "for a fixed number of iterations. Each position is predicted independently, so the "
        "block can mix two good continuations; iterations repair some of that. The output "
        "differs from greedy; the badge says how much.",
        "the tokens re-masked and refilled at each iteration of this block.",
        most_refilled,
        "the block where refilling changed the most tokens",
    ),
)


# A tour stop's "Run it live", per browser session: the stop whose rule the run opens at.
LIVE: dict[str | None, str] = {}


def forget(session: str | None) -> None:
    """A page closed: drop its pending live run's stop."""
    LIVE.pop(session, None)


def tour_step(session: str | None, trace: Trace) -> tuple[int, str, str] | None:
    """For the live run a tour stop asked for (once): the step its rule picks in this run, the
    rule, and how the run compares with the stop's recording (`replay_note`), when the run is
    that stop's method; else None (the usual showcase step)."""
    key = LIVE.pop(session, None)
    stop = next((s for s in STOPS if s.key == key), None)
    if stop is None or trace.meta.get("method") != stop.method or not trace.token_ids:
        return None
    return stop.pick(trace), f"the tour stop's rule, {stop.rule}", replay_note(stop, trace)


def decisions(events: Sequence[Event]) -> list[tuple]:
    """What a run decided, without its clock or its floats: every event's whole-number and
    text fields (tokens, tree shapes, accepted paths, origins, exits), Forward's kind, inputs
    and layers included; timings, probabilities and prices left out. Two runs that decided the
    same replay step for step."""
    out = []
    for e in events:
        if isinstance(e, (Done, Priced, Prefill)):
            continue
        kept = tuple(
            (f.name, getattr(e, f.name))
            for f in fields(e)
            if not has_float(getattr(e, f.name))  # a Forward's wall_ms too
        )
        out.append((e.type, kept))
    return out


def replay_note(stop: Stop, trace: Trace) -> str:
    """A live run of a stop against its recording: the same steps, or why not (this machine's
    prices size the tree otherwise; its kernels round the heads' bfloat16 otherwise)."""
    was = recorded(stop.recording)
    if decisions(trace.events) == decisions(was.events):
        return "It took the same steps as the tour's recording."
    why = []
    if [e for e in trace.events if isinstance(e, Priced)] != [
        e for e in was.events if isinstance(e, Priced)
    ]:
        why.append(
            "this machine prices a forward's inputs otherwise, so drafts are sized otherwise"
        )
    if stop.head_drafted and draft_fingerprint() != side_by_side().get("draft_fingerprint"):
        why.append(
            "this machine rounds bfloat16 differently, so the trained head's draft "
            "probabilities move in their last bits and the tree keeps other nodes"
        )
    because = f": {'; and '.join(why)}" if why else ""
    return (
        f"It took other steps than the tour's recording{because}. Its output is checked "
        "against greedy all the same."
    )


@cache
def recorded(key: str) -> Trace:
    """A stop's recorded run (checked as an imported trace is, once per process)."""
    from .traces import check_trace

    stop = next(s for s in STOPS if s.key == key)
    raw = stop.path.read_text()
    claim = json.loads(raw).get("lossless") or {}
    trace = check_trace(Trace.from_json(raw))
    status = claim.get("status")
    said = {
        "identical": f"identical to greedy ({claim.get('compared')} tokens)",
        "lossy": f"lossy: {claim.get('note') or 'differs from greedy'}",
    }.get(str(status), str(status or "no claim"))
    trace.meta["lossless"] = {
        **claim,
        "status": "not checked" if status == "identical" else status or "not checked",
        "note": f"recorded: {said}; the test suite re-runs it against greedy",
    }
    return trace


@cache
def side_by_side() -> dict[str, Any]:
    """The recorded Compare of every stop's run: {"rows": [...], "rounds": n, "machine": ...}."""
    return json.loads((TOUR / f"{SIDE_BY_SIDE}.json").read_text())


def side_by_side_row(stop: Stop) -> dict[str, Any] | None:
    """The side-by-side recording's row of a stop's run: its speed against the one reference
    every stop shares (a stop's own recording was timed alone)."""
    spec = spec_of_stop(next(s for s in STOPS if s.key == stop.recording))
    return next((r for r in side_by_side()["rows"] if r["method"] == spec), None)


def here_sentence(stop: Stop) -> str:
    """What the stop's run showed in the side-by-side recording, said plainly: faster or slower
    than plain decoding (the verdict rule, on its modelled speedup), both speeds, and for a lossy
    method how much of its output agreed with greedy's."""
    row = side_by_side_row(stop)
    if row is None or row["method"] == facts.REFERENCE:
        return ""
    verdict = facts.said(row, facts.tour_rows())
    said = f"In the side-by-side recording it was {verdict} plain decoding ({facts.speeds(row)}"
    measured = float(row["speedup"])
    if (verdict == facts.SAID["faster"] and measured < 1) or (
        verdict == facts.SAID["slower"] and measured > 1
    ):  # the verdict is the work's; say where the clock's median fell on the other side
        said += "; its measured median fell on the other side of 1×, within the model's error"
    said += ")"
    if row.get("lossy"):
        said += f", and {fmt_share(row['agreement'])} of its output agreed with greedy's"
        if row.get("first_divergence") is not None:
            said += f" (the first difference at token {row['first_divergence']})"
    return said + "."


def drafting_dtype() -> str:
    """The dtype trained drafting heads run in on this machine beside the float32 target
    (packing.draft_dtype), as side_by_side records it (for the reader: what decides whether a
    recording replays is `draft_fingerprint`, not the dtype's name)."""
    import torch

    from decoders.core.packing import draft_dtype

    return str(draft_dtype(torch.device("cpu"), torch.float32)).removeprefix("torch.")


@cache
def draft_fingerprint() -> str:
    """This process's fingerprint of the embedded model's trained heads (engine.draft_fingerprint,
    a few short runs, once): side_by_side records the recording machine's, and a head-drafted stop
    replays step by step only where the two agree."""
    from decoders.core.models import EMBEDDED_ID
    from decoders.engine import draft_fingerprint as fingerprint

    from .models import get_bundle

    return fingerprint(get_bundle(EMBEDDED_ID))


def pin_prices(trace: Trace) -> None:
    """Price the embedded model by the table `trace` was priced by (in this process only): a
    tree sized by cost then grows the same trees as when it was recorded (the tour's comparison,
    and the test that re-runs each stop)."""
    from decoders.core import costs
    from decoders.core.models import EMBEDDED_ID
    from decoders.core.prices import recorded_prices

    from .models import get_bundle

    table = recorded_prices(trace.meta)
    if table is not None:
        costs.set_table(get_bundle(EMBEDDED_ID), table)


def spec_of_stop(stop: Stop) -> str:
    """The stop's run as a Compare spec (`name:key=value`)."""
    return ":".join([stop.method, *(f"{k}={v}" for k, v in stop.params.items())])


def mark(fig: go.Figure, focus: Sequence[str]) -> go.Figure:
    """Dim what the stop does not ask to look at: every legend entry whose name contains none of
    `focus`, and the boxes (annotations) filled in a dimmed entry's colour."""
    if not focus:
        return fig
    dimmed: set[str] = set()
    for tr in fig.data:
        name = tr.name or ""
        if any(f in name for f in focus):
            continue
        tr.opacity = 0.25
        colour = getattr(getattr(tr, "marker", None), "color", None)
        if isinstance(colour, str):
            dimmed.add(colour)
    for a in fig.layout.annotations:
        if a.bgcolor in dimmed:
            a.opacity = 0.3
    return fig
