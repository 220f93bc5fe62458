"""The token-tree figure on hand-written traces: no model, no server."""

import random

import plotly.graph_objects as go
import pytest

from decoders.core.events import Commit, Draft, Forward, Prefill, Verify
from visualizer.tokens import COLOURS
from visualizer.tree_view import (
    MAX_NODES,
    PLOT_MARGINS_PX,
    column_layout,
    drawn_nodes,
    token_tree,
    tree_layout,
    which_branch_won,
)

TEXTS = {1: "<s>", 10: "def", 11: " f", 12: "(x", 13: "):", 14: "\n", 15: " return", 16: "<b>"}
TEXTS |= {20: " g", 21: "[", 22: "x)", 30: "longtoken"}

# Step 1: a branching tree. Node 0 (" f") and 2 ("(x") are accepted, node 1 (" g") lost against
# " f", node 3 ("[") lost against "(x", node 4 hangs under the rejected node 1 (never checked),
# node 5 ("\n") lost against the target's correction "x)" after "(x".
#   root -> 0 -> 2 -> 5
#             -> 3
#        -> 1 -> 4
BRANCHING = [
    Prefill((1,)),
    Forward(0, "prefill", 1, 30, 60.0),
    Commit(0, (10,), ("target",), (0.9,)),
    Forward(1, "draft", 1, 8, 10.0),
    Draft(
        1, "medusa", (11, 20, 12, 21, 13, 14), (-1, -1, 0, 0, 1, 2), (0.9, 0.05, 0.6, 0.3, 0.5, 0.4)
    ),
    Forward(1, "verify", 7, 30, 80.0),
    Verify(1, (0, 2), 22, "greedy-tree", (0.85, 0.1, 0.7, 0.2, 0.3, 0.05)),
    Commit(1, (11, 12, 22), ("draft", "draft", "correction"), (0.85, 0.7, 0.6)),
]


def nodes_by_status(fig: go.Figure) -> dict[str, go.Scatter]:
    """The per-status traces: legend entry, hover and data of each node (the box is an annotation)."""
    return {t.name: t for t in fig.data if t.mode == "markers"}


def box(fig: go.Figure, node: int):
    """The annotation drawn as node `node`'s box."""
    (b,) = [a for a in fig.layout.annotations if a.name == f"node {node}"]
    return b


def node_colour(fig: go.Figure, node: int) -> str:
    """Marker colour of draft node `node` (-1 = root, n = the target's token)."""
    for t in nodes_by_status(fig).values():
        if node in t.customdata:
            return t.marker.color
    raise AssertionError(f"node {node} not drawn")


def hover_of(fig: go.Figure, node: int) -> str:
    for t in nodes_by_status(fig).values():
        if node in list(t.customdata):
            return t.hovertext[list(t.customdata).index(node)]
    raise AssertionError(f"node {node} not drawn")


def position(fig: go.Figure, node: int) -> tuple[float, float]:
    for t in nodes_by_status(fig).values():
        if node in list(t.customdata):
            k = list(t.customdata).index(node)
            return (t.x[k], t.y[k])
    raise AssertionError(f"node {node} not drawn")


def test_branching_tree_colours_each_status():
    fig = token_tree(BRANCHING, TEXTS, 1)
    assert node_colour(fig, -1) == COLOURS["target"]  # root
    assert node_colour(fig, 0) == COLOURS["draft"]
    assert node_colour(fig, 2) == COLOURS["draft"]
    assert node_colour(fig, 1) == COLOURS["rejected"]  # child of the root, lost
    assert node_colour(fig, 3) == COLOURS["rejected"]  # child of an accepted node, lost
    assert node_colour(fig, 5) == COLOURS["rejected"]  # child of the last accepted node
    assert node_colour(fig, 4) == COLOURS["pending"]  # under a rejected node: never checked
    assert node_colour(fig, 6) == COLOURS["correction"]  # the target's own token
    assert sum(len(t.x) for t in nodes_by_status(fig).values()) == 8  # root + 6 + correction
    assert list(nodes_by_status(fig)) == [
        "root (last committed token)",
        "accepted draft",
        "rejected draft",
        "not checked (an ancestor was rejected)",
        "corrected by target",
    ]  # one legend entry per status shown, bonus absent
    assert fig.layout.title.text == "Step 1: token tree from medusa"
    assert (
        fig.layout.title.subtitle.text.replace("<br>", " ") == "6 nodes, accepted 2, +1 correction"
    )
    # Each node is a box in its status colour, outlined dark on the accepted path.
    for node in range(-1, 7):
        assert box(fig, node).bgcolor == node_colour(fig, node)
    assert box(fig, 0).borderwidth == 2 and box(fig, 1).borderwidth == 1


def test_branching_tree_bold_path_and_layout():
    fig = token_tree(BRANCHING, TEXTS, 1)
    (path,) = [t for t in fig.data if t.name == "accepted path"]
    assert path.line.width >= 3
    expected = [position(fig, n) for n in (-1, 0, 2, 6)]  # root, accepted in order, correction
    assert list(zip(path.x, path.y, strict=True)) == expected
    columns = list(fig.layout.xaxis.tickvals)  # each depth's column centre, labelled 0, 1, ...
    assert list(fig.layout.xaxis.ticktext) == [str(d) for d in range(len(columns))]
    assert [columns.index(x) for x, _ in expected] == [0, 1, 2, 3]
    # The correction hangs under "(x" one column right of it, level with nothing else there.
    assert columns.index(position(fig, 6)[0]) == columns.index(position(fig, 2)[0]) + 1
    assert position(fig, 6) != position(fig, 5)
    (edges,) = [t for t in fig.data if t.name == "edges"]
    assert sum(v is None for v in edges.x) == 7  # 6 draft edges + the correction's
    assert fig.layout.xaxis.title.text == "depth"
    assert fig.layout.yaxis.visible is False


def test_branching_tree_hover_and_text():
    fig = token_tree(BRANCHING, TEXTS, 1)
    h = hover_of(fig, 2)
    assert "'(x'" in h and "id 12" in h and "accepted" in h
    assert "draft p: 0.600" in h and "target p: 0.700" in h and "depth 2" in h
    assert "rejected" in hover_of(fig, 1) and "draft p: 0.050 · target p: 0.100" in hover_of(fig, 1)
    assert "not checked" in hover_of(fig, 4)
    # The root is the last token committed before the step, with its target p.
    assert "id 10" in hover_of(fig, -1) and "target p: 0.900" in hover_of(fig, -1)
    corr = hover_of(fig, 6)
    assert "id 22" in corr and "correction" in corr and "draft p: —" in corr
    assert "target p: 0.600" in corr
    labels = [s for t in nodes_by_status(fig).values() for s in t.text]
    assert "↵" in labels and "def" in labels  # newline visible; root shows "def"


def test_whole_chain_accepted_gives_a_bonus():
    events = [
        Prefill((1, 10)),
        Draft(3, "prompt lookup (n=2)", (11, 12, 13), (-1, 0, 1), (1.0, 1.0, 1.0)),
        Verify(3, (0, 1, 2), 15, "greedy-chain", (0.9, 0.8, 0.7)),
        Commit(3, (11, 12, 13, 15), ("draft", "draft", "draft", "bonus"), (0.9, 0.8, 0.7, 0.6)),
    ]
    fig = token_tree(events, TEXTS, 3)
    assert node_colour(fig, 3) == COLOURS["bonus"]
    assert "rejected draft" not in nodes_by_status(fig)
    assert "id 10" in hover_of(fig, -1)  # no earlier commit: the prompt's last token is the root
    (path,) = [t for t in fig.data if t.name == "accepted path"]
    columns = list(fig.layout.xaxis.tickvals)
    assert [columns.index(x) for x in path.x] == [0, 1, 2, 3, 4] and set(path.y) == {0}  # a row
    assert fig.layout.title.subtitle.text.replace("<br>", " ").endswith("accepted 3, +1 bonus")


def test_commit_cut_short_has_no_extra_node():
    events = [
        Prefill((1,)),
        Draft(1, "self:8", (11, 12), (-1, 0), (0.9, 0.8)),
        Verify(1, (0, 1), 13, "greedy-chain", (0.9, 0.8)),
        Commit(1, (11,), ("draft",), (0.9,)),  # the length budget ran out after one token
    ]
    fig = token_tree(events, TEXTS, 1)
    assert sum(len(t.x) for t in nodes_by_status(fig).values()) == 3
    assert "+1" not in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "not committed" in hover_of(fig, 1) and "not committed" not in hover_of(fig, 0)


def test_step_without_draft_or_verify_is_an_empty_figure():
    fig = token_tree(BRANCHING, TEXTS, 0)
    assert fig.data == ()
    assert "no tree at step 0" in fig.layout.annotations[0].text
    unverified = token_tree(BRANCHING[:5], TEXTS, 1)
    assert unverified.data == ()
    assert "not been verified" in unverified.layout.annotations[0].text


def test_old_trace_without_target_probs_shows_a_dash():
    events = [*BRANCHING[:4], Draft(1, "self:8", (11,), (-1,), (0.9,)), Verify(1, (), 12, "greedy")]
    events.append(Commit(1, (12,), ("correction",), (0.5,)))
    fig = token_tree(events, TEXTS, 1)
    assert "target p: —" in hover_of(fig, 0) and "draft p: 0.900" in hover_of(fig, 0)
    assert node_colour(fig, 0) == COLOURS["rejected"]
    # nothing accepted: the correction hangs from the root
    assert list(fig.layout.xaxis.tickvals).index(position(fig, 1)[0]) == 1
    (path,) = [t for t in fig.data if t.name == "accepted path"]
    assert [list(fig.layout.xaxis.tickvals).index(x) for x in path.x] == [0, 1]


def test_token_text_is_escaped_and_truncated():
    events = [
        Prefill((1,)),
        Draft(1, "x", (16, 30), (-1, -1), (0.5, 0.5)),
        Verify(1, (0,), 14, "g"),
    ]
    fig = token_tree(events, TEXTS, 1)
    labels = [s for t in nodes_by_status(fig).values() for s in t.text]
    assert "&lt;b&gt;" in labels and "<b>" not in labels  # Plotly would render <b> as markup
    # Two columns leave room for the whole token: the box grows with its text.
    assert "longtoken" in labels and box(fig, 1).text == "longtoken"
    assert {a.text for a in fig.layout.annotations} >= {"&lt;b&gt;", "longtoken"}


def test_node_labels_are_whole_where_the_width_allows_and_cut_only_where_it_runs_out():
    """Each depth's column is as wide as its labels: a desktop-wide view shows whole tokens, a
    phone-wide one cuts the longest first (never below 3 characters)."""
    assert column_layout([4, 10, 2], 740)[0] == 10  # fits: the widest label whole
    limit, centres, span = column_layout([4] * 12, 740)
    assert limit == 4 and span <= 740 - PLOT_MARGINS_PX and centres == sorted(centres)
    assert column_layout([10] * 30, 330)[0] == 3
    deep = tuple(range(-1, 10))  # a chain of 11 nodes: 12 columns with the root
    events = [Prefill((1,)), Draft(1, "x", (30,) * 11, deep, (0.5,) * 11), Verify(1, (), 14, "g")]
    assert box(token_tree(events, TEXTS, 1, width=1380), 0).text == "longtoken"
    assert box(token_tree(events, TEXTS, 1), 0).text == "lon…"  # no width said: a phone's
    # A code tree at a desktop's width: short tokens leave room for a 10-character one.
    texts = {
        **TEXTS,
        40: "  ",
        41: " return",
        42: " fibonacci",
        43: "(n",
        44: " -",
        45: " 1",
        46: ")",
    }
    chain = tuple(range(-1, 6))
    events = [
        Prefill((1,)),
        Draft(1, "x", (40, 41, 42, 43, 44, 45, 46), chain, (0.5,) * 7),
        Verify(1, (0, 1, 2), 14, "g"),
    ]
    labels = {a.text for a in token_tree(events, texts, 1, width=740).layout.annotations}
    assert "␣fibonacci" in labels or "·fibonacci" in labels or " fibonacci" in labels, labels


def test_tree_layout_properties():
    parents = (-1, -1, 0, 0, 1, 2)
    pos = tree_layout(parents)
    assert len(pos) == 7 and pos[0][0] == 0
    for i, p in enumerate(parents):
        assert pos[i + 1][0] == pos[p + 1][0] + 1
    for v in range(7):
        kids = [i + 1 for i, p in enumerate(parents) if p + 1 == v]
        if kids:
            assert pos[v][1] == pytest.approx(sum(pos[k][1] for k in kids) / len(kids))
    # Leaves (nodes 3, 4, 5) in depth-first order: 5 (under 2, under 0), then 3, then 4.
    assert [pos[k][1] for k in (6, 4, 5)] == [0, 1, 2]
    assert pos[0][1] == pytest.approx((0.5 + 2.0) / 2)  # mean of node 0 (0.5) and node 1 (2.0)
    assert tree_layout(()) == [(0, 0)]
    assert tree_layout((-1, 0, 1)) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    with pytest.raises(ValueError):
        tree_layout((0,))


def test_wide_random_tree_renders():
    rng = random.Random(7)
    parents = tuple(-1 if i == 0 else rng.randrange(-1, i) for i in range(60))
    tokens = tuple(rng.choice(list(TEXTS)) for _ in range(60))
    path = [0]
    while kids := [i for i, p in enumerate(parents) if p == path[-1]]:
        path.append(kids[0])
    events = [
        Prefill((1,)),
        Draft(2, "eagle", tokens, parents, tuple(rng.random() for _ in range(60))),
        Verify(2, tuple(path), 15, "greedy-tree", tuple(rng.random() for _ in range(60))),
        Commit(
            2,
            (*(tokens[i] for i in path), 15),
            ("draft",) * len(path) + ("bonus",),
            (0.5,) * (len(path) + 1),
        ),
    ]
    fig = token_tree(events, TEXTS, 2)
    pos = tree_layout(parents)
    leaves = [i for i in range(60) if i not in parents]
    assert sorted(pos[i + 1][1] for i in leaves) == list(range(len(leaves)))  # distinct, even
    assert sum(len(t.x) for t in nodes_by_status(fig).values()) == 62
    assert 280 <= fig.layout.height <= 28 * 60 + 170  # ~28 px a leaf: boxes never touch
    assert node_colour(fig, 60) == COLOURS["bonus"]
    assert fig.to_json()  # serialises (what gradio sends to the browser)


def test_a_long_drafter_name_wraps_in_the_title_and_the_graft_is_told_below():
    source = (
        "eagle (auto: the EAGLE head shipped for this model) + prompt lookup (n=2, 1 new nodes)"
    )
    events = [Prefill((1,)), Draft(11, source, (11,), (-1,), (0.9,)), Verify(11, (0,), 12, "g")]
    fig = token_tree(events, TEXTS, 11)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= 44 for line in lines)  # wrapped to fit a phone
    assert (
        " ".join(lines)
        == "Step 11: token tree from eagle (auto: the EAGLE head shipped for this model)"
    )
    assert fig.layout.title.pad.t > 8  # Plotly sets a wrapped title's first line above the top
    subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "prompt lookup (n=2" in subtitle and subtitle.endswith("1 node, accepted 1")


def test_a_big_tree_draws_its_first_nodes_and_the_accepted_path():
    n = 5000  # a chain under node 0, then many siblings; the accepted path ends deep in the chain
    parents = (-1, *range(0, 10), *([-1] * (n - 11)))
    path = tuple(range(11))
    tokens = (11,) * n
    events = [
        Prefill((1,)),
        Draft(2, "eagle", tokens, parents, (0.5,) * n),
        Verify(2, path, 15, "greedy-tree", (0.5,) * n),
        Commit(2, (11,) * 11 + (15,), ("draft",) * 11 + ("bonus",), (0.5,) * 12),
    ]
    few = drawn_nodes(parents, path, limit=5)
    assert few == list(range(11))  # the first five and the rest of the accepted path
    fig = token_tree(events, TEXTS, 2)
    drawn = [c for t in nodes_by_status(fig).values() for c in t.customdata]
    assert len(drawn) == MAX_NODES + 2  # the root and the target's own token as well
    assert set(path) <= set(drawn) and node_colour(fig, n) == COLOURS["bonus"]
    # depth kept along the path
    assert list(fig.layout.xaxis.tickvals).index(position(fig, 10)[0]) == 11
    assert f"{n} nodes, accepted 11" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert f"{MAX_NODES} drawn" in fig.layout.title.subtitle.text.replace("<br>", " ")
    malformed = [*events[:1], Draft(2, "eagle", (11, 12), (1, -1), (0.5, 0.5)), *events[2:]]
    assert "malformed draft tree" in token_tree(malformed, TEXTS, 2).layout.annotations[0].text


def test_the_copied_branch_is_outlined_and_the_subtitle_says_which_branch_won():
    """Nodes 2 and 3 are a chain copied from the context, grafted beside the drafter's 0 -> 1."""
    draft = Draft(
        1, "eagle + prompt lookup", (11, 12, 20, 21), (-1, 0, -1, 2), (0.9, 0.5, 1, 1), (2, 3)
    )
    events = [*BRANCHING[:3], draft]
    copy_won = Verify(1, (2, 3), 22, "greedy-tree")
    fig = token_tree(
        [*events, copy_won, Commit(1, (20, 21, 22), ("draft",) * 2 + ("bonus",), (0.9,) * 3)],
        TEXTS,
        1,
        1000,
    )
    outlined = [a.text for a in fig.layout.annotations if a.bordercolor == "#8e24aa"]
    assert outlined == [" g", "["]
    assert "copied from the context (outline)" in [t.name for t in fig.data]
    assert "the copied branch won: 2 accepted tokens copied" in fig.layout.title.subtitle.text
    assert (
        which_branch_won(draft, (0, 1))
        == "the drafter's branch won; the copied branch was rejected"
    )
    assert which_branch_won(draft, ()) == "neither branch's first token was accepted"
    # the drafter had proposed the copy's first token (node 0): the copy added node 2 after it
    shared = Draft(1, "eagle + prompt lookup", (11, 12, 13), (-1, 0, 0), (0.9, 0.5, 1.0), (2,))
    assert which_branch_won(shared, (0,)) == "the drafter and the copy agreed on 1 accepted"
    assert which_branch_won(shared, (0, 2)) == (
        "the copied branch won: 2 accepted tokens copied from the context"
    )


def tree_of(draft: Draft) -> tuple:
    """A draft's tokens, parents and probabilities."""
    return draft.tokens, draft.parents, draft.probs


def test_a_match_that_overrode_the_draft_is_the_whole_tree_and_the_figure_says_so():
    """A long enough match won outright: the copied chain is the whole tree; the title says the
    drafter was skipped and the subtitle opens with the match length and the threshold, read
    from the event's fields (not its label)."""
    source = "SAM context (n=7 ≥ 4: replaces the drafter's draft)"
    draft = Draft(1, source, (11, 12, 13), (-1, 0, 1), (1.0,) * 3, (0, 1, 2), match=7, override=4)
    verdict = [
        Verify(1, (0, 1), 22, "greedy-tree"),
        Commit(1, (11, 12, 22), ("draft", "draft", "correction"), (0.9,) * 3),
    ]
    fig = token_tree([*BRANCHING[:3], draft, *verdict], TEXTS, 1, 1000)
    title = fig.layout.title.text.replace("<br>", " ")
    subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert title == "Step 1: the copied chain is the whole tree (the drafter skipped)"
    assert subtitle.startswith("SAM context match 7 ≥ 4: the copy replaces the drafter's draft; ")
    assert subtitle.endswith("3 nodes, accepted 2, +1 correction; 2 of 3 copied tokens accepted")
    outlined = [a.text for a in fig.layout.annotations if a.bordercolor == "#8e24aa"]
    assert outlined == [" f", "(x", "):"]  # every node is a copied one
    # The same chain grafted beside a drafter's tree (its match below the threshold): the title
    # names the drafter, and nothing claims an override.
    grafted = Draft(1, "eagle + SAM context (n=3, 1 new nodes)", *tree_of(draft), (2,), match=3)
    fig = token_tree([*BRANCHING[:3], grafted, *verdict], TEXTS, 1, 1000)
    assert fig.layout.title.text.replace("<br>", " ") == "Step 1: token tree from eagle"
    assert "≥" not in fig.layout.title.subtitle.text
    # A trace from before the fields were recorded: its copied-alone step still reads as one.
    old = Draft(
        1, "prompt lookup (n=3, trusted: drafter skipped)", *tree_of(draft), copied=(0, 1, 2)
    )
    subtitle = token_tree([*BRANCHING[:3], old, *verdict], TEXTS, 1, 1000).layout.title.subtitle
    assert "the copied chain alone (the drafter skipped): 2 of 3 accepted" in subtitle.text.replace(
        "<br>", " "
    )
