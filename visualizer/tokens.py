"""Token text as coloured spans, one colour language everywhere (docs/ARCHITECTURE.md):
accepted draft (green), rejected (red), corrected (orange), bonus (blue), pending (grey),
target-decoded tokens in plain ink.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from decoders.core.events import Commit, Draft, Event, Prefill, Verify

from .text import MARK_INK, MARKER_NOTE, Marker

COLOURS = {
    "draft": "#c8e6c9",  # accepted draft
    "rejected": "#ffcdd2",
    "correction": "#ffe0b2",
    "bonus": "#bbdefb",
    "target": "#dde4e8",
    "pending": "#f5f5f5",
    "mask": "#e1bee7",  # unverified: filled by a mask (a lossy method)
    "exit": "#fff59d",  # unverified: predicted at an early exit (a lossy method)
    "relaxed": "#4db6ac",  # a draft only relaxed verification accepted (lossy): teal, not green
}
LABELS = {
    "draft": "accepted draft",
    "rejected": "rejected draft",
    "correction": "corrected by target",
    "bonus": "bonus token",
    "target": "decoded by target",
    "pending": "not yet generated",
    "mask": "filled by a mask (not verified)",
    "exit": "early exit (not verified)",
    "relaxed": "accepted by relaxed verification only",
}

STYLE = """
<style>
.dl-tokens {font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px;
  line-height: 1.9; white-space: pre-wrap; word-break: break-word; color: #1f2937;}
.dl-tok {border-radius: 3px; padding: 1px 0; margin: 0 1px 0 0; border-bottom: 2px solid transparent;}
.dl-tok.dl-pending {color: #9e9e9e;}
.dl-tok.dl-now {border-bottom-color: #37474f;}
.dl-legend {display: flex; flex-wrap: wrap; gap: 10px; font-size: 12px; margin-bottom: 6px; color: #455a64;}
.dl-legend span.sw {display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  vertical-align: -2px; margin-right: 4px; border: 1px solid #cfd8dc;}
.dl-prompt {color: #78909c;}
.dl-mark {color: {mark_ink}; font-style: italic;}
/* A step's drafts where they would have gone: the rejected ones rolled back (struck, fading), the
   accepted ones settling; a draft not verified yet, faint. */
.dl-tok.dl-ghost {text-decoration: line-through 2px; color: #b71c1c; background: #ffebee;
  opacity: .7; padding: 1px 2px; animation: dl-fade 1.2s ease-out;}
.dl-tok.dl-ghost.dl-unverified {text-decoration: none; color: #546e7a; opacity: .45;
  animation: none; border-bottom: 1px dashed #90a4ae;}
.dl-tok.dl-now {animation: dl-settle .8s ease-out;}
@keyframes dl-fade {from {opacity: 1;} to {opacity: .7;}}
@keyframes dl-settle {from {opacity: .35;} to {opacity: 1;}}
</style>
""".replace("{mark_ink}", MARK_INK)


def display_text(text: str) -> str:
    """Make whitespace visible enough to follow token boundaries without hiding the layout; a
    chat-template marker in its muted ink, its own text on hover."""
    if isinstance(text, Marker):
        return (
            f'<span class="dl-mark" title="{html.escape(repr(text.original))}: the chat '
            f"template's, not the model's text\">{html.escape(text)}</span>"
        )
    return html.escape(text).replace("\n", "↵\n").replace("\t", "⇥")


# --- the chat template's tokens -------------------------------------------------------------------

# A special token's text: `<|name|>` (ChatML, Llama 3, Phi), and the few angle-bracket ones other
# templates use. Its marker names what it does where the name is known, else its name.
SPECIAL = re.compile(r"^(?:<\|([^<>|]{1,40})\|>|<(start_of_turn|end_of_turn|s|/s)>)$")
SPECIAL_WORDS = {
    "im_start": "turn",
    "im_end": "end",
    "endoftext": "end of text",
    "start_header_id": "role",
    "end_header_id": "/role",
    "eot_id": "end",
    "begin_of_text": "start",
    "end_of_text": "end of text",
    "start_of_turn": "turn",
    "end_of_turn": "end",
    "s": "start",
    "/s": "end",
}
# The role names a template writes after a turn's special token (pieces of one when the tokenizer
# splits it: "ass" + "istant").
ROLES = ("system", "user", "assistant", "model", "tool", "developer", "human", "ipython")
MAX_ROLE_PIECES = 3


def _special(text: str) -> Marker | None:
    m = SPECIAL.match(text)
    if m is None:
        return None
    name = m.group(1) or m.group(2)
    return Marker(f"⟨{SPECIAL_WORDS.get(name, name)}⟩", text)


def _roles(prompt: Sequence[int], texts: Mapping[int, str]) -> Iterator[tuple[int, str]]:
    """(prompt position, role name) for each piece of a role name the template wrote: the
    tokens right after a special token that spell one of ROLES and end at a newline or at the
    next special token."""
    for i, t in enumerate(prompt):
        if _special(texts.get(t, "")) is None:
            continue
        pieces = prompt[i + 1 : i + 1 + MAX_ROLE_PIECES + 1]
        word = ""
        for k, p in enumerate(pieces):
            text = texts.get(p, "")
            if k and ("\n" in text or _special(text) is not None):
                if word in ROLES:
                    yield from ((i + 1 + j, word) for j in range(k))
                break
            word += text
            if not word.isalpha():
                break


def template_marks(events: Sequence[Event], texts: Mapping[int, str]) -> dict[int, Marker]:
    """The one rule for which tokens are the chat template's (and how the views spell them): a
    special token's text (<|im_start|> -> ⟨turn⟩), anywhere; and a role name the template wrote
    after one ("ass", "istant" -> ⟨assistant⟩), unless that token is also the model's text or
    the user's (it then appears in the output, or in the prompt outside the template's
    places)."""
    prefill = next((e for e in events if isinstance(e, Prefill)), None)
    marks = {t: m for t, text in texts.items() if (m := _special(text)) is not None}
    if prefill is None:
        return marks
    prompt = list(prefill.prompt_ids)
    roles = dict(_roles(prompt, texts))
    elsewhere = {t for i, t in enumerate(prompt) if i not in roles} | {
        t for e in events if isinstance(e, Commit) for t in e.tokens
    }
    for i, word in roles.items():
        t = prompt[i]
        if t not in elsewhere and t not in marks:
            marks[t] = Marker(f"⟨{word}⟩", texts.get(t, ""))
    return marks


def marked_texts(events: Sequence[Event], texts: Mapping[int, str]) -> Mapping[int, str]:
    """`texts` with the template's tokens as markers (the mapping itself when there are none)."""
    marks = template_marks(events, texts)
    return {**texts, **marks} if marks else texts


def legend_html(
    origins: Sequence[str] = ("target", "draft", "correction", "bonus", "pending"),
) -> str:
    items = "".join(
        f'<span><span class="sw" style="background:{COLOURS[o]}"></span>{LABELS[o]}</span>'
        for o in origins
    )
    return f'<div class="dl-legend">{items}</div>'


def rolled_back(draft: Draft, accepted: Sequence[int]) -> list[int]:
    """The drafted tokens a verdict threw away, as they would have read on: the draft's first
    node past the accepted path that was not accepted, then its most likely child, and so on
    (for a chain, simply the rest of the chain)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(draft.parents):
        children.setdefault(p, []).append(i)
    at = accepted[-1] if accepted else -1
    taken = set(accepted)
    rest = [c for c in children.get(at, []) if c not in taken]
    out: list[int] = []
    while rest:
        node = max(rest, key=lambda c: (draft.probs[c] if c < len(draft.probs) else 0.0, -c))
        out.append(node)
        rest = children.get(node, [])
    return [draft.tokens[i] for i in out]


def _ghost(token: int, texts: Mapping[int, str], title: str, unverified: bool = False) -> str:
    classes = "dl-tok dl-ghost" + (" dl-unverified" if unverified else "")
    return (
        f'<span class="{classes}" title="{html.escape(title)}">'
        f"{display_text(texts.get(token, '?'))}</span>"
    )


def token_spans_html(
    events: Sequence[Event],
    texts: Mapping[int, str],
    upto_step: int | None = None,
    *,
    prompt_text: str | None = None,
    legend: bool = True,
) -> str:
    """Committed tokens as spans; tokens committed after `upto_step` are shown pending (grey),
    and those committed at exactly `upto_step` are underlined. Hover shows id, step, probability.
    The drafts show where they would have gone: at `upto_step`, the drafted tokens its verdict
    rolled back, struck through, before the target's own token that replaced them; while a run
    streams (`upto_step` None), a draft not verified yet, faint, after the last commit."""
    texts = marked_texts(events, texts)
    spans: list[str] = []
    origins_seen: list[str] = []
    drafts = {e.step: e for e in events if isinstance(e, Draft)}
    verdicts = {e.step: e for e in events if isinstance(e, Verify)}
    committed = {e.step for e in events if isinstance(e, Commit)}
    for event in events:
        if not isinstance(event, Commit):
            continue
        ghosts: list[int] = []
        if (
            upto_step is not None
            and event.step == upto_step
            and event.step in drafts
            and event.step in verdicts
            and event.origins
            and event.origins[-1] == "correction"
        ):
            ghosts = rolled_back(drafts[event.step], verdicts[event.step].accepted)
        last = len(event.tokens) - 1
        for j, (token, origin, prob) in enumerate(
            zip(event.tokens, event.origins, event.probs, strict=False)
        ):
            if j == last and ghosts:  # the rolled-back drafts, where the correction now stands
                spans += [
                    _ghost(g, texts, f"drafted at step {event.step}, rejected: rolled back")
                    for g in ghosts
                ]
                if "rolled back" not in origins_seen:
                    origins_seen.append("rolled back")
            pending = upto_step is not None and event.step > upto_step
            kind = "pending" if pending else origin
            colour = COLOURS.get(kind, COLOURS["target"])
            if kind not in origins_seen:
                origins_seen.append(kind)
            classes = (
                "dl-tok"
                + (" dl-pending" if pending else "")
                + (" dl-now" if upto_step is not None and event.step == upto_step else "")
            )
            title = f"{texts.get(token, '?')!r} · id {token} · step {event.step} · p={prob:.3f} · {LABELS.get(origin, origin)}"
            spans.append(
                f'<span class="{classes}" style="background:{colour}" title="{html.escape(title)}" '
                f'data-step="{event.step}" data-id="{token}">{display_text(texts.get(token, "?"))}</span>'
            )
    waiting = [s for s in drafts if s not in committed]
    if upto_step is None and waiting:  # streaming: the draft the target has not judged yet
        step = max(waiting)
        spans += [
            _ghost(t, texts, f"drafted at step {step}: waiting for the target's verdict", True)
            for t in rolled_back(drafts[step], ())  # a tree: its most likely branch
        ]
    prompt = f'<span class="dl-prompt">{display_text(prompt_text)}</span>' if prompt_text else ""
    head = _spans_legend(origins_seen, spans) if legend else ""
    body = "".join(spans) or '<span class="dl-pending">(no tokens yet)</span>'
    return f'{STYLE}{head}<div class="dl-tokens">{prompt}{body}</div>'


def _spans_legend(origins_seen: Sequence[str], spans: Sequence[str]) -> str:
    """The token spans' legend: the origins shown, the rolled-back drafts and the chat
    template's markers where there are any."""
    head = legend_html(tuple(o for o in LABELS if o in origins_seen) or ("target",))
    extra = ""
    if "rolled back" in origins_seen:
        extra += (
            '<span><span class="sw" style="background:#fff;border-color:#b71c1c"></span>'
            "<s>drafted, rolled back</s></span>"
        )
    if any('class="dl-mark"' in span for span in spans):  # once: what the markers are
        extra += f'<span class="dl-mark">{html.escape(MARKER_NOTE)}</span>'
    return head.replace("</div>", extra + "</div>", 1)


def metrics_html(
    stats: Mapping[str, Any],
    lossless: Mapping[str, Any] | None = None,
    measured: Mapping[str, Any] | None = None,
    where: str = "",
) -> str:
    """The headline numbers as cards, with the lossless badge. The speedup card gives the
    modelled speedup (the run's work priced by the machine's price table) and, where a
    comparison timed it (`measured`: a Compare row's speedup and range), the clock's beside it;
    `where` says whose numbers they are ("this run, on this machine"; "the tour's
    recording")."""

    def card(label: str, value: str, hint: str = "") -> str:
        return (
            f'<div class="dl-card" title="{html.escape(hint)}"><div class="dl-v">{html.escape(value)}</div>'
            f'<div class="dl-l">{label}</div></div>'
        )

    def num(key: str, fmt: str = "{:.2f}") -> str:
        v = stats.get(key)
        return "—" if v is None else fmt.format(v)

    modelled = stats.get("modelled_speedup")
    clock = ""
    if measured and measured.get("speedup") is not None:
        low, high = measured.get("speedup_range") or (None, None)
        span = f" ({low:.2f}–{high:.2f}×)" if low is not None else ""
        clock = f"; measured {measured['speedup']:.2f}×{span}"
    clock += f" · {html.escape(where)}" if where else ""
    cards = [
        card(
            f"speedup, modelled{clock}",
            "—" if modelled is None else f"{modelled:.2f}×",
            "autoregressive decoding's work over this run's: its forwards priced by this "
            "machine's price table (deterministic: the same settings give the same number on a "
            "busy machine); measured = the clock against an autoregressive run of the same prompt",
        ),
        card(
            "tokens / s",
            num("tokens_per_s", "{:.1f}"),
            "new tokens / the run's wall time after the prompt's forward (the prefill)",
        ),
        card(
            "first token",
            "—" if stats.get("ttft_s") is None else f"{1000 * stats['ttft_s']:.0f} ms",
            "time to first token: the prompt's forward (prefill), apart from tokens / s",
        ),
        card(
            "tokens / target forward",
            num("tokens_per_target_forward"),
            "new tokens / target passes (prefill, target, verify; FREE's deep sync passes, each "
            "completing every token held back at the shallow exit, so FREE can pass 1)",
        ),
        card(
            "mean acceptance length",
            num("mean_acceptance_length"),
            "mean_acceptance_length (vLLM's): 1 + accepted drafts / verify steps, the tokens a "
            "verify step writes, the target's own included",
        ),
        card(
            "draft acceptance rate",
            _percent(stats.get("draft_acceptance_rate")),
            "draft_acceptance_rate (vLLM's): accepted drafts / drafted tokens",
        ),
        card("new tokens", num("new_tokens", "{}"), ""),
    ]
    badge = lossless_badge_html(lossless)
    why = acceptance_sentence(stats)
    return (
        "<style>.dl-cards{display:flex;flex-wrap:wrap;gap:8px;align-items:stretch}"
        ".dl-card{background:#f7f9fa;border:1px solid #e0e6ea;border-radius:8px;padding:6px 12px;min-width:110px}"
        ".dl-v{font-size:20px;font-weight:600;color:#1f2937}.dl-l{font-size:11px;color:#607d8b}"
        ".dl-badge{border-radius:8px;padding:6px 12px;font-weight:600;display:flex;align-items:center}</style>"
        f'<div class="dl-cards">{"".join(cards)}{badge}</div>'
        + (f'<div class="dl-l" style="margin-top:4px">{html.escape(why)}</div>' if why else "")
    )


def acceptance_sentence(stats: Mapping[str, Any]) -> str:
    """Why a low draft acceptance rate can sit beside a long acceptance length, said with this
    run's numbers, where they look contradictory (a tree, or a long draft); else ""."""
    rate, length = stats.get("draft_acceptance_rate"), stats.get("mean_acceptance_length")
    steps, drafted = stats.get("verify_steps") or 0, stats.get("drafted_tokens") or 0
    if rate is None or length is None or not steps or rate >= 0.5 or length < 1.5:
        return ""
    return (
        f"Only {_percent(rate)} of drafted tokens were accepted, yet each verify step wrote "
        f"{length:.2f} tokens: the steps drafted {drafted / steps:.1f} tokens each on average "
        "(a tree's branches, or a long chain), and the target keeps one path and adds a token "
        "of its own."
    )


def _percent(value: float | None) -> str:
    """A share as a whole percentage; "<1%" when it is above zero but rounds to 0 (a "0%" beside
    a mean acceptance length above 1 read as a contradiction)."""
    if value is None:
        return "—"
    return "<1%" if 0 < value < 0.005 else f"{value:.0%}"


def lossless_badge_html(lossless: Mapping[str, Any] | None) -> str:
    if not lossless:
        return ""
    status = lossless.get("status")
    if status == "identical":
        text, bg = f"✓ identical to greedy ({lossless.get('compared', '?')} tokens)", "#c8e6c9"
    elif status == "near_tie":  # a flip of a float tie between kernel paths, not a wrong verify
        k = lossless.get("first_divergence")
        text, bg = f"≈ identical up to a float near-tie at token {k}", "#fff3c4"
    elif status == "differs":
        text, bg = f"✗ differs from greedy at token {lossless.get('first_divergence')}", "#ffcdd2"
    elif status == "lossy":  # never a tick: how close a lossy method came this time
        text, bg = lossy_badge_text(lossless), "#f3e5f5"
    elif status == "reference":
        text, bg = "reference: autoregressive greedy", "#eceff1"
    else:
        text, bg = str(lossless.get("note", "lossless check: n/a")), "#eceff1"
    note = lossless.get("caveat")
    title = f' title="{html.escape(note)}"' if note else ""
    return f'<div class="dl-badge" style="background:{bg}"{title}>{html.escape(text)}</div>'


def lossy_badge_text(q: Mapping[str, Any]) -> str:
    """ "not identical: 72 % agree, first difference at token 5 · ROUGE-L 0.81 · NLL 1.32 nats
    (greedy 0.98)", or, when it matched this time, that a lossy method merely happened to."""
    n = q.get("compared", "?")
    if q.get("first_difference") is None:
        head = f"lossy method: matched greedy on all {n} tokens this time (not guaranteed)"
    else:
        head = (
            f"lossy, not identical: {100 * q.get('agreement', 0):.0f}% agree with greedy position by "
            f"position (after the first difference, at token {q['first_difference']}, the texts "
            "drift apart)"
        )
    tail = f" · ROUGE-L {q.get('rouge_l', 0):.2f}"
    if q.get("consistency") is not None:
        tail += (
            f" · {100 * q['consistency']:.0f}% of its tokens are what the target itself would "
            "write after the text before them"
        )
    if q.get("nll") is not None:
        tail += f" · NLL {q['nll']:.2f} nats/token (greedy {q.get('nll_greedy', 0):.2f})"
    return head + tail
