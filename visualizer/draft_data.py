"""What the draft panel (figures.draft_panel) shows, as plain data: a chain draft's tokens with
their verdicts, the tokens the target committed, and where relaxed verification took a draft token,
the target's own choice there. No Plotly: events in, rows of token boxes out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from decoders.core.events import Commit, Draft, Event, Verify

from .text import escape, token_hover
from .tokens import COLOURS


@dataclass(frozen=True)
class TokenRow:
    """One row of the draft panel: tokens, their box colours and hovers, at draft positions
    `positions` (1..n when empty)."""

    name: str
    tokens: tuple[int, ...]
    colours: tuple[str, ...]
    hover: tuple[str, ...]
    positions: tuple[int, ...] = ()


@dataclass(frozen=True)
class DraftRows:
    """What the draft panel shows at one step: the draft's row, the target's, and where relaxed
    verification took a draft token, the target's own choice there."""

    step: int
    source: str  # who drafted
    draft: TokenRow
    target: TokenRow
    own: TokenRow | None  # the target's own tokens where the relaxed rule took the draft's
    accepted: int
    relaxed: int  # of the accepted, how many only the relaxed rule took
    width: int  # draft positions drawn: the longer of the draft and the commit


def _draft_status(n: int, n_acc: int, relaxed: set[int], ended: bool) -> list[tuple[str, str]]:
    """Each draft position's box colour and verdict (see `draft_panel`)."""
    out = []
    for i in range(n):
        if i in relaxed:
            verdict = "accepted by relaxed verification only (the exact rule would reject it)"
            out.append((COLOURS["relaxed"], verdict))
        elif i < n_acc:
            out.append((COLOURS["draft"], "accepted"))
        elif ended:
            out.append((COLOURS["pending"], "never written (after the accepted end token)"))
        elif i == n_acc:
            out.append((COLOURS["rejected"], "rejected"))
        else:
            out.append((COLOURS["pending"], "not checked (after a rejection)"))
    return out


def _preferred_row(
    draft: Draft, verify: Verify | None, texts: Mapping[int, str]
) -> TokenRow | None:
    """What the exact rule would have written where the relaxed rule took the draft's token."""
    preferred = dict(zip(verify.relaxed, verify.preferred, strict=False)) if verify else {}
    if not preferred:
        return None
    at = sorted(preferred)
    return TokenRow(
        "target's own",
        tuple(preferred[i] for i in at),
        (COLOURS["correction"],) * len(at),
        tuple(
            f"{token_hover(texts.get(preferred[i], '?'), preferred[i])} · the target's own "
            f"choice at position {i + 1}: the relaxed rule took the draft's "
            f"{escape(repr(texts.get(draft.tokens[i], '?')))} instead"
            for i in at
        ),
        tuple(i + 1 for i in at),
    )


def draft_rows(events: Sequence[Event], texts: Mapping[int, str], step: int) -> DraftRows | None:
    """The draft panel's rows at `step` (see `draft_panel`); None without a draft and a commit."""
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    commit = next((e for e in events if isinstance(e, Commit) and e.step == step), None)
    if draft is None or commit is None:
        return None
    n_acc = len(verify.accepted) if verify else 0
    relaxed = set(verify.relaxed) if verify else set()
    # An accepted end token ended the output: the drafts after it were never compared.
    ended = verify is not None and n_acc > 0 and verify.correction is None
    status = _draft_status(len(draft.tokens), n_acc, relaxed, ended)
    drafted = TokenRow(
        "draft",
        draft.tokens,
        tuple(c for c, _ in status),
        tuple(
            f"{token_hover(texts.get(t, '?'), t)} · {s}"
            for t, (_, s) in zip(draft.tokens, status, strict=True)
        ),
    )
    target = TokenRow(
        "target",
        commit.tokens,
        tuple(COLOURS.get(o, COLOURS["target"]) for o in commit.origins),
        tuple(
            f"{token_hover(texts.get(t, '?'), t)} · {o} · p={p:.3f}"
            for t, o, p in zip(commit.tokens, commit.origins, commit.probs, strict=True)
        ),
    )
    own = _preferred_row(draft, verify, texts)
    return DraftRows(
        step=step,
        source=draft.source,
        draft=drafted,
        target=target,
        own=own,
        accepted=n_acc,
        relaxed=len(relaxed),
        width=max(len(draft.tokens), len(commit.tokens)),
    )
