"""The glossary: every term a class meets in this app, defined once, shown where it appears.

`annotate` marks the first occurrence of each term in a prose string (an explainer, the
overview, a tour narration) so that hovering or tapping it shows its definition, and
`glossary_markdown` is the page of its own (the Learn tab's "Glossary"). No gradio here.

Why the definition is a child element, not an attribute: gr.Markdown sanitizes its HTML with
the Sanitizer API's default allow-list, which strips every `data-*` attribute (and `aria-*`);
`class`, `tabindex`, `role`, `id` and `title` survive, but `title` would pop the browser's own
tooltip beside ours. So a term is `<span class="dl-term" tabindex="0">word<span class="dl-def"
role="tooltip">definition</span></span>`, the definition hidden by GLOSSARY_CSS until the word
is hovered or focused (a tap on a phone focuses a tabindex element), and read by a screen
reader with the word.
"""

from __future__ import annotations

import html
import re
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Term:
    """One term: its theme on the glossary page, its plain definition (no markdown or HTML in
    it: it is shown inside HTML blocks too) and the other spellings that mean it (each
    spelling's plural is matched without being listed)."""

    theme: str
    definition: str
    aliases: tuple[str, ...] = ()


# The glossary as a class reads it: "# theme", then each term's line (its name, then the other
# spellings that mean it, separated by "; "; a plural is matched without being listed) and its
# definition, indented. Plain prose: no markdown or HTML, since it is shown inside HTML blocks.
TABLE = """
# The model and its forward pass

token
    The unit a language model reads and writes: a word, a piece of a word, a space or a
    punctuation mark, each with an id in the tokenizer's vocabulary. Every count in this app
    (budgets, tokens per forward) is in tokens.

layer; decoder layer
    One of the model's stacked transformer blocks (attention, then an MLP). The embedded
    SmolLM2-135M-Instruct has 30; each token's hidden state passes through them in order.

hidden state; features
    The vector a token's position carries from layer to layer. The last layer's is what the LM
    head reads, and what the EAGLE and Medusa heads draft from.

LM head
    The model's last matrix: it turns a hidden state (after the final norm) into one score per
    vocabulary token. Early exits and self-drafting reuse the model's own.

logits; logit
    The LM head's raw scores, one per vocabulary token; softmax turns them into probabilities,
    and argmax picks the highest.

forward; forward pass; decoder pass
    One run of the model over some new inputs (one token, the prompt, or a token with its
    drafts), reading every weight once. It is the app's unit of cost: over a few inputs a
    forward costs little more than over one.

prefill
    The first forward, over the whole prompt with its chat template: it fills the KV cache and
    writes the first token (step 0 in the views).

KV cache; KV-cache; key-value cache
    The keys and values every layer computed for the tokens so far, kept so that the next
    forward runs only the new inputs. Rejected drafts' entries are cropped from it.

attention mask; mask matrix
    Which inputs each input of a forward may look at. The views draw it as a grid: a row is a
    query, a column a key it may see.

chat template
    The role markers and fixed text an instruct model was trained to see around each message.
    The app wraps your prompt in it, so the model reads more than the prompt box shows (prompt
    lookup often copies from it).

# Decoding

autoregressive; autoregressive decoding; plain decoding
    Writing one token per forward, each conditioned on every token before it: the baseline every
    method here must match and is timed against.

greedy; greedy decoding
    Always taking the single most probable token (argmax; temperature 0). Greedy output is
    deterministic, and every lossless method must reproduce it token for token.

argmax
    The token with the highest score at a position: the greedy pick, and the target's own choice
    a draft is compared with.

sampling; sampled
    Drawing each token at random from the model's probabilities (temperature above 0, within
    top_p, reproducible from the seed) instead of taking the likeliest. A lossless method must
    then keep the target's distribution exactly, not its tokens.

temperature
    T divides the logits before softmax: T = 1 keeps the model's own probabilities, a higher T
    flattens them (more random), and T = 0 here means greedy.

step
    One round of a method: draft (if it drafts), one target forward, commit. The views' step
    slider walks through them; step 0 is the prefill.

commit; committed; commits; committing
    To add tokens to the output for good. A step commits its accepted drafts plus the target's
    own token; nothing committed is ever taken back.

lossless
    A method is lossless when it writes exactly what autoregressive decoding would: greedy's
    tokens under greedy, the same distribution under sampling. The app checks every run against
    greedy.

lossy
    A method that may write other tokens than autoregressive decoding (early exit, Mask-Predict,
    relaxed verification); the app reports how much of its output agreed with greedy's.

# Draft and verify

target; target model
    The model being sped up, whose output must come out unchanged: it checks the drafts and has
    the last word. Here the embedded SmolLM2-135M-Instruct, or the model picked.

draft; drafted; drafting; drafter; draft model; draft token
    Tokens guessed cheaply ahead of the target, for it to check in one forward. The drafter is
    whatever guesses them: a small trained head, the target's own first layers, a copy from the
    context, or a datastore.

verify; verifies; verified; verifying; verification; verify pass; verify step
    The target's check of a draft: one forward over the last committed token and every draft
    token, whose output at each position is the token the target itself would write there.

accept / reject; accept; accepted; accepting; reject; rejected; rejection
    A draft token is accepted when it equals the target's own choice at its position (under
    sampling: kept with probability min(1, p/q)). The first one that is not is rejected, and
    every draft after it is thrown away (green and red in the views).

correction
    At the first rejected draft, the target's own token at that position takes its place (orange
    in the views), so a step always commits at least one token.

bonus token; bonus
    When every draft token is accepted, the verifying forward's last position already holds the
    target's next token: it is committed for free (blue in the views).

relaxed verification; relaxed rule
    Also accepting a draft token that is not the target's first choice but among its top β and
    within τ of its best log-probability: more tokens per forward, but lossy (teal in the
    views).

EAGLE head; EAGLE
    A one-layer drafter trained for this model: from the target's last hidden state and the next
    token it predicts the next hidden state, which the target's own LM head reads.

prompt lookup; prompt-lookup
    Drafting by copying: find an earlier place where the last few tokens occurred (usually in
    the prompt) and propose the tokens that followed there. No draft model.

n-gram; N-gram
    A run of n consecutive tokens. Prompt lookup matches the last n tokens against the earlier
    text; lookahead keeps a pool of n-grams from its Jacobi window.

datastore
    A fixed store of tokenized text, searched for what followed the text's latest words, to
    draft from (REST, SAM-Decoding).

token tree; draft tree; tree
    A draft that keeps several alternatives at each depth instead of one chain. One forward
    verifies every node, and the target keeps the one path it agrees with.

tree attention; tree attention mask; tree mask
    An attention mask that lets each node of a token tree see the context and its own ancestors
    only, so one forward scores every branch as if it had been decoded alone.

trie
    A tree of candidate token sequences merged on their shared beginnings, so that a common
    prefix is verified once (REST, lookahead's verification branch).

# Without a drafter, or fewer layers

Jacobi iteration; Jacobi decoding; Jacobi
    Guess a block of tokens, run the target over all of them in one forward, replace every guess
    by the target's output at its position, repeat. Guesses whose predecessors are all right
    have converged and are committed.

fixed point
    A block that Jacobi iteration no longer changes: every guess equals the target's output
    after the guesses before it. It is exactly the greedy output.

lookahead; lookahead decoding
    Lookahead decoding: Jacobi iteration run for its by-products. The n-grams along its window's
    trajectories fill a pool, and pool n-grams that start with the last token are verified in
    the same forward.

mask; mask token
    A placeholder input that stands for the token that will be there. SPACE and Mask-Predict let
    the model fill masks in the same forward.

non-autoregressive; non-autoregressive decoding
    Predicting a block of positions at once, each without knowing what its neighbours chose,
    instead of one token after another.

Mask-Predict; cmlm
    Fill every masked position in one pass, then mask again the least confident and refill them
    with the rest in view, for T iterations. It is the Translation lab's cmlm model, and the
    mask_predict method on a block of the language model's next tokens.

early exit; exit; exited; exiting; exit layer
    Writing a token from an exit part-way up the model, read through the LM head, when it is
    confident enough, and skipping the layers above: lossy, since the full model never checked
    it. In Kangaroo and LayerSkip an exit only drafts, and the full model verifies.

adapter
    A small trained module in front of an exit (Kangaroo's attention layer and two norms, CALM's
    low-rank adapters) that makes a shallow layer's state read well through the LM head.

# Measuring speed

tokens per forward; tokens per target forward; tokens a forward
    New tokens divided by target forwards (prefill and verify passes counted): autoregressive's
    is 1. A method gains only when it outruns the cost of its wider forwards and its drafting.

acceptance length; mean acceptance length; accepted length
    Tokens committed per verifying target forward, the target's own included: 1 + accepted
    drafts / verify steps. vLLM reports it as mean_acceptance_length.

acceptance rate; draft acceptance rate
    Accepted draft tokens / drafted tokens; vLLM reports it as draft_acceptance_rate. A tree's
    is low even when its acceptance length is long, since only one branch is kept.

speedup; speed-up
    How many times faster than autoregressive on the same prompt and budget: measured (the
    clock's median over rounds) or modelled (the run's forwards priced by the price table).
    Above 1× is faster.

price table
    What a target forward over n inputs costs, in one-token forwards, measured on this machine,
    with each drafter's forward; a modelled speedup prices a run's work with it.

# The Translation lab

NAT; non-autoregressive translation; vanilla NAT
    Non-autoregressive translation: a model that writes every word of the translation in one
    decoder pass, each position choosing on its own. Fast, but it mixes translations when a
    sentence has several right ones.

multimodality problem; multimodality
    A source with several right translations: a NAT's positions, each choosing alone, mix pieces
    of different ones, and the result is no translation at all.

register
    In the Translation lab's toy task each source word has two synonyms, register a and register
    b, and a right translation uses one register for the whole sentence: mixing a- and b-words
    is the telltale NAT error.

distillation; distilled; distil; distilling; knowledge distillation
    Training a student on a teacher's outputs instead of the data. The distilled NAT (nat_kd)
    learns from an autoregressive teacher's translations, so each source has one target to
    learn; the early exits here learn the last layer's predictions likewise.
"""


def _parse(table: str) -> dict[str, Term]:
    """TABLE as {name: Term}, in its order."""
    terms: dict[str, Term] = {}
    theme, names, said = "", [], []

    def close() -> None:
        if names:
            terms[names[0]] = Term(theme, " ".join(said), tuple(names[1:]))

    for line in table.splitlines():
        if line.startswith("# "):
            close()
            theme, names, said = line[2:].strip(), [], []
        elif line.startswith("    "):
            said.append(line.strip())
        elif line.strip():
            close()
            names, said = [n.strip() for n in line.split(";")], []
    close()
    return terms


# The terms, in the glossary page's order (theme by theme); each name and alias belongs to one.
TERMS: dict[str, Term] = _parse(TABLE)
THEMES = tuple(dict.fromkeys(t.theme for t in TERMS.values()))


def plural(word: str) -> str:
    """The regular English plural ("pass" -> "passes", "draft" -> "drafts")."""
    return word + ("es" if word.endswith(("s", "x", "sh", "ch")) else "s")


def forms(name: str) -> tuple[str, ...]:
    """Every spelling matched for a term: its name, its aliases, and each one's plural."""
    base = (name, *TERMS[name].aliases)
    return tuple(dict.fromkeys(f for b in base for f in (b, plural(b))))


@cache
def _by_form() -> dict[str, str]:
    """Lower-case spelling -> the term it names (a spelling claimed twice is a bug)."""
    out: dict[str, str] = {}
    for name in TERMS:
        for f in forms(name):
            if out.setdefault(f.lower(), name) != name:
                raise ValueError(f"{f!r} names both {out[f.lower()]!r} and {name!r}")
    return out


def term_of(word: str) -> str | None:
    """The term a word (any matched spelling, any case) names; None when it names none."""
    return _by_form().get(word.lower())


def definition(word: str) -> str | None:
    """The definition of the term a word names; None when it names none."""
    name = term_of(word)
    return TERMS[name].definition if name else None


def anchor(name: str) -> str:
    """The glossary page's anchor id for a term."""
    return "glossary-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# --- annotate ---------------------------------------------------------------------------------

TERM = '<span class="dl-term" tabindex="0">{word}<span class="dl-def" role="tooltip">{text}</span></span>'
# An annotated term as `annotate` writes it (the word and the definition hold no tags).
MARKED = re.compile(
    r'<span class="dl-term"[^>]*>([^<]*)<span class="dl-def"[^>]*>[^<]*</span></span>'
)
# An HTML tag as CommonMark reads one ("y_<i)" is text, not a tag).
TAG = (
    r"</?[A-Za-z][A-Za-z0-9-]*"
    r"(?:\s+[A-Za-z_:][\w.:-]*(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+))?)*\s*/?>"
)
# Elements whose content is no prose to annotate: a label in a heading's place (the tour's
# "Stop n of m" line) or an explicit opt-out.
NO_TERMS_CLASSES = ("dl-noterm", "dl-tour-where")
# What annotate leaves alone, each kept whole: earlier terms, code, headings, links, HTML.
PROTECTED = re.compile(
    "|".join(
        [
            MARKED.pattern,
            r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[^\n]*\n[\s\S]*?(?:^[ \t]{0,3}(?P=fence)[ \t]*$|\Z)",
            r"^[ \t]{0,3}#{1,6}(?:[ \t][^\n]*)?$",  # a heading line
            r"(?P<ticks>`+)[\s\S]*?(?<!`)(?P=ticks)(?!`)",  # a code span
            r"<(?P<el>a|code|pre|kbd|samp|script|style|button|h[1-6])\b[^>]*>[\s\S]*?</(?P=el)\s*>",
            r"<(?P<box>\w+)\b[^>]*\bclass=['\"][^'\"]*\b(?:"
            + "|".join(NO_TERMS_CLASSES)
            + r")\b[^>]*>[\s\S]*?</(?P=box)\s*>",
            r"<!--[\s\S]*?-->",
            TAG,  # any other tag, with its attributes
            r"<[A-Za-z][\w+.-]*:[^\s<>]*>",  # an autolink
            r"!?\[[^\]\n]*\](?:\([^)\n]*\)|\[[^\]\n]*\])",  # a markdown link or image
            r"https?://[^\s)>\]]+",  # a bare URL
            r"\{\{[\s\S]*?\}\}",  # a fact not yet filled
            r"&#?\w+;",  # an HTML entity
        ]
    ),
    re.MULTILINE,
)


@cache
def _words(skip: frozenset[str]) -> re.Pattern[str]:
    """Every matched spelling, the longest first (so "bonus token" wins over "token"), as whole
    words (a hyphen counts as part of a word: "one-token" is not "token")."""
    spellings = sorted((f for f in _by_form() if f not in skip), key=len, reverse=True)
    alternatives = "|".join(re.escape(s) for s in spellings)
    return re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])", re.IGNORECASE)


def annotate(text: str, skip: Collection[str] = ()) -> str:
    """`text` (markdown or HTML prose) with the first occurrence of each term marked: hovering
    or focusing it shows the term's definition. Never inside code, headings, links, tags or an
    earlier mark, and idempotent (a term marked already is not marked again). `skip`: spellings
    that mean something else in this text (the Translation lab's "forward" word order)."""
    words = _words(frozenset(s.lower() for s in skip))
    seen = {term_of(m.group(1)) for m in MARKED.finditer(text)}
    out: list[str] = []

    def prose(chunk: str) -> str:
        def mark(m: re.Match[str]) -> str:
            name = term_of(m.group(0))
            if name in seen:
                return m.group(0)
            seen.add(name)
            return TERM.format(word=m.group(0), text=html.escape(TERMS[name].definition))

        return words.sub(mark, chunk)

    at = 0
    for m in PROTECTED.finditer(text):
        out += [prose(text[at : m.start()]), m.group(0)]
        at = m.end()
    out.append(prose(text[at:]))
    return "".join(out)


def plain(text: str) -> str:
    """`text` with annotate's marks taken out again (each back to its word): what a test that
    looks for a sentence in annotated prose compares with."""
    return MARKED.sub(lambda m: m.group(1), text)


# --- the page of its own ----------------------------------------------------------------------


def _also(name: str) -> list[str]:
    """A term's other spellings worth saying on its page (not the plural or singular of another:
    those are matched all the same)."""
    spelled = [name.lower(), *(a.lower() for a in TERMS[name].aliases)]
    return [
        a
        for a in TERMS[name].aliases
        if not any(plural(a.lower()) == b or plural(b) == a.lower() for b in spelled)
    ]


def glossary_markdown() -> str:
    """The glossary page: every term under its theme, each with an anchor (`anchor(name)`), its
    other spellings and its definition."""
    parts = [
        "### Glossary: every term, defined once\n\n"
        "Wherever one of these words appears in the explainers, the overview or the tour, it is "
        "underlined with dots: hover it, or tap it on a phone, to read its definition there."
    ]
    for theme in THEMES:
        parts.append(f"#### {theme}")
        for name, term in TERMS.items():
            if term.theme != theme:
                continue
            also = _also(name)
            said = f" (also: {', '.join(also)})" if also else ""
            parts.append(
                f'<a id="{anchor(name)}"></a>**{name}**{said}: {html.escape(term.definition)}'
            )
    return "\n\n".join(parts) + "\n"


GLOSSARY_CSS = """
/* The glossary's terms (ui/glossary.py): a dotted underline; the definition shows on hover, or
   on focus (a tap on a phone focuses the term). */
.dl-term {border-bottom: 1px dotted currentColor; cursor: help; position: relative;}
.dl-term:focus {outline: 2px solid #1565c0; outline-offset: 1px; border-radius: 2px;}
.dl-term .dl-def {display: none;}
.dl-term:hover > .dl-def, .dl-term:focus > .dl-def {
  display: block; position: absolute; z-index: 1000; left: 0; top: calc(100% + 4px);
  width: max-content; max-width: min(320px, 90vw); box-sizing: border-box;
  padding: 6px 9px; border-radius: 6px; border: 1px solid #94a3b8;
  background: #1f2937; color: #ffffff; box-shadow: 0 2px 8px rgba(0, 0, 0, .25);
  font-size: 13px; line-height: 1.45; font-weight: 400; font-style: normal;
  text-align: left; text-transform: none; letter-spacing: normal; white-space: normal;
  pointer-events: none;}
/* Where anchor positioning exists, the definition hangs from its word but flips to the word's
   left, or above it, rather than leave the screen (fixed: the screen is what it must fit). */
@supports (position-try-fallbacks: flip-inline) and (anchor-scope: all) {
  .dl-term {position: static; anchor-name: --dl-term; anchor-scope: --dl-term;}
  .dl-term:hover > .dl-def, .dl-term:focus > .dl-def {
    position: fixed; position-anchor: --dl-term; left: auto; top: auto; margin: 4px 0;
    position-area: bottom span-right;
    position-try-fallbacks: flip-inline, flip-block, flip-block flip-inline;}
}
/* A phone: the definition is a card along the screen's bottom, always inside it. */
@media (max-width: 640px) {
  .dl-term:hover > .dl-def, .dl-term:focus > .dl-def {
    position: fixed; position-area: none; position-try-fallbacks: none;
    left: 5vw; right: 5vw; top: auto; bottom: 16px; margin: 0;
    width: auto; max-width: none; font-size: 14px;}
}
"""
