"""The views' data, before any drawing: the token tree, the Jacobi trajectory, prompt lookup's copy
source, the Medusa heads grid, the speed lab's theory figure, the early-exit heatmap and the
attention mask, each built from a tiny hand-made trace (no model, no Plotly)."""

import pytest

from decoders.core.events import (
    AttentionMask,
    Commit,
    CopySource,
    Draft,
    HeadProposals,
    JacobiIteration,
    LayerExit,
    Prefill,
    Verify,
)
from decoders.core.prices import PriceTable
from visualizer.cells import JACOBI_STATUS, MASK_BRANCH
from visualizer.exit_data import exit_map
from visualizer.jacobi_view import jacobi_grid
from visualizer.mask_view import mask_grid
from visualizer.medusa_view import heads_data
from visualizer.prompt_lookup_view import copy_view
from visualizer.speed_lab import speed_lab_data
from visualizer.tree_data import tree_data

TEXTS = {1: "<s>", 5: "a", 6: "b", 7: "c", 10: "def", 11: " f", 12: "(x", 13: "):", 20: " g"}
TEXTS |= {21: "[", 22: "x)"}

JACOBI = {name: i for i, name in enumerate(JACOBI_STATUS)}
MASK = {name: i for i, name in enumerate(MASK_BRANCH)}

# --- token tree -----------------------------------------------------------------------------------

# Step 1: node 0 (" f") and its child 2 ("(x") accepted, node 1 (" g") lost against " f", node 3
# hangs under the rejected node 1 (never checked); the target corrected after "(x" with "x)".
TREE = [
    Prefill((1,)),
    Commit(0, (10,), ("target",), (0.9,)),
    Draft(1, "medusa", (11, 20, 12, 21), (-1, -1, 0, 1), (0.9, 0.05, 0.6, 0.3)),
    Verify(1, (0, 2), 22, "greedy-tree", (0.85, 0.1, 0.7, 0.2)),
    Commit(1, (11, 12, 22), ("draft", "draft", "correction"), (0.85, 0.7, 0.6)),
]


def test_tree_data_gives_each_node_its_verdict_and_the_path():
    data = tree_data(TREE, 1)
    assert not isinstance(data, str)
    assert [(r.index, r.token, r.status) for r in data.nodes] == [
        (-1, 10, "root"),
        (0, 11, "accepted"),
        (1, 20, "rejected"),
        (2, 12, "accepted"),
        (3, 21, "not checked"),
        (4, 22, "correction"),  # the target's own token after the path
    ]
    assert data.nodes[0].target_p == "0.900" and data.nodes[-1].target_p == "0.600"
    assert data.parents == (-1, -1, 0, 1, 2)
    assert data.path == (0, 1, 3, 5) and data.accepted == (0, 2)
    assert (data.n, data.drawn, data.extra, data.committed) == (4, 4, True, 3)
    assert data.copied == frozenset() and data.won == ""


def test_tree_data_says_why_there_is_no_tree():
    assert tree_data(TREE, 0) == "no tree at step 0: a plain target step"
    assert "not been verified" in tree_data(TREE[:3], 1)
    bad = [*TREE[:2], Draft(1, "medusa", (11, 20), (-1, 1), (0.9, 0.1)), *TREE[3:]]
    assert tree_data(bad, 1).startswith("malformed draft tree")


# --- Jacobi ---------------------------------------------------------------------------------------

# Step 1: a block of three guesses from output position 1; the first converged, the second was
# wrong (the target committed " g" there instead).
JACOBI_TRACE = [
    Prefill((1,)),
    Commit(0, (10,), ("target",), (0.9,)),
    JacobiIteration(1, 1, (11, 12, 13), (True, True, True), start=1),
    Verify(1, (0,), 20, "jacobi"),
    Commit(1, (11, 20), ("draft", "correction"), (0.9, 0.8)),
]


def test_jacobi_grid_has_a_cell_per_position_and_the_converged_boundary():
    grid = jacobi_grid(JACOBI_TRACE, TEXTS, 1)
    assert grid is not None and (grid.lo, grid.hi) == (0, 4)
    code = JACOBI
    assert grid.z == [[code["fixed"], code["converged"], code["wrong"], code["changed"]]]
    assert grid.rows == [1.0] and grid.ticks == ["1 (+2)"]
    assert grid.boundary_x == [1.5, 1.5, None] and grid.boundary_y == [0.5, 1.5, None]
    assert (grid.iterations, grid.skipped, grid.last_accepted, grid.fixed) == (1, 0, 1, 3)
    assert "first wrong guess" in grid.hover[0][2] and "' g'" in grid.hover[0][2]
    assert jacobi_grid(JACOBI_TRACE, TEXTS, 0) is None  # the prefill: no iteration yet


# --- prompt lookup --------------------------------------------------------------------------------

# The prompt ends in "a b", which occurs at its start too: the two tokens after it were copied and
# the target accepted the first.
COPY = [
    Prefill((5, 6, 7, 5, 6)),
    CopySource(1, 0, 2, 5),
    Draft(1, "prompt_lookup", (7, 5), (-1, 0), (1.0, 1.0)),
    Verify(1, (0,), 6, "greedy"),
    Commit(1, (7, 6), ("draft", "correction"), (0.9, 0.8)),
]


def test_copy_view_marks_the_match_the_suffix_and_the_copy():
    view = copy_view(COPY, TEXTS, 1)
    assert not isinstance(view, str)
    assert [tok.role for tok in view.tokens] == ["match", "match", "accepted", "rejected", "suffix"]
    assert [(tok.line, tok.col, tok.text) for tok in view.tokens[:2]] == [(0, 0, "a"), (0, 1, "b")]
    assert (view.start, view.n, view.copied, view.accepted) == (0, 2, 2, 1)
    assert (view.lines, view.gaps, view.prompt_len, view.chat_template) == (1, (), 5, False)


def test_copy_view_says_why_there_is_no_copy():
    assert copy_view(COPY, TEXTS, 2) == "no earlier match at this step: a plain target step"
    moved = [COPY[0], CopySource(1, 0, 2, 6), *COPY[2:]]
    assert copy_view(moved, TEXTS, 1) == "the recorded copy source does not match this context"


# --- Medusa ---------------------------------------------------------------------------------------


def test_heads_data_places_the_trees_nodes_and_the_targets_token():
    proposals = HeadProposals(1, 1, ((11, 20), (12, 21)), ((0.6, 0.3), (0.5, 0.25)))
    draft = Draft(1, "medusa", (11, 20, 12), (-1, -1, 0), (0.6, 0.3, 0.5))
    verify = Verify(1, (0,), 21, "greedy-tree")
    commit = Commit(1, (11, 21), ("draft", "correction"), (0.6, 0.5))
    data = heads_data(proposals, draft, verify, commit)
    assert data is not None
    assert data.status == {(0, 0): "accepted", (0, 1): "rejected", (1, 0): "rejected"}
    assert data.accepted == 1 and data.target == (1, 1, "correction")
    assert data.cells == [(0, 0), (0, 1), (1, 0), (1, 1)]
    broken = HeadProposals(1, 1, ((11, 20),), ((0.6,),))  # a token without its probability
    assert heads_data(broken, draft, verify, commit) is None


# --- the speed lab --------------------------------------------------------------------------------


def test_speed_lab_data_keeps_the_runs_it_can_place():
    rows = [
        {"method": "a", "tokens_per_target_forward": 2.0, "speedup": 1.5},
        {"method": "b", "tokens_per_target_forward": None, "speedup": 3.0},  # no point
        {"method": "c", "tokens_per_target_forward": 1.0, "speedup": 0.9, "lossy": True},
    ]
    data = speed_lab_data(PriceTable.linear("m", 0.0), 0.5, 4, 0.0, rows)
    assert [(lossy, [r["method"] for r in group]) for lossy, group in data.runs] == [
        (False, ["a"]),
        (True, ["c"]),
    ]
    assert data.curve[-1] == pytest.approx((5.0, 5.0))  # every draft accepted, all free: 5x
    assert data.x_top == pytest.approx(5.4) and data.y_high == pytest.approx(5.0)
    assert data.synthetic_curve is None  # no synthetic runs


# --- early exit -----------------------------------------------------------------------------------

EXITS = [
    Prefill((1,)),
    Commit(0, (10,), ("target",), (0.9,)),
    LayerExit(1, 1, 2, 4, (1, 2), (0.4, 0.95), 0.9, "confidence"),
    Commit(1, (11,), ("target",), (0.95,)),
    LayerExit(2, 2, 4, 4, (1, 2, 3), (0.1, 0.2, 0.3), 0.9, "confidence"),
    Commit(2, (12,), ("target",), (0.5,)),
]


def test_exit_map_has_a_row_per_exit_and_a_column_per_token():
    m = exit_map(EXITS, TEXTS, 2)
    assert m is not None and m.now is not None and m.now.position == 2
    assert m.rows == [1, 2, 3, 4] and m.y == ["ℓ 1", "ℓ 2", "ℓ 3", "4 (full)"]
    assert m.z == [[0.4, 0.1], [0.95, 0.2], [None, 0.3], [None, None]]
    assert "left here" in m.hover[1][0] and m.outputs == [10, 11, 12]
    assert (m.exits, m.early, m.depth, m.oracle) == (2, 1, 0.75, False)
    assert exit_map(EXITS[:2], TEXTS, 1) is None  # no layer exits


# --- the attention mask ---------------------------------------------------------------------------


def test_mask_grid_colours_visible_cells_by_the_querys_branch():
    mask = AttentionMask(
        3,
        ("x", "look L0·0", "look L1·0", "verify n0·d0"),
        ((0,), (0, 1), (0, 1, 2), (0, 3)),
        input_ids=(10, 11, 12, 13),
        branches=("x", "lookahead", "lookahead", "verify"),
    )
    grid = mask_grid([mask], TEXTS, 3)
    assert grid is not None
    masked, x, look, verify = MASK["masked"], MASK["x"], MASK["lookahead"], MASK["verify"]
    assert grid.z == [
        [x, masked, masked, masked],
        [look, look, masked, masked],
        [look, look, look, masked],
        [verify, masked, masked, verify],
    ]
    assert grid.separators == [(1, "branch"), (2, "level"), (3, "branch")]
    assert grid.names[0] == "x def" and "masked" in grid.hover[0][1]
    assert mask_grid([mask], TEXTS, 2) is None
    space = AttentionMask(
        2, ("x", "m0"), ((0,), (0, 1)), input_ids=(10, 99), branches=("x", "mask")
    )
    assert mask_grid([space], TEXTS, 2).ids == [10, None]  # a mask input has no token
