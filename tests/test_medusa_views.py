"""Medusa and blockwise without fitted heads: the paper's tree and how it is built, the parameters'
errors, the embedded model lossless, the heads' proposals in a trace, and the views (the heads
grid, blockwise's chain) on synthetic steps.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from test_medusa import check_steps
from test_prompt_lookup import humaneval
from test_speculative import (
    one_torch_thread,  # noqa: F401  (autouse: torch runs on one thread here)
)

from conftest import PROMPTS, Run, assert_greedy, greedy
from decoders import METHODS, InvalidParameter, generate, load_model, stream
from decoders.core.errors import TraceError
from decoders.core.events import Commit, Draft, Forward, HeadProposals, Prefill, Verify, token_ids
from decoders.core.tracefile import event_from_dict
from decoders.methods.medusa import PAPER_PATHS, build_tree, tree_paths
from decoders.trained.medusa_heads import Proposal, load_heads
from visualizer.medusa_view import BAR_COLOUR, CELL_STYLE, blockwise_chain, cell_chars, heads_grid
from visualizer.tokens import COLOURS

# --- the tree -----------------------------------------------------------------------------------------


def test_the_paper_tree_is_medusas_63_paths_and_every_prefix_is_a_tree():
    assert len(PAPER_PATHS) == len(set(PAPER_PATHS)) == 63
    assert max(map(len, PAPER_PATHS)) == 4 and max(max(p) for p in PAPER_PATHS) == 9
    assert PAPER_PATHS[:6] == ((0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0))
    for n in range(1, 64):  # the first n paths name their parents before themselves
        seen = set(PAPER_PATHS[:n])
        assert all(len(p) == 1 or p[:-1] in seen for p in seen)
    base = {"nodes": 63, "top_k": 10, "choices": ""}
    assert tree_paths(base, 4) == sorted(PAPER_PATHS, key=lambda p: (len(p), p))
    assert len(tree_paths({**base, "nodes": 24}, 4)) == 24
    # Cut at the heads' depth, and at top_k: a dropped rank takes its subtree with it.
    assert all(len(p) <= 2 for p in tree_paths(base, 2)) and len(tree_paths(base, 2)) == 10 + 28
    assert tree_paths({**base, "top_k": 1}, 4) == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
    two = tree_paths({**base, "top_k": 2}, 3)
    assert two == [
        *((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)),
        *((0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)),
    ]
    custom = tree_paths({**base, "choices": "1 0 0.2 0.2.0"}, 3)
    assert custom == [(0,), (1,), (0, 2), (0, 2, 0)]


def test_build_tree_takes_each_nodes_token_from_its_depths_head():
    heads = ((10, 11, 12), (20, 21, 22), (30, 31, 32))
    probs = ((0.5, 0.2, 0.1), (0.4, 0.3, 0.2), (0.6, 0.1, 0.05))
    proposal = Proposal(heads, probs, Forward(1, "draft", 1, 0, 0.1))
    paths = [(0,), (1,), (0, 0), (0, 2), (1, 0), (0, 2, 1)]
    tokens, parents, node_probs = build_tree(paths, proposal)
    assert tokens == [10, 11, 20, 22, 20, 31]
    assert parents == [-1, -1, 0, 0, 1, 3]
    assert node_probs == [0.5, 0.2, 0.4, 0.2, 0.4, 0.1]


# --- parameters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("medusa", {"nodes": 0}, r"nodes.*\[1, 63\]"),
        ("medusa", {"nodes": 64}, r"nodes.*\[1, 63\]"),
        ("medusa", {"top_k": 0}, r"top_k.*\[1, 16\]"),
        ("medusa", {"top_k": 17}, r"top_k.*\[1, 16\]"),
        ("medusa", {"choices": "0.0"}, "needs its parent"),
        ("medusa", {"choices": "0 x"}, "dot-separated"),
        ("medusa", {"choices": "0 3", "top_k": 3}, r"rank 3 needs top_k ≥ 4"),
        ("blockwise", {"k": 0}, r"k.*\[1, 10\]"),
        ("blockwise", {"k": 11}, r"k.*\[1, 10\]"),
        ("blockwise", {"gamma": 3}, "unknown parameter 'gamma'"),
    ],
)
def test_invalid_parameters_are_clear_errors(tiny, method, params, message):
    with pytest.raises(InvalidParameter, match=message):
        stream(tiny, PROMPTS[0], method, 8, **params)


def test_more_heads_than_shipped_is_a_clear_error(tiny):
    n = load_heads(tiny).n_heads
    with pytest.raises(
        InvalidParameter, match=rf"ships {n} Medusa heads, so k must be in 1\.\.{n}"
    ):
        stream(tiny, PROMPTS[0], "blockwise", 8, k=n + 1)
    deep = " ".join(".".join("0" * d) for d in range(1, n + 2))  # "0 0.0 0.0.0 ..."
    with pytest.raises(InvalidParameter, match=rf"needs {n + 1} heads; {n} are shipped"):
        stream(tiny, PROMPTS[0], "medusa", 8, choices=deep)


@pytest.mark.parametrize("method", ["medusa", "blockwise"])
def test_a_model_without_heads_is_told_how_to_train_them(method):
    other = load_model("tiny-random-2")
    with pytest.raises(InvalidParameter, match=r"no trained Medusa heads for tiny-random-2.*train"):
        stream(other, PROMPTS[0], method, 8)
    # (Autoregressive sampling's own draws are tested once, where they live: test_autoregressive.)


# --- the embedded model ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("method", "params"), [("medusa", {})])  # blockwise: test_lossless
def test_lossless_on_the_embedded_model(embedded, method, params):
    prompt = humaneval(0)
    res = generate(embedded, prompt, method, 48, chat=True, **params)
    ref = greedy(embedded, prompt, 48, True)
    assert_greedy(embedded, res, ref.token_ids)
    result = Run(res.token_ids, res.finish_reason, res.stats, res.events)
    check_steps(result, method, params, 48, load_heads(embedded).n_heads, embedded.n_layers)
    assert res.stats["verify_steps"] > 0


# --- trace events -------------------------------------------------------------------------------------


def test_head_proposals_round_trip_and_name_their_tokens():
    e = HeadProposals(3, 7, ((5, 6), (7, 8)), ((0.5, 0.25), (0.125, 0.0625)))
    assert event_from_dict(json.loads(json.dumps(e.to_dict()))) == e
    assert token_ids(e) == [5, 6, 7, 8]
    with pytest.raises(TraceError, match=r"HeadProposals.heads\[0\]"):
        event_from_dict({**e.to_dict(), "heads": [5, 6]})


# --- views --------------------------------------------------------------------------------------------

TEXTS = {1: "<s>", 9: "x", 10: "def", 11: " f", 12: "(x", 13: "):", 14: "\n", 20: " g", 21: "["}
TEXTS |= {22: "x)", 23: "y", 30: "<tag>", 31: "z"}

# Step 1 of a medusa run: head 1 guessed (11, 20, 30), head 2 (12, 21, 23). Tree: 11 -> {12, 21},
# 20 -> {12}. The target took 11 then 12 (accepted), then its own 22 (a bonus: 12 is a leaf).
# Step 2: head 1 guessed (13, 14, 31); tree 13, 14; nothing accepted; the target's 31 was head
# 1's rank 3, outside the tree (top_k 3, but only ranks 0-1 used).
MEDUSA = [
    Prefill((1, 9)),
    Forward(0, "prefill", 2, 4, 5.0),
    Commit(0, (10,), ("target",), (0.9,)),
    Forward(1, "draft", 1, 0, 0.2),
    HeadProposals(1, 1, ((11, 20, 30), (12, 21, 23)), ((0.6, 0.3, 0.1), (0.5, 0.25, 0.05))),
    Draft(1, "medusa", (11, 20, 12, 21, 12), (-1, -1, 0, 0, 1), (0.6, 0.3, 0.5, 0.25, 0.5)),
    Forward(1, "verify", 6, 4, 6.0),
    Verify(1, (0, 2), 22, "greedy-tree", (0.7, 0.1, 0.8, 0.1, 0.2)),
    Commit(1, (11, 12, 22), ("draft", "draft", "bonus"), (0.7, 0.8, 0.6)),
    Forward(2, "draft", 1, 0, 0.2),
    HeadProposals(2, 4, ((13, 14, 31),), ((0.4, 0.35, 0.2),)),
    Draft(2, "medusa", (13, 14), (-1, -1), (0.4, 0.35)),
    Forward(2, "verify", 3, 4, 6.0),
    Verify(2, (), 31, "greedy-tree", (0.1, 0.2)),
    Commit(2, (31,), ("correction",), (0.5,)),
]


def cells(fig: go.Figure) -> dict[tuple[int, int], str]:
    (trace,) = [t for t in fig.data if t.name == "cells"]
    return {(r, k): s for r, k, s in trace.customdata}


def label(fig: go.Figure, r: int, k: int) -> str:
    (a,) = [a for a in fig.layout.annotations if a.name == f"cell {r} {k}"]
    return a.text


def test_heads_grid_colours_each_cell_by_the_trees_verdict():
    fig = heads_grid(MEDUSA, TEXTS, 1)
    assert cells(fig) == {
        (0, 0): "accepted",  # 11
        (0, 1): "rejected",  # 20: compared with the target's 11 and lost
        (0, 2): "unused",  # 30: not in the draft
        (1, 0): "accepted",  # 12: accepted under 11 (the 12 under the rejected 20 shares it)
        (1, 1): "rejected",  # 21: compared with 12 under 11 and lost
        (1, 2): "unused",
    }
    rects = [s for s in fig.layout.shapes if s.fillcolor != BAR_COLOUR]
    fills = {round(s.x0 + 0.46): s.fillcolor for s in rects if s.y0 == 1 - 0.42}
    assert fills == {1: COLOURS["draft"], 2: COLOURS["rejected"], 3: "#ffffff"}
    # One probability bar per cell, as wide as the head's probability.
    bars = [round(s.x1 - s.x0, 4) for s in fig.layout.shapes if s.fillcolor == BAR_COLOUR]
    assert sorted(bars) == sorted(round(0.92 * p, 4) for row in MEDUSA[4].probs for p in row)
    assert label(fig, 0, 2) == "&lt;tag&gt;"  # escaped
    legend = [t.name for t in fig.data if t.showlegend is not False and t.name != "cells"]
    assert legend == [CELL_STYLE[s][1] for s in ("accepted", "rejected", "unused")]
    assert "2 accepted" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "'def'" in fig.layout.title.subtitle.text  # the root: the last token before step 1


def test_heads_grid_outlines_the_targets_token_where_a_head_had_it():
    fig = heads_grid(MEDUSA, TEXTS, 2)
    assert cells(fig) == {(0, 0): "rejected", (0, 1): "rejected", (0, 2): "unused"}
    (outline,) = [s for s in fig.layout.shapes if s.name == "target's token"]
    assert (outline.x0, outline.x1) == (2.5, 3.5) and outline.line.color == "#ef6c00"
    hover = next(t for t in fig.data if t.name == "cells").hovertext[2]
    assert "the target's token here (corrected by target)" in hover and "rank 3" in hover
    assert any("the target's token" in (t.name or "") for t in fig.data)


def test_heads_grid_without_guesses_says_why():
    assert "prefill" in heads_grid(MEDUSA, TEXTS, 0).layout.annotations[0].text
    assert "plain target step" in heads_grid(MEDUSA, TEXTS, 3).layout.annotations[0].text
    old = [e for e in MEDUSA if not isinstance(e, HeadProposals)]
    assert "no head detail" in heads_grid(old, TEXTS, 1).layout.annotations[0].text
    broken = [*MEDUSA[:4], HeadProposals(1, 1, ((11, 20),), ((0.6,),)), *MEDUSA[5:]]
    assert "malformed" in heads_grid(broken, TEXTS, 1).layout.annotations[0].text


def test_heads_grid_is_bounded_and_fits_a_phone():
    big = HeadProposals(1, 1, ((5,) * 40,) * 40, ((0.01,) * 40,) * 40)
    events = [*MEDUSA[:4], big]
    fig = heads_grid(events, TEXTS, 1)
    assert len(cells(fig)) == 16 * 16 and fig.layout.height <= 920
    assert cell_chars(16) == 2 and cell_chars(10) == 3 and cell_chars(1) == 10


BLOCK = [
    Prefill((1, 9)),
    Forward(0, "prefill", 2, 4, 5.0),
    Commit(0, (10,), ("target",), (0.9,)),
    Forward(1, "draft", 1, 0, 0.2),
    HeadProposals(1, 1, ((11,), (12,), (21,)), ((0.6,), (0.5,), (0.3,))),
    Draft(1, "blockwise", (11, 12, 21), (-1, 0, 1), (0.6, 0.5, 0.3)),
    Forward(1, "verify", 4, 4, 6.0),
    Verify(1, (0,), 22, "greedy-chain", (0.7, 0.1, 0.3)),
    Commit(1, (11, 22), ("draft", "correction"), (0.7, 0.6)),
]


def test_blockwise_chain_colours_the_block_and_shows_each_heads_probability():
    fig = blockwise_chain(BLOCK, TEXTS, 1)
    heads = next(t for t in fig.data if t.name == "heads")
    assert list(heads.marker.color) == [COLOURS["draft"], COLOURS["rejected"], COLOURS["pending"]]
    assert list(next(t for t in fig.data if t.name == "head p").text) == ["0.60", "0.50", "0.30"]
    target = next(t for t in fig.data if t.name == "target")
    assert list(target.marker.color) == [COLOURS["draft"], COLOURS["correction"]]
    assert "head 2's top token" in heads.hovertext[1] and "target p = 0.100" in heads.hovertext[1]
    assert "accepted 1 of 3, +1 correction" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "prefill" in blockwise_chain(BLOCK, TEXTS, 0).layout.annotations[0].text
    assert "plain target step" in blockwise_chain(BLOCK, TEXTS, 2).layout.annotations[0].text
    # Its extra view is the grid, where each head's single guess sits in the block's colours.
    assert cells(heads_grid(BLOCK, TEXTS, 1)) == {
        (0, 0): "accepted",
        (1, 0): "rejected",
        (2, 0): "not checked",
    }


def test_the_methods_have_their_panels():
    assert (
        METHODS["medusa"].views[0] == "heads_grid"
        and METHODS["blockwise"].views[0] == "blockwise_chain"
    )
    assert METHODS["medusa"].views[1:] == ("token_tree",)
    assert METHODS["blockwise"].views[1:] == ("heads_grid",)


def test_head_labels_hold_more_of_the_token_on_a_wide_page():
    assert cell_chars(10, 900) > cell_chars(10) == 3
    assert cell_chars(10, 900) == 10


def test_the_block_view_counts_a_copied_chain_apart_from_the_blocks_tree():
    """block_draft's default: a tree from the block's cells plus a chain copied by prompt lookup.
    The copies have no cell and no forward, so the subtitle counts them apart, and the chain
    drafter's price is for the block's own depth (2), not the copy's."""
    from decoders.core.events import BlockFill
    from visualizer.block_view import block_fill

    events = [
        *BLOCK[:3],
        Forward(1, "draft", 3, 1, 0.2),
        BlockFill(1, 1, ((11, 12, 13, 14), (21, 22, 23, 31)), ((0.5, 0.2, 0.1, 0.05),) * 2),
        Draft(1, "block", (11, 12, 21, 30, 31, 14), (-1, -1, 0, -1, 3, 4), (0.5,) * 6, (3, 4, 5)),
        Forward(1, "verify", 7, 4, 6.0),
        Verify(1, (3, 4), 22, "greedy-tree", (0.1,) * 6),
        Commit(1, (30, 31, 22), ("draft", "draft", "correction"), (0.9, 0.8, 0.6)),
    ]
    fig = block_fill(events, TEXTS, 1)
    said = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "1 drafter forward over 3 inputs" in said
    assert "a tree of 3 nodes from these cells, 2 deep" in said
    assert "3 tokens copied by prompt lookup" in said and "2 of the 2 accepted" in said
    assert "pays 2 forwards" in said
    # The copy's token 31 is also the block's position 2, rank 4: that cell shows its verdict.
    assert {cell: st for cell, st in cells(fig).items() if st != "unused"} == {
        (0, 0): "rejected",
        (0, 1): "rejected",
        (1, 0): "not checked",
        (1, 3): "accepted",
    }
