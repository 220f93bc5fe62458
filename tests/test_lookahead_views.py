"""Jacobi and Lookahead figures on hand-written traces (Jacobi's trajectory, the lookahead window),
then on real runs of the tiny model. The n-gram pool and the attention mask:
test_lookahead_views_pool.py."""

import plotly.graph_objects as go

from decoders import generate
from decoders.core.events import (
    AttentionMask,
    Commit,
    Draft,
    JacobiIteration,
    LookaheadWindow,
    NgramPool,
    Prefill,
    Verify,
)
from visualizer.cells import (
    ADDED_LABEL,
    BOUNDARY_COLOUR,
    JACOBI_STATUS,
    MASK_BRANCH,
    MAX_POSITIONS,
    SEPARATOR_COLOUR,
    WINDOW_STATUS,
)
from visualizer.jacobi_view import jacobi_trajectory
from visualizer.lookahead_views import (
    lookahead_panel,
    lookahead_window,
    ngram_pool,
    pool_candidates,
)
from visualizer.mask_view import attention_mask
from visualizer.tokens import COLOURS

TEXTS = {1: "<s>", 10: "def", 11: " f", 12: "(x", 13: "):", 14: "\n", 15: " return", 16: "<b>"}
TEXTS |= {17: " x", 20: " g", 21: "[", 22: "x)", 30: "longtoken", 9: ";"}

JACOBI = {name: i for i, name in enumerate(JACOBI_STATUS)}
WINDOW = {name: i for i, name in enumerate(WINDOW_STATUS)}
MASK = {name: i for i, name in enumerate(MASK_BRANCH)}

# A block of 4. Step 1: nothing converges; the target's outputs after its own token become the
# next guesses: (21, 16, 9, +padding 30). Step 2 compares them with the old guesses for the same
# positions (block 1 shifted by the one committed token: 21, 22, 9): position 0 kept 21, position 1
# changed 22 -> 16, position 2 kept 9, position 3 is new. The target accepts positions 0 and 1.
JACOBI_TRACE = [
    Prefill((1, 10)),
    Commit(0, (11,), ("target",), (0.9,)),
    JacobiIteration(1, 1, (20, 21, 22, 9), (True, True, True, True)),
    Draft(1, "Jacobi guess (block of 4)", (20, 21, 22, 9), (-1, 0, 1, 2), (1.0,) * 4),
    Verify(1, (), 12, "greedy-chain", (0.1, 0.1, 0.1, 0.1)),
    Commit(1, (12,), ("correction",), (0.8,)),
    JacobiIteration(2, 2, (21, 16, 9, 30), (False, True, False, True)),
    Draft(2, "Jacobi guess (block of 4)", (21, 16, 9, 30), (-1, 0, 1, 2), (1.0,) * 4),
    Verify(2, (0, 1), 17, "greedy-chain", (0.9, 0.8, 0.1, 0.1)),
    Commit(2, (21, 16, 17), ("draft", "draft", "correction"), (0.9, 0.8, 0.7)),
]


def heatmap(fig: go.Figure) -> go.Heatmap:
    (h,) = [t for t in fig.data if isinstance(t, go.Heatmap)]
    return h


def colour_of(h: go.Heatmap, code: int) -> str:
    """The colour a stepped colour scale gives integer code `code` (zmin = -0.5)."""
    at = (code - h.zmin) / (h.zmax - h.zmin)
    scale = list(h.colorscale)
    for (lo, colour), (hi, _) in zip(scale[::2], scale[1::2], strict=True):
        if lo <= at <= hi:
            return colour
    raise AssertionError(f"code {code} is outside the colour scale")


def legend(fig: go.Figure) -> list[str]:
    return [t.name for t in fig.data if isinstance(t, go.Scatter) and t.showlegend]


# --- Jacobi ---------------------------------------------------------------------------------------


def test_jacobi_rows_are_iterations_columns_absolute_positions():
    """The figure the CLLM and Lookahead papers draw: each row is the whole sequence the forward
    saw at absolute output positions, the committed prefix (fixed) growing row by row."""
    fig = jacobi_trajectory(JACOBI_TRACE, TEXTS, 2)
    h = heatmap(fig)
    fixed, conv, wrong, changed = (JACOBI[k] for k in ("fixed", "converged", "wrong", "changed"))
    assert list(h.y) == [1, 2]  # one row per iteration
    assert list(h.x) == [0, 1, 2, 3, 4, 5]  # output positions (0 = the first new token)
    # Iteration 1 guessed positions 1-4 after the first token; its first guess was wrong.
    assert list(h.z[0]) == [fixed, wrong, changed, changed, changed, None]
    # Iteration 2 starts one position later (one token was committed) and accepts two guesses.
    assert list(h.z[1]) == [fixed, fixed, conv, conv, wrong, changed]
    assert [list(r) for r in h.text] == [
        [" f", " g", "[", "x)", ";", ""],
        [" f", "(x", "[", "&lt;b&gt;", ";", "longt…"],
    ]
    assert colour_of(h, fixed) == COLOURS["target"]
    assert colour_of(h, conv) == COLOURS["draft"]
    assert colour_of(h, wrong) == COLOURS["rejected"]
    assert colour_of(h, changed) == COLOURS["correction"]
    # The converged guesses end before position 1 in iteration 1, before position 4 in iteration 2.
    (bound,) = [t for t in fig.data if t.name == "end of the converged guesses"]
    assert list(bound.x) == [0.5, 0.5, None, 3.5, 3.5, None]
    assert list(bound.y) == [0.5, 1.5, None, 1.5, 2.5, None]
    assert bound.line.width >= 3
    assert fig.layout.yaxis.autorange == "reversed"
    assert list(fig.layout.yaxis.ticktext) == ["1 (+1)", "2 (+3)"]
    assert fig.layout.xaxis.title.text.startswith("output position")
    assert fig.layout.title.text == "Step 2: Jacobi trajectory"
    assert fig.layout.title.subtitle.text.replace("<br>", " ").startswith(
        "iteration 2: 2 of 4 guesses converged"
    )
    assert "5 tokens fixed" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert legend(fig) == [JACOBI_STATUS[k][1] for k in ("fixed", "converged", "wrong", "changed")]


def test_jacobi_recorded_start_positions_match_the_old_traces_fallback():
    """New traces record each block's absolute start; older ones are placed from the commits."""
    recorded = [
        JacobiIteration(e.step, e.iteration, e.tokens, e.changed, start=e.step)
        if isinstance(e, JacobiIteration)
        else e
        for e in JACOBI_TRACE
    ]
    assert (
        heatmap(jacobi_trajectory(recorded, TEXTS, 2)).z
        == heatmap(jacobi_trajectory(JACOBI_TRACE, TEXTS, 2)).z
    )
    # A recorded start is trusted over the commits (here: shifted by one position).
    shifted = [
        JacobiIteration(e.step, e.iteration, e.tokens, e.changed, start=e.step + 1)
        if isinstance(e, JacobiIteration)
        else e
        for e in JACOBI_TRACE
    ]
    assert list(heatmap(jacobi_trajectory(shifted, TEXTS, 2)).x) == list(range(7))


def test_jacobi_hover_and_escaping():
    h = heatmap(jacobi_trajectory(JACOBI_TRACE, TEXTS, 2))
    assert h.text[1][3] == "&lt;b&gt;"  # token "<b>" must not turn the text bold
    hover = h.customdata[1][3]
    assert "'&lt;b&gt;' · id 16" in hover and "accepted by the target" in hover
    assert "output position 3 · iteration 2" in hover
    assert "<b>" not in hover.replace("<br>", "")
    # The first wrong guess names the target's token committed in its place.
    assert "first wrong guess: the target's own token ' x' · id 17" in h.customdata[1][4]
    assert "committed at step 1" in h.customdata[1][1]  # a fixed cell says when it was fixed
    assert "changed by the previous forward" in h.customdata[1][5]


def test_jacobi_fixed_prefix_grows_row_by_row_and_keeps_the_last_16():
    fig = jacobi_trajectory(JACOBI_TRACE, TEXTS, 1)
    assert list(heatmap(fig).y) == [1]
    long = [Prefill((1,)), Commit(0, (10,), ("target",), (1.0,))]
    for s in range(1, 21):
        long += [
            JacobiIteration(s, s, (11, 12), (True, s % 2 == 0), start=s),
            Verify(s, (), 13, "greedy-chain", ()),
            Commit(s, (13,), ("correction",), (1.0,)),
        ]
    fig = jacobi_trajectory(long, TEXTS, 20)
    h = heatmap(fig)
    assert list(h.y) == list(range(5, 21))
    fixed = [sum(c == JACOBI["fixed"] for c in row) for row in h.z]
    assert fixed == list(range(5, 21))  # iteration s sees the s tokens committed before it
    assert list(h.x) == list(range(22))  # every position up to the last block's end
    assert "last 16 of 20 iterations" in fig.layout.title.subtitle.text.replace("<br>", " ")


def test_jacobi_draws_at_most_the_last_positions_of_a_far_block():
    """A crafted trace (a block at position 10^9 beside one at 0) must not loop over every
    position in between: the view draws the last MAX_POSITIONS."""
    far = [
        Prefill((1,)),
        Commit(0, (10,), ("target",), (1.0,)),
        JacobiIteration(1, 1, (11, 12), (True, True), start=0),
        Commit(1, (11,), ("correction",), (1.0,)),
        JacobiIteration(2, 2, (11, 12), (True, True), start=10**9),
        Verify(2, (0,), 13, "greedy-chain", ()),
        Commit(2, (11, 13), ("draft", "correction"), (1.0, 1.0)),
    ]
    fig = jacobi_trajectory(far, TEXTS, 2)
    h = heatmap(fig)
    assert list(h.x) == list(range(10**9 + 2 - MAX_POSITIONS, 10**9 + 2))
    assert all(len(row) == MAX_POSITIONS for row in h.z)
    (bound,) = [t for t in fig.data if t.name == "end of the converged guesses"]
    assert list(bound.x) == [10**9 + 0.5, 10**9 + 0.5, None]  # the block at 0 is out of view
    assert fig.layout.xaxis.range[0] == 10**9 + 2 - MAX_POSITIONS - 0.5
    assert "positions" in fig.layout.title.subtitle.text


def test_jacobi_without_iterations_is_empty():
    fig = jacobi_trajectory(JACOBI_TRACE, TEXTS, 0)
    assert fig.data == ()
    assert "no Jacobi iteration yet" in fig.layout.annotations[0].text


# --- Lookahead: window ----------------------------------------------------------------------------

# N = 3, W = 3: two levels and the new guesses; columns 0 and 2 yield new n-grams, column 1's
# n-gram (11, 14, 17) was already in the pool.
WINDOW_TRACE = [
    Prefill((1, 10)),
    Commit(0, (10,), ("target",), (0.9,)),
    LookaheadWindow(1, ((21, 22, 30),), (13, 14, 15)),
    NgramPool(1, (), 0, 6, ()),
    Commit(1, (11,), ("target",), (0.9,)),
    LookaheadWindow(2, ((10, 11, 12), (13, 14, 15)), (16, 17, 9)),
    NgramPool(2, ((10, 13, 16), (12, 15, 9)), 0, 9, ()),
    Commit(2, (12,), ("target",), (0.9,)),
    NgramPool(3, (), 2, 9, ()),  # a step with verification only (as with W = 0)
    Commit(3, (13,), ("target",), (0.9,)),
]


def test_window_grid_and_added_columns():
    fig = lookahead_window(WINDOW_TRACE, TEXTS, 2)
    h = heatmap(fig)
    hist, guess = WINDOW["history"], WINDOW["guess"]
    assert [list(r) for r in h.z] == [
        [hist, hist, hist],  # level 0 (bottom row)
        [hist, hist, hist],  # level 1
        [guess, guess, guess],  # the target's new guesses on top
    ]
    assert [list(r) for r in h.text] == [
        ["def", " f", "(x"],
        ["):", "↵", " retu…"],
        ["&lt;b&gt;", " x", ";"],
    ]
    assert list(fig.layout.yaxis.ticktext) == ["level 0 (oldest)", "level 1", "new guesses"]
    assert colour_of(h, hist) == COLOURS["target"] and colour_of(h, guess) == COLOURS["bonus"]
    # The columns whose n-gram entered the pool are outlined green (and say so in the legend).
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert sorted((s.x0, s.x1) for s in rects) == [(-0.5, 0.5), (1.5, 2.5)]
    assert all(s.y0 == -0.5 and s.y1 == 2.5 for s in rects)
    assert ADDED_LABEL in legend(fig)
    assert "added to the pool this step" in h.customdata[0][0]
    assert "already in the pool" in h.customdata[2][1]
    assert "position x+1" in h.customdata[0][0] and "position x+3" in h.customdata[1][1]
    assert "new guess for position x+5" in h.customdata[2][2]
    assert fig.layout.title.text == "Step 2: window of 2 levels × 3"
    subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "after x = ' f'" in subtitle and "2 new n-grams for the pool" in subtitle


def test_window_warm_up_and_empty_steps():
    fig = lookahead_window(WINDOW_TRACE, TEXTS, 1)
    assert len(heatmap(fig).z) == 2  # one level + the new guesses
    assert "warming up: 1 of 2 levels" in fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "none yet" in heatmap(fig).customdata[0][0]
    w0 = lookahead_window(WINDOW_TRACE, TEXTS, 3)
    assert w0.data == () and "W = 0" in w0.layout.annotations[0].text
    s0 = lookahead_window(WINDOW_TRACE, TEXTS, 0)
    assert s0.data == () and "no lookahead window at step 0" in s0.layout.annotations[0].text


def test_window_reads_n_from_the_pool_event():
    """N is recorded on NgramPool: the warm-up is told even before any n-gram was added."""
    trace = [e for e in WINDOW_TRACE if not isinstance(e, NgramPool)]
    trace.insert(3, NgramPool(1, (), 0, 6, (), n=4))
    subtitle = lookahead_window(trace, TEXTS, 1).layout.title.subtitle.text.replace("<br>", " ")
    assert "warming up: 1 of 3 levels" in subtitle


# W = 1 (the CPU default): one column per step; it climbs a level per step until N - 1 = 2 levels.
HISTORY_TRACE = [
    Prefill((1, 10)),
    Commit(0, (10,), ("target",), (0.9,)),
    LookaheadWindow(1, ((21,),), (13,)),
    NgramPool(1, (), 0, 4, (), n=3),
    Commit(1, (11,), ("target",), (0.9,)),
    LookaheadWindow(2, ((21,), (13,)), (14,)),
    NgramPool(2, ((21, 13, 14),), 0, 5, (), n=3),
    Commit(2, (12,), ("target",), (0.9,)),
    LookaheadWindow(3, ((13,), (14,)), (15,)),
    NgramPool(3, ((13, 14, 15),), 0, 6, (), n=3),
    Commit(3, (13,), ("target",), (0.9,)),
]


def test_window_of_one_column_shows_the_jacobi_history_across_steps():
    fig = lookahead_window(HISTORY_TRACE, TEXTS, 3)
    h = heatmap(fig)
    assert list(h.x) == [1, 2, 3]  # one column per step up to the selected one
    hist, guess = WINDOW["history"], WINDOW["guess"]
    assert [list(r) for r in h.z] == [
        [hist, hist, hist],  # level 0
        [None, hist, hist],  # level 1: filled from step 2 on
        [guess, guess, guess],  # each step's new guess on top
    ]
    # A token climbs: the guess on top of step 1 is level 1 at step 2 and level 0 at step 3.
    assert h.text[2][0] == h.text[1][1] == h.text[0][2] == "):"
    frames = [(s.x0, s.x1, s.line.color) for s in fig.layout.shapes]
    assert (2.5, 3.5, SEPARATOR_COLOUR) in frames  # the selected step's window
    assert sum(c == BOUNDARY_COLOUR for _, _, c in frames) == 2  # steps 2 and 3 added n-grams
    assert fig.layout.title.text == "Step 3: window of 2 levels × 1"
    subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "W = 1" in subtitle and "3-gram" in subtitle and "'paper' preset" in subtitle


# --- end to end on the tiny model -----------------------------------------------------------------


def token_ids(events) -> set[int]:
    ids: set[int] = set()
    for e in events:
        for name in ("prompt_ids", "tokens", "outputs"):
            ids.update(getattr(e, name, ()))
        for group in (*getattr(e, "levels", ()), *getattr(e, "added", ()), *getattr(e, "top", ())):
            ids.update(group)
        if isinstance(e, Verify) and e.correction is not None:
            ids.add(e.correction)
    return ids


def test_views_render_real_runs(tiny):
    look = generate(tiny, "def f(x):", "lookahead", 24, N=3, W=4, G=3)
    jac = generate(tiny, "def f(x):", "jacobi", 16, block=4)
    for res, views in (
        (look, (lookahead_window, ngram_pool, pool_candidates, attention_mask, lookahead_panel)),
        (jac, (jacobi_trajectory,)),
    ):
        texts = {t: tiny.token_text(t) for t in token_ids(res.events)}
        last = max(getattr(e, "step", 0) for e in res.events)
        for step in range(last + 2):
            for view in views:
                fig = view(res.events, texts, step)
                assert isinstance(fig, go.Figure) and fig.layout.title.text
    texts = {t: tiny.token_text(t) for t in token_ids(look.events)}
    mask = next(e for e in look.events if isinstance(e, AttentionMask) and e.step == 2)
    z = heatmap(attention_mask(look.events, texts, 2)).z
    assert len(z) == len(mask.labels) and all(len(r) == len(mask.labels) for r in z)
    assert sum(lb.startswith("look") for lb in mask.labels) == 2 * 4  # N - 1 = 2 levels × W = 4
    window = heatmap(lookahead_window(look.events, texts, 2))
    assert len(window.z) == 3 and len(window.z[0]) == 4
    jac_steps = [e.step for e in jac.events if isinstance(e, JacobiIteration)]
    assert len(heatmap(jacobi_trajectory(jac.events, texts, jac_steps[-1])).y) == min(
        16, len(jac_steps)
    )


def test_every_token_a_view_names_is_listed_for_its_text():
    """The page keeps token texts for what events name (decoders.core.events.token_ids): the window's
    guesses, the pool's n-grams (not the hit counts) and the mask's inputs too."""
    from decoders.core.events import token_ids

    assert token_ids(LookaheadWindow(1, ((1, 2), (3, 4)), (5, 6))) == [1, 2, 3, 4, 5, 6]
    assert token_ids(NgramPool(1, ((7, 8),), 0, 1, ((99, 9, 10),), n=2)) == [7, 8, 9, 10]
    assert token_ids(AttentionMask(1, ("x",), ((0,),), input_ids=(11,))) == [11]
    assert token_ids(Verify(1, (), 12, "g")) == [12]
    assert token_ids(JacobiIteration(1, 1, (13, 14), (True, True))) == [13, 14]


def test_cell_labels_fit_a_phone_wide_cell():
    """On a 390 px screen the heatmaps' cells are ~300 px / columns wide: a label longer than a
    cell spilled over its neighbours (Jacobi's trajectory, 19 columns)."""
    from html import unescape

    from visualizer.jacobi_view import PHONE_PLOT_PX, _cell_label

    for columns in (9, 12, 16, 19, 25, 32, 48):
        label = unescape(_cell_label("<|assistant|>", columns))
        assert len(label) * 6 <= PHONE_PLOT_PX / columns, (columns, label)
    assert unescape(_cell_label("<|assistant|>", 6)) == "<|ass…"  # wide cells: an ellipsis


def test_jacobi_cells_hold_whole_tokens_at_the_width_the_page_gives():
    """At a desktop's width the trajectory shows the last positions whose cells hold a
    6-character token; at a phone's, at least the latest block."""
    from visualizer.jacobi_view import CELL_PX, MARGINS_PX

    texts = {10: "start", 11: "alpha", 12: "betas", 13: "gamma"}
    long = [Prefill((1,)), Commit(0, (10,), ("target",), (1.0,))]
    for s in range(1, 41):
        long += [
            JacobiIteration(s, s, (11, 12, 13), (True, True, False), start=s),
            Verify(s, (), 13, "greedy-chain", ()),
            Commit(s, (13,), ("correction",), (1.0,)),
        ]
    narrow = heatmap(jacobi_trajectory(long, texts, 40))  # no width: as before, 1-letter cells
    wide = heatmap(jacobi_trajectory(long, texts, 40, width=700))
    assert len(wide.x) == (700 - MARGINS_PX) // CELL_PX < len(narrow.x)
    assert {t for row in wide.text for t in row if t} <= {"start", "alpha", "betas", "gamma"}
    phone = heatmap(jacobi_trajectory(long, texts, 40, width=330))
    assert len(phone.x) == max((330 - MARGINS_PX) // CELL_PX, 3 + 1)  # at least block + 1
