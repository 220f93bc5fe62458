"""Lookahead's n-gram pool and attention-mask figures on hand-written traces: the pool's bars and
its candidates (one path per row), the mask matrix with its ticks, separators and note, and the
panels' dispatch."""

import plotly.graph_objects as go
from test_lookahead_views import MASK, TEXTS, WINDOW_TRACE, colour_of, heatmap

from decoders.core.events import (
    AttentionMask,
    Commit,
    Draft,
    LookaheadWindow,
    NgramPool,
    Prefill,
    Verify,
)
from visualizer.cells import CANDIDATE_STATUS, MASK_NOTE
from visualizer.lookahead_views import lookahead_panel, ngram_pool, pool_candidates
from visualizer.mask_view import attention_mask
from visualizer.tokens import COLOURS

# --- Lookahead: pool ------------------------------------------------------------------------------

POOL_TRACE = [
    Prefill((1,)),
    Commit(4, (10,), ("target",), (0.9,)),
    # Two candidates after x = "def": (" f", "(x") and ("[", "x)"); the target takes " f" and then
    # wants something other than "(x", so "[" (a sibling of " f") lost and "x)" was never compared.
    Draft(5, "n-gram pool (2 candidates)", (11, 12, 21, 22), (-1, 0, -1, 2), (1.0,) * 4),
    NgramPool(5, (), 2, 9, ((1, 13, 14, 16), (3, 10, 11, 12), (2, 15, 16, 17))),
    Verify(5, (0,), 17, "greedy-tree", ()),
    Commit(5, (11, 17), ("draft", "correction"), (0.9, 0.8)),
]


def test_pool_bars_sorted_with_counts_and_labels():
    fig = ngram_pool(POOL_TRACE, TEXTS, 5)
    (bars,) = [t for t in fig.data if isinstance(t, go.Bar)]
    assert list(bars.x) == [3, 2, 1]
    assert list(fig.layout.yaxis.ticktext) == [
        "def| f|(x",
        " return|&lt;b&gt;| x",
        "):|↵|&lt;b&gt;",
    ]
    assert fig.layout.yaxis.autorange == "reversed"  # most hits on top
    assert "ids 10, 11, 12" in bars.customdata[0]
    assert fig.layout.title.text == "Step 5: pool holds 9 n-grams"
    assert "most-hit n-grams" in fig.layout.title.subtitle.text.replace("<br>", " ")


def test_pool_candidates_are_their_own_figure_one_path_per_row():
    fig = pool_candidates(POOL_TRACE, TEXTS, 5)
    h = heatmap(fig)
    code = {name: i for i, name in enumerate(CANDIDATE_STATUS)}
    root, acc, rej, unchecked = (code[k] for k in ("root", "accepted", "rejected", "not checked"))
    assert [list(r) for r in h.z] == [[root, acc, rej], [root, rej, unchecked]]
    assert [list(r) for r in h.text] == [["x def", " f", "(x"], ["x def", "[", "x)"]]
    assert colour_of(h, acc) == COLOURS["draft"] and colour_of(h, rej) == COLOURS["rejected"]
    assert list(fig.layout.yaxis.ticktext) == ["candidate 1", "candidate 2"]
    assert fig.layout.title.text == "Step 5: candidates after x = 'def'"
    subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert "2 n-grams from the pool" in subtitle and "1 token accepted" in subtitle
    assert "trie node 1" in h.customdata[0][2] and "rejected" in h.customdata[0][2]


def test_pool_without_hits_or_candidates_and_empty_steps():
    fig = ngram_pool(WINDOW_TRACE, TEXTS, 2)
    assert "no n-gram has been hit yet" in fig.layout.annotations[0].text
    fig = pool_candidates(WINDOW_TRACE, TEXTS, 2)
    assert "no pool n-gram starts with x" in fig.layout.annotations[0].text.replace("<br>", " ")
    for view in (ngram_pool, pool_candidates):
        empty = view(POOL_TRACE, TEXTS, 0)
        assert empty.data == () and "no n-gram pool at step 0" in empty.layout.annotations[0].text


# --- Lookahead: attention mask --------------------------------------------------------------------

MASK_LABELS = (
    "x",
    "look L0·0",
    "look L0·1",
    "look L1·0",
    "look L1·1",
    "verify n0·d0",
    "verify n1·d1",
)
MASK_VISIBLE = ((0,), (0, 1), (0, 1, 2), (0, 1, 3), (0, 1, 2, 4), (0, 5), (0, 5, 6))
MASK_TRACE = [
    Prefill((1,)),
    Commit(2, (10,), ("target",), (0.9,)),
    Draft(3, "n-gram pool (1 candidates)", (15, 16), (-1, 0), (1.0, 1.0)),
    AttentionMask(3, MASK_LABELS, MASK_VISIBLE),
    LookaheadWindow(3, ((11, 12), (13, 14)), (20, 21)),
    NgramPool(3, ((11, 13, 20), (12, 14, 21)), 1, 5, ()),
    Verify(3, (), 22, "greedy-tree", ()),
    Commit(3, (22,), ("correction",), (0.5,)),
    LookaheadWindow(4, ((13, 14), (20, 21)), (9, 9)),
    Commit(4, (30,), ("target",), (0.5,)),
]


def test_mask_matrix_matches_visible_lists_and_branches():
    fig = attention_mask(MASK_TRACE, TEXTS, 3)
    h = heatmap(fig)
    n = len(MASK_LABELS)
    assert len(h.z) == n and all(len(r) == n for r in h.z)
    for r, row in enumerate(h.z):
        assert [c for c in range(n) if row[c] != MASK["masked"]] == list(MASK_VISIBLE[r])
    look, ver = MASK["lookahead"], MASK["verify"]
    assert list(h.z[4]) == [look, look, look, 0, look, 0, 0]  # look L1·1: x, L0·0, L0·1, itself
    assert list(h.z[6]) == [ver, 0, 0, 0, 0, ver, ver]
    assert h.z[0][0] == MASK["x"]
    assert colour_of(h, look) != colour_of(h, ver)
    assert fig.layout.yaxis.autorange == "reversed"  # row 0 on top
    assert "key 2: look L0·1 '(x' · id 12" in h.customdata[4][2] and "visible" in h.customdata[4][2]
    assert "masked" in h.customdata[4][3]


def test_mask_ticks_separators_and_note():
    fig = attention_mask(MASK_TRACE, TEXTS, 3)
    ticks = list(fig.layout.yaxis.ticktext)
    assert ticks == list(fig.layout.xaxis.ticktext)
    assert (
        ticks[0] == "x def" and ticks[3] == "look L1·0 ):" and ticks[6] == "verify n1·d1 &lt;b&gt;"
    )
    lines = [(s.x0, s.line.dash) for s in fig.layout.shapes if s.x0 == s.x1]
    assert lines == [(0.5, None), (2.5, "dot"), (4.5, None)]  # x | L0 : L1 | verify
    subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert MASK_NOTE in subtitle and subtitle.startswith("1 x · 4 lookahead · 2 verify")
    assert fig.layout.title.text == "Step 3: attention among 7 inputs"


def test_mask_takes_tokens_and_branches_from_the_event():
    """New traces name each input's token and branch; the view does not rebuild them from the
    window and draft events (here: none) or parse the labels."""
    event = AttentionMask(
        3,
        ("root", "a", "b"),
        ((0,), (0, 1), (0, 2)),
        input_ids=(10, 11, 12),
        branches=("x", "lookahead", "verify"),
    )
    fig = attention_mask([Prefill((1,)), event], TEXTS, 3)
    h = heatmap(fig)
    assert [row[0] for row in h.z] == [MASK["x"], MASK["lookahead"], MASK["verify"]]
    assert list(fig.layout.yaxis.ticktext) == ["root def", "a  f", "b (x"]
    assert "key 2: b '(x' · id 12" in h.customdata[1][2]


def test_mask_missing_and_panel_dispatch():
    assert attention_mask(MASK_TRACE, TEXTS, 4).data == ()
    assert (
        "no attention mask at step 4"
        in attention_mask(MASK_TRACE, TEXTS, 4).layout.annotations[0].text
    )
    assert len(heatmap(lookahead_panel(MASK_TRACE, TEXTS, 3)).z) == len(MASK_LABELS)
    assert list(lookahead_panel(MASK_TRACE, TEXTS, 4).layout.yaxis.ticktext)[-1] == "new guesses"
