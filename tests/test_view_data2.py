"""The views' data, before any drawing: Lookahead's grids, the draft panel's rows, SPACE's relay,
Token Recycling's adjacency rows, the speedup bars and Kangaroo's layer diagram, each built from
a tiny hand-made trace (no model, no Plotly)."""

from decoders.core.events import (
    Commit,
    Draft,
    Forward,
    LookaheadWindow,
    MaskGroups,
    NgramPool,
    Prefill,
    Recycled,
    Verify,
)
from visualizer.cells import CANDIDATE_STATUS, WINDOW_STATUS
from visualizer.compare_views import DIFFERS_COLOUR, IDENTICAL_COLOUR, LOSSY_COLOUR, speedup_bars
from visualizer.draft_data import draft_rows
from visualizer.kangaroo_view import SHARED, layer_diagram
from visualizer.lookahead_data import candidate_grid, history_grid, window_grid
from visualizer.retrieval_view import adjacency_grid
from visualizer.space_view import RELAY_STATUS, relay_grid
from visualizer.tokens import COLOURS

TEXTS = {1: "<s>", 10: "def", 11: " f", 12: "(x", 13: "):", 14: "\n", 15: " return", 16: "<b>"}
TEXTS |= {17: " x", 20: " g", 21: "[", 22: "x)", 30: "longtoken", 9: ";"}

WINDOW = {name: i for i, name in enumerate(WINDOW_STATUS)}
CANDIDATE = {name: i for i, name in enumerate(CANDIDATE_STATUS)}
RELAY = {name: i for i, name in enumerate(RELAY_STATUS)}

# --- Lookahead ------------------------------------------------------------------------------------

# N = 3, W = 3 at step 2: columns 0 and 2 add their n-grams to the pool, column 1's was there.
WINDOW_TRACE = [
    Prefill((1, 10)),
    Commit(0, (10,), ("target",), (0.9,)),
    Commit(1, (11,), ("target",), (0.9,)),
    LookaheadWindow(2, ((10, 11, 12), (13, 14, 15)), (16, 17, 9)),
    NgramPool(2, ((10, 13, 16), (12, 15, 9)), 0, 9, ()),
    Commit(2, (12,), ("target",), (0.9,)),
]


def test_window_grid_rows_are_levels_then_the_new_guesses():
    grid = window_grid(WINDOW_TRACE, TEXTS, 2)
    assert grid is not None and (grid.n_levels, grid.width) == (2, 3)
    hist, guess = WINDOW["history"], WINDOW["guess"]
    assert grid.cells.z == [[hist] * 3, [hist] * 3, [guess] * 3]
    assert grid.cells.text[2] == ["&lt;b&gt;", " x", ";"]
    assert grid.added == (True, False, True)
    assert grid.x_text == "' f'" and grid.note == "column i + its new guess is an n-gram"
    assert "added to the pool this step" in grid.cells.hover[0][0]
    assert window_grid(WINDOW_TRACE, TEXTS, 1) is None  # no window at this step


def test_history_grid_lines_up_one_column_per_step():
    trace = [
        Prefill((1, 10)),
        Commit(0, (10,), ("target",), (0.9,)),
        LookaheadWindow(1, ((21,),), (13,)),
        NgramPool(1, (), 0, 4, (), n=3),
        Commit(1, (11,), ("target",), (0.9,)),
        LookaheadWindow(2, ((21,), (13,)), (14,)),
        NgramPool(2, ((21, 13, 14),), 0, 5, (), n=3),
        Commit(2, (12,), ("target",), (0.9,)),
    ]
    grid = history_grid(trace, TEXTS, 2)
    assert grid is not None
    assert grid.steps == (1, 2) and grid.depth == 2 and grid.added_steps == (2,)
    assert grid.levels == 2 and grid.n == 3
    hist, guess = WINDOW["history"], WINDOW["guess"]
    assert grid.cells.z == [[hist, hist], [None, hist], [guess, guess]]
    assert grid.cells.text[2][0] == grid.cells.text[1][1] == "):"  # a guess climbs a level
    assert history_grid(trace, TEXTS, 0) is None


def test_candidate_grid_one_trie_path_per_row():
    trace = [
        Prefill((1,)),
        Commit(4, (10,), ("target",), (0.9,)),
        Draft(5, "n-gram pool (2 candidates)", (11, 12, 21, 22), (-1, 0, -1, 2), (1.0,) * 4),
        NgramPool(5, (), 2, 9, ()),
        Verify(5, (0,), 17, "greedy-tree", ()),
        Commit(5, (11, 17), ("draft", "correction"), (0.9, 0.8)),
    ]
    grid = candidate_grid(trace, TEXTS, 5)
    assert grid is not None and (grid.depth, grid.accepted, grid.hits) == (2, 1, 2)
    root, acc, rej, unchecked = (
        CANDIDATE[k] for k in ("root", "accepted", "rejected", "not checked")
    )
    assert grid.cells.z == [[root, acc, rej], [root, rej, unchecked]]
    assert grid.cells.text[1] == ["x def", "[", "x)"]
    assert grid.x_text == "'def'"
    assert candidate_grid(trace, TEXTS, 4) is None  # no pool at this step


# --- the draft panel ------------------------------------------------------------------------------


def test_draft_rows_verdicts_and_the_relaxed_rules_own_choice():
    trace = [
        Prefill((1,)),
        Commit(0, (10,), ("target",), (0.9,)),
        Draft(1, "self:8", (11, 12, 13), (-1, 0, 1), (0.9, 0.7, 0.4)),
        Verify(1, (0, 1), 14, "top-beta", relaxed=(1,), preferred=(15,)),
        Commit(1, (11, 12, 14), ("draft", "relaxed", "correction"), (0.9, 0.8, 0.7)),
    ]
    rows = draft_rows(trace, TEXTS, 1)
    assert rows is not None and (rows.accepted, rows.relaxed, rows.width) == (2, 1, 3)
    assert rows.draft.colours == (COLOURS["draft"], COLOURS["relaxed"], COLOURS["rejected"])
    assert rows.target.tokens == (11, 12, 14)
    assert rows.own is not None and rows.own.tokens == (15,) and rows.own.positions == (2,)
    assert "relaxed rule took the draft's '(x'" in rows.own.hover[0]
    assert draft_rows(trace, TEXTS, 0) is None  # no draft at the prefill


# --- SPACE's relay --------------------------------------------------------------------------------


def test_relay_grid_staircase_and_the_group_handed_on():
    trace = [
        Prefill((1, 10)),
        Commit(0, (11,), ("target",), (0.9,)),
        MaskGroups(1, 1, (12, 13), ((15, 16), (16, 17), (9, 30)), ((0.5, 0.4),) * 3, 1),
        Verify(1, (0,), 20, "greedy-chain"),
        Commit(1, (12, 20), ("draft", "correction"), (0.9, 0.7)),
    ]
    grid = relay_grid(trace, TEXTS, 1)
    assert grid is not None
    assert grid.y_labels == ["guesses", "committed", "after x", "after c1", "after c2"]
    assert grid.width == 2 + 1 + 2 and (grid.accepted, grid.verified, grid.handed) == (1, 2, 1)
    assert grid.z[0][:2] == [RELAY["accepted"], RELAY["rejected"]]
    assert grid.z[1][:2] == [RELAY["accepted"], RELAY["target"]]
    assert grid.z[3] == [None, None, RELAY["handed"], RELAY["handed"], None]  # group 1, after c1
    assert "p = 0.50" in grid.hover[3][2]
    assert relay_grid(trace, TEXTS, 0) is None


# --- Token Recycling's adjacency rows -------------------------------------------------------------


def test_adjacency_grid_marks_the_cells_the_draft_read():
    trace = [
        Prefill((1, 10)),
        Commit(0, (10,), ("target",), (0.9,)),
        Recycled(1, ((10, 11, 12), (11, 12, 14)), (True, False), warm=True),
        Draft(1, "recycling", (11, 12, 14), (-1, 0, 0), (1.0,) * 3),
        Verify(1, (0,), 20, "greedy-tree"),
        Commit(1, (11, 20), ("draft", "correction"), (0.9, 0.8)),
    ]
    grid = adjacency_grid(trace, 1)
    assert grid is not None and grid.rows == [[10, 11, 12], [11, 12, 14]]
    assert grid.status == [["accepted", "unused"], ["rejected", "rejected"]]
    assert grid.fresh == [True, False] and grid.warm
    assert (grid.drafted, grid.accepted) == (3, 1)
    assert adjacency_grid(trace, 0) is None


# --- Compare's speedup bars -----------------------------------------------------------------------


def test_speedup_bars_colour_each_row_by_its_verdict():
    def row(method, speedup, identical, lossy=False, **more):
        base = {"method": method, "speedup": speedup, "tokens_per_target_forward": 1.5}
        return base | {"identical": identical, "lossy": lossy, **more}

    bars = speedup_bars(
        [
            row("autoregressive", 1.0, True),
            row("jacobi", 0.9, False, modelled_speedup=1.1),
            row("calm:lambda=0.9", 1.4, True, lossy=True),
        ]
    )
    assert bars.colours == [IDENTICAL_COLOUR, DIFFERS_COLOUR, LOSSY_COLOUR]
    assert bars.speedups == [1.0, 0.9, 1.4] and bars.per_forward == [1.5] * 3
    assert bars.modelled == [None, 1.1, None]
    assert "autoregressive</span>" in bars.labels[0] and bars.labels[0].startswith("<span")


# --- Kangaroo's layer diagram ---------------------------------------------------------------------


def test_layer_diagram_rows_bottom_up_with_the_head_between():
    trace = [
        Prefill((1, 2, 3)),
        Forward(0, "prefill", 3, 4, 40.0),
        Commit(0, (5,), ("target",), (0.9,)),
        *(Forward(1, "draft", 1, 3, 4.0, 2, 1) for _ in range(2)),
        Forward(1, "verify", 3, 4, 20.0, 2, 1),
        Commit(1, (6, 7), ("draft", "correction"), (0.5, 0.5)),
    ]
    d = layer_diagram(trace, 1, SHARED)
    assert d is not None and d.shallow_rows == 3 and d.head is SHARED
    assert [r.label for r in d.rows] == [
        "layer 1",
        "layer 2",
        "norm + LM head",
        "layer 3",
        "layer 4",
    ]
    assert [(r.drafting, r.verifying) for r in d.rows] == [(2, 1), (2, 1), (2, 0), (0, 3), (0, 3)]
    assert d.ticks[2] == "norm + LM head" and d.sentences[0].startswith("Drafting: 2 forwards")
    assert layer_diagram(trace, 5) is None  # no forward at this step
