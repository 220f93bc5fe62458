"""What the token tree (tree_view.token_tree) shows, as plain data: the drawn nodes of one step's
draft with their verdicts, the tree they form and the accepted path through it. No Plotly: events
in, nodes out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from decoders.core.events import Commit, Draft, Event, Prefill, Verify
from decoders.core.prices import drafter_key

# Nodes drawn at most (each is a Plotly annotation: thousands make the page crawl): the first ones
# in index order (parents come first, so they form a tree) and the accepted path.
MAX_NODES = 200


def check_parents(parents: Sequence[int]) -> None:
    """Raise ValueError unless every parent comes before its child (or is -1, the root)."""
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent must come before its child (or be -1)")


def drawn_nodes(
    parents: Sequence[int], accepted: Sequence[int], limit: int = MAX_NODES
) -> list[int]:
    """The nodes to draw, in index order: all of them, or for a big tree the first `limit` and
    the accepted path with its ancestors (a valid parent array stays a tree: parents come first)."""
    if len(parents) <= limit:
        return list(range(len(parents)))
    keep = set(range(limit))
    for a in accepted:
        while a >= 0 and a not in keep:
            keep.add(a)
            a = parents[a]
    return sorted(keep)


def _p(probs: Sequence[float], i: int) -> str:
    return f"{probs[i]:.3f}" if 0 <= i < len(probs) else "—"


def copied_chain(draft: Draft) -> tuple[list[int], list[int]]:
    """The copied branch: (the nodes the drafter had proposed too, the copy's own nodes)."""
    own = list(draft.copied)
    shared: list[int] = []
    node = draft.parents[own[0]] if own else -1
    while node >= 0:
        shared.append(node)
        node = draft.parents[node]
    return shared[::-1], own


def override_said(draft: Draft) -> str:
    """When a long enough match won outright (the copied chain replaced the drafter's draft):
    the match and the threshold it reached, as the event records them; "" otherwise."""
    if not draft.override:
        return ""
    name = drafter_key(draft.source)  # the copy's name: "SAM context", "prompt lookup"
    return f"{name} match {draft.match} ≥ {draft.override}: the copy replaces the drafter's draft"


def which_branch_won(draft: Draft, accepted: Sequence[int]) -> str:
    """Which branch the target took, when the tree holds a copied chain: the copy, the drafter's,
    or both (the drafter had proposed the copied tokens it accepted)."""
    if not draft.copied:
        return ""
    shared, own = copied_chain(draft)
    took_own = [a for a in accepted if a in set(own)]
    took_shared = [a for a in accepted if a in set(shared)]
    if draft.override:  # the title and override_said tell that the copy is the whole tree
        return f"{len(took_own)} of {len(own)} copied tokens accepted"
    if len(own) == len(draft.tokens):
        return (
            f"the copied chain alone (the drafter skipped): {len(took_own)} of {len(own)} accepted"
        )
    if took_own:
        n = len(took_own) + len(took_shared)
        return f"the copied branch won: {n} accepted token{'s' if n != 1 else ''} copied from the context"
    if took_shared:
        return f"the drafter and the copy agreed on {len(took_shared)} accepted"
    if not accepted:
        return "neither branch's first token was accepted"
    return "the drafter's branch won; the copied branch was rejected"


def _root_token(events: Sequence[Event], step: int) -> tuple[int | None, str]:
    """The token the tree hangs from: the last one committed before `step`, else the prompt's last.
    Returns (token id or None, its target probability as text)."""
    root: tuple[int | None, str] = (None, "—")
    for e in events:
        if isinstance(e, Prefill) and e.prompt_ids and root[0] is None:
            root = (e.prompt_ids[-1], "—")
    for e in events:
        if isinstance(e, Commit) and e.step < step and e.tokens:
            root = (e.tokens[-1], _p(e.probs, len(e.tokens) - 1))
    return root


class TreeNode(NamedTuple):
    """One drawn node: the root, a draft node, or the target's own token after the path."""

    slot: int  # its place in the layout (0: the root)
    index: int  # the draft node: -1 the root, n (the draft's size) the target's token
    token: int | None
    status: str  # a tree_view.STATUS_STYLE key
    draft_p: str
    target_p: str


@dataclass(frozen=True)
class TreeData:
    """What the token tree shows at one step, before any layout: the drawn nodes with their
    verdicts, the tree they form and the accepted path through it."""

    step: int
    source: str  # who drafted (" + " joins the parts)
    n: int  # nodes in the draft
    accepted: tuple[int, ...]  # the accepted path's draft nodes, in order
    nodes: tuple[TreeNode, ...]  # the root, the drawn draft nodes, the target's token if any
    parents: tuple[int, ...]  # parent array of the drawn nodes by slot - 1 (-1: the root)
    path: tuple[int, ...]  # the accepted path's slots, the root first
    drawn: int  # draft nodes drawn (a big tree is drawn in part)
    extra: bool  # the target's own token after the path is drawn (its last node)
    committed: int  # tokens the commit kept (the budget or EOS may cut the path short)
    copied: frozenset[int]  # nodes on the chain copied from the context
    preferred: Mapping[int, int]  # relaxed node -> the target's own choice there
    won: str  # which branch the target took, when the tree holds a copied chain
    override: str = ""  # the match that made the copy the whole draft (override_said), if one did


def _statuses(draft: Draft, verify: Verify, accepted: Sequence[int]) -> list[str]:
    """Each draft node's status (a tree_view.STATUS_STYLE key)."""
    accepted_set = set(accepted)
    relaxed = set(getattr(verify, "relaxed", ()))
    # An accepted end token ended the output: nothing below it was compared (no correction).
    end = accepted[-1] if accepted and verify.correction is None else None
    status: list[str] = []
    for i, p in enumerate(draft.parents):
        if i in accepted_set:
            status.append("relaxed" if i in relaxed else "accepted")
        elif end is not None and p == end:
            status.append("after the end")
        elif p == -1 or p in accepted_set:
            status.append("rejected")  # compared with the target's choice and lost
        else:
            status.append("not checked")
    return status


def _target_token(commit: Commit | None, accepted: Sequence[int]) -> tuple[int, str, str] | None:
    """The target's own token after the accepted path, unless the budget/EOS cut the commit short:
    (token, origin, target p)."""
    if commit is not None and len(commit.tokens) > len(accepted):
        origin = commit.origins[-1] if commit.origins else "correction"
        return (commit.tokens[-1], origin, _p(commit.probs, len(commit.tokens) - 1))
    return None


def _step_of(
    events: Sequence[Event], step: int
) -> tuple[Draft | None, Verify | None, Commit | None]:
    """The step's draft, verdict and commit (None where it has none)."""
    draft = next((e for e in events if isinstance(e, Draft) and e.step == step), None)
    verify = next((e for e in events if isinstance(e, Verify) and e.step == step), None)
    commit = next((e for e in events if isinstance(e, Commit) and e.step == step), None)
    return draft, verify, commit


def tree_data(events: Sequence[Event], step: int) -> TreeData | str:
    """The token tree at `step` as data (see `token_tree`), or why there is none to draw."""
    draft, verify, commit = _step_of(events, step)
    if draft is None:
        # No room left in the budget, or (size=cost) no node whose chance paid for its input.
        return f"no tree at step {step}: a plain target step"
    if verify is None:
        return f"the draft at step {step} has not been verified (yet)"
    n = len(draft.tokens)
    if len(draft.parents) != n:
        return f"malformed draft: {n} tokens but {len(draft.parents)} parents"
    accepted = [a for a in verify.accepted if 0 <= a < n]
    status = _statuses(draft, verify, accepted)
    extra = _target_token(commit, accepted)
    try:
        check_parents(draft.parents)
    except ValueError as exc:
        return f"malformed draft tree: {exc}"
    # A big tree is drawn in part; slot k + 1 in the layout is node shown[k].
    shown = drawn_nodes(draft.parents, accepted)
    slot = {i: k + 1 for k, i in enumerate(shown)}
    m = len(shown)
    parents = [slot.get(draft.parents[i], 0) - 1 for i in shown]
    parents += [slot.get(accepted[-1] if accepted else -1, 0) - 1] if extra else []
    root_id, root_p = _root_token(events, step)
    nodes = [TreeNode(0, -1, root_id, "root", "—", root_p)]
    for i in shown:
        dp, tp = _p(draft.probs, i), _p(verify.target_probs, i)
        nodes.append(TreeNode(slot[i], i, draft.tokens[i], status[i], dp, tp))
    if extra:
        kind = extra[1] if extra[1] in ("correction", "bonus") else "correction"
        nodes.append(TreeNode(m + 1, n, extra[0], kind, "—", extra[2]))
    return TreeData(
        step=step,
        source=draft.source,
        n=n,
        accepted=tuple(accepted),
        nodes=tuple(nodes),
        parents=tuple(parents),
        path=(0, *(slot[a] for a in accepted), *([m + 1] if extra else [])),
        drawn=m,
        extra=extra is not None,
        committed=len(commit.tokens) if commit is not None else len(accepted),
        copied=frozenset(i for part in copied_chain(draft) for i in part),
        preferred=dict(zip(verify.relaxed, verify.preferred, strict=False)),
        won=which_branch_won(draft, accepted),
        override=override_said(draft),
    )
