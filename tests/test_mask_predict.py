"""Mask-Predict (decoders/methods/mask_predict.py) and the quality measures of lossy methods
(decoders/core/quality.py): the layout, the schedule, an oracle mask model that makes it exact, the
budget and EOS edges, the honest badge, the view and the benchmark's quality table."""

import dataclasses
import itertools
import json

import pytest
import torch

import decoders.methods.mask_predict as mp
from conftest import PROMPTS, greedy, one_thread, oracle_masks
from decoders import METHODS, InvalidParameter, generate
from decoders.core import quality
from decoders.core.events import AttentionMask, Commit, Forward, MaskPredictStep


@pytest.fixture(autouse=True)
def one_torch_thread():
    with one_thread():
        yield


# --- the layout and the schedule ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "masked"),
    [
        (pending, masked)
        for pending in (0, 1, 3)
        for masked in ([True, True, True], [False, True, False], [False, False, True], [], [False])
        if pending or masked  # a forward feeds something
    ],
)
def test_kept_tokens_never_see_a_mask_and_masks_see_everything_before_them(pending, masked):
    cached = 5
    order, positions, mask = mp.layout(cached, pending, masked)
    n = len(order)
    assert n == pending + len(masked)
    assert (mask[0, 0, :, :cached] == 0).all()  # the cache is visible to every input
    sees = mask[0, 0, :, cached:] == 0
    # Real inputs first (the adapter acts on one trailing slice): pending, kept fills, masks.
    kinds = ["p" if i < 0 else ("m" if masked[i] else "k") for i in order]
    assert kinds == sorted(kinds, key="pkm".index)
    x_pos = cached + pending - 1
    for r, i in enumerate(order):
        pos_r = cached + (-1 - i) if i < 0 else x_pos + 1 + i
        assert positions[r] == pos_r
        for c, j in enumerate(order):
            pos_c = cached + (-1 - j) if j < 0 else x_pos + 1 + j
            before = pos_c <= pos_r
            real_row, real_col = i < 0 or not masked[i], j < 0 or not masked[j]
            # a real row: causal over real inputs only; a mask: everything up to itself
            want = before and (real_col or not real_row)
            assert bool(sees[r, c]) == want, (order, r, c)


@pytest.mark.parametrize(("m", "T"), [(5, 4), (4, 2), (4, 3), (2, 3), (1, 5), (5, 1)])
def test_the_schedule_decays_linearly_and_ends_with_nothing_masked(m, T):
    counts = [mp.remask_count(m, T, t) for t in range(T)]
    assert counts[-1] == 0
    assert counts == sorted(counts, reverse=True)
    assert all(0 <= c < m for c in counts)
    if m - 1 == T and m > 1:  # the full schedule: one mask fewer each iteration
        assert counts == list(range(m - 2, -1, -1))


# --- decoding -------------------------------------------------------------------------------------


def test_a_block_of_one_is_autoregressive(tiny):
    """m = 1: no mask at all, every token is the last token's own row: greedy exactly."""
    for prompt in PROMPTS[:3]:
        res = generate(tiny, prompt, "mask_predict", 20, m=1, T=3)
        ref = greedy(tiny, prompt, 20)
        assert res.token_ids == ref.token_ids
        assert res.stats["target_forwards"] == 20


@pytest.mark.parametrize(("m", "T"), [(4, 1), (4, 3), (3, 2), (2, 1)])
def test_each_block_costs_at_most_T_forwards_and_its_first_token_is_the_targets(tiny, m, T):
    prompt_ids = tiny.encode(PROMPTS[1])
    res = generate(tiny, prompt_ids, "mask_predict", 30, m=m, T=T)
    assert len(res.token_ids) == 30
    commits = [e for e in res.events if isinstance(e, Commit)]
    forwards = [e for e in res.events if isinstance(e, Forward)]
    for c in commits:
        assert 1 <= sum(f.step == c.step for f in forwards) <= T
        assert c.origins == ("target",) + ("mask",) * (len(c.tokens) - 1)
    assert forwards[0].kind == "prefill" and {f.kind for f in forwards[1:]} == {"target"}
    # Every "target" token is the original model's greedy choice given the output before it.
    ids = torch.tensor([[*prompt_ids, *res.token_ids]])
    with torch.no_grad():
        argmax = tiny.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    at = 0
    for c in commits:
        assert c.tokens[0] == argmax[at]
        at += len(c.tokens)
    # The iterations refine what the schedule says: masked count per iteration.
    for c in commits:
        its = [e for e in res.events if isinstance(e, MaskPredictStep) and e.step == c.step]
        n = len(c.tokens) if c is not commits[-1] else len(its[0].tokens)
        assert len(its[0].updated) == n  # the first iteration fills every position
        for e in its:
            assert len(e.remasked) == mp.remask_count(n, T, e.iteration)
            assert 0 not in e.remasked  # the target's own token is final
        for prev, nxt in itertools.pairwise(its):
            assert nxt.updated == prev.remasked
            kept = [j for j in range(n) if j not in prev.remasked]
            assert [nxt.tokens[j] for j in kept] == [prev.tokens[j] for j in kept]


@pytest.fixture()
def oracle(monkeypatch):
    """Mask rows predict the true greedy continuation (a mask at position P: the reference
    token at P + 1), so Mask-Predict must reproduce greedy exactly whatever m and T: a check
    of the layout's positions, the re-masking and the cache kept between blocks."""
    return oracle_masks(monkeypatch, mp)


@pytest.mark.parametrize(("m", "T", "budget"), [(4, 1, 40), (4, 3, 23), (3, 2, 7), (2, 2, 9)])
def test_perfect_masks_reproduce_greedy(tiny, oracle, m, T, budget):
    prompt_ids = tiny.encode(PROMPTS[1])
    ref = greedy(tiny, PROMPTS[1], budget)
    oracle.extend([*prompt_ids, *ref.token_ids])
    res = generate(tiny, PROMPTS[1], "mask_predict", budget, m=m, T=T)
    assert res.token_ids == ref.token_ids
    assert res.finish_reason == ref.finish_reason == "length"
    blocks = -(-budget // m)
    assert res.stats["target_forwards"] <= blocks * T
    assert len([e for e in res.events if isinstance(e, Commit)]) == blocks


def test_an_eos_inside_a_block_stops_there(tiny, oracle):
    free = greedy(tiny, PROMPTS[2], 40)
    eos_at = next(i for i in range(5, 40) if i % 4 and free.token_ids[i] not in free.token_ids[:i])
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({free.token_ids[eos_at]}))
    prompt_ids = tiny.encode(PROMPTS[2])
    oracle.extend([*prompt_ids, *free.token_ids])
    res = generate(bundle, PROMPTS[2], "mask_predict", 40, m=4, T=2)
    assert res.token_ids == free.token_ids[: eos_at + 1]
    assert res.finish_reason == "eos"


def test_a_block_is_cut_to_the_remaining_budget(tiny):
    res = generate(tiny, PROMPTS[0], "mask_predict", 6, m=4, T=2)
    assert len(res.token_ids) == 6 and res.finish_reason == "length"
    last = [e for e in res.events if isinstance(e, MaskPredictStep)][-1]
    assert len(last.tokens) == 2  # 4 + 2: the second block asks for what is left


def test_the_paper_preset_and_bad_settings(tiny):
    method = METHODS["mask_predict"]
    assert not method.lossless and not method.sampling
    res = generate(tiny, PROMPTS[0], "mask_predict", 12, **method.preset("paper"))
    first = next(e for e in res.events if isinstance(e, MaskPredictStep))
    assert len(first.tokens) == 4  # tiny's adapter has k = 3: blocks of k + 1
    with pytest.raises(InvalidParameter, match="at most 4"):
        generate(tiny, PROMPTS[0], "mask_predict", 8, m=5)
    with pytest.raises(InvalidParameter):
        generate(tiny, PROMPTS[0], "mask_predict", 8, temperature=0.7)


def test_the_mask_view_labels_kept_fills_and_masks(tiny):
    res = generate(tiny, PROMPTS[1], "mask_predict", 16, m=4, T=3)
    masks = [e for e in res.events if isinstance(e, AttentionMask)]
    assert masks and {b for e in masks for b in e.branches} >= {"kept", "mask"}
    for e in masks:
        for i, b in enumerate(e.branches):
            if b != "mask":  # a real input sees no mask
                assert not any(e.branches[j] == "mask" for j in e.visible[i])
    # Drawn: every kind of input present has its legend entry and its count, and Lookahead's
    # branch names do not appear where there is no window.
    from visualizer.cells import MASK_BRANCH
    from visualizer.mask_view import attention_mask

    texts = {t: str(t) for t in range(tiny.model.config.vocab_size)}
    for e in masks:
        fig = attention_mask(res.events, texts, e.step)
        legend = {t.name for t in fig.data if t.showlegend}
        present = set(e.branches)
        assert {MASK_BRANCH[b][1] for b in present} <= legend
        subtitle = fig.layout.title.subtitle.text.replace("<br>", " ")
        assert all(f"{e.branches.count(b)} {b}" in subtitle for b in present)
        assert "lookahead" not in subtitle and "verify" not in subtitle


# --- quality --------------------------------------------------------------------------------------


def test_rouge_l_and_agreement_on_known_cases():
    assert quality.lcs_length([1, 2, 3, 4], [1, 3, 4]) == 3
    assert quality.rouge_l([1, 2, 3, 4], [1, 3, 4]) == pytest.approx(2 * 1 * 0.75 / 1.75)
    assert quality.rouge_l([], []) == 1.0 and quality.rouge_l([1], []) == 0.0
    q = quality.compare([1, 2, 3, 4], [1, 2, 9, 4, 5])
    assert q.agreement == pytest.approx(3 / 5) and q.first_difference == 2 and q.compared == 5
    same = quality.compare([1, 2], [1, 2])
    assert same.agreement == 1.0 and same.first_difference is None and same.rouge_l == 1.0
    assert quality.compare([1, 2, 3], [1, 2]).first_difference == 2


def test_greedy_output_is_fully_self_consistent_and_scores_the_lowest_nll(tiny):
    prompt_ids = tiny.encode(PROMPTS[1])
    ref = greedy(tiny, PROMPTS[1], 16).token_ids
    own = quality.under_target(tiny, prompt_ids, ref)
    assert own["consistency"] == 1.0
    lossy = generate(tiny, prompt_ids, "mask_predict", 16, m=4, T=1).token_ids
    other = quality.under_target(tiny, prompt_ids, lossy)
    assert other["consistency"] < 1.0 and other["nll"] > own["nll"]


def test_the_badge_of_a_lossy_run_is_never_a_tick(tiny):
    from ui.live import lossless_info
    from visualizer.tokens import lossless_badge_html

    prompt_ids = tiny.encode(PROMPTS[1])
    res = generate(tiny, prompt_ids, "mask_predict", 16, m=4, T=1)
    info = lossless_info(tiny, "mask_predict", {"m": 4, "T": 1}, prompt_ids, 16, res.token_ids)
    assert info["status"] == "lossy" and 0 <= info["agreement"] < 1
    badge = lossless_badge_html(info)
    assert "✓" not in badge and "not identical" in badge and "ROUGE-L" in badge
    matched = {**info, "agreement": 1.0, "first_difference": None}
    assert "✓" not in lossless_badge_html(matched)
    assert "not guaranteed" in lossless_badge_html(matched)


def test_the_view_draws_every_iteration_and_marks_the_re_masked(tiny):
    from visualizer.mask_predict_view import MASK_PREDICT_STATUS, refinement
    from visualizer.panels import extra_panels, method_panel

    res = generate(tiny, PROMPTS[1], "mask_predict", 16, m=4, T=3)
    code = {name: i for i, name in enumerate(MASK_PREDICT_STATUS)}
    for step in range(4):
        its = [e for e in res.events if isinstance(e, MaskPredictStep) and e.step == step]
        fig = refinement(res.events, {}, step)
        z = fig.data[0].z
        assert len(z) == len(its) + 1  # every iteration, then the commit
        for row, e in zip(z, its, strict=False):
            marked = [
                j
                for j, c in enumerate(row)
                if c in (code["filled_remasked"], code["kept_remasked"])
            ]
            assert marked == list(e.remasked)
        assert method_panel(METHODS["mask_predict"].views, res.events, {}, step).layout.title.text
        assert extra_panels(METHODS["mask_predict"].views, res.events, {}, step) or step == 0
    assert "not a mask_predict run" in str(refinement([], {}, 0).layout.annotations)
    # The tokens-per-step chart counts the unverified fills too, not only the target's own token.
    from visualizer import tokens_per_step
    from visualizer.tokens import LABELS

    bars = {t.name: sum(t.y) for t in tokens_per_step(res.events).data}
    assert bars[LABELS["mask"]] + bars[LABELS["target"]] == len(res.token_ids)


def test_the_benchmark_scores_lossy_rows_and_plots_quality(tiny, tmp_path):
    from decoders.bench import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n")
    rc = main(
        [
            "--dataset", str(prompts), "--model", "tiny-random", "--max-new-tokens", "12",
            "--methods", "autoregressive,mask_predict:m=4:T=1,mask_predict:m=4:T=3",
            "--peers", "", "--no-overhead", "--no-warmup", "--out", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    assert rc == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["contestant"]: r for r in result["rows"]}
    assert rows["autoregressive"]["quality"]["agreement"] == 1.0
    for spec in ("mask_predict:m=4:T=1", "mask_predict:m=4:T=3"):
        assert set(rows[spec]["quality"]) == {"agreement", "rouge_l", "nll", "consistency"}
    assert rows["mask_predict:m=4:T=1"]["tokens_per_target_forward"] > 3
    table = (tmp_path / "out" / "table.md").read_text()
    assert "Quality against greedy" in table
    assert "| lossy, " in table and rows["mask_predict:m=4:T=1"]["lossy"]
    assert (tmp_path / "out" / "quality.html").is_file()


@pytest.mark.slow
def test_the_embedded_model_fills_blocks_whose_first_token_is_greedys(embedded):
    prompt = "Give me three tips for sleeping better."
    ref = greedy(embedded, prompt, 24).token_ids
    for params in ({"m": 5, "T": 4}, {"m": 3, "T": 1}):
        res = generate(embedded, prompt, "mask_predict", 24, **params)
        assert len(res.token_ids) == 24 and res.token_ids[0] == ref[0]
        assert res.stats["tokens_per_target_forward"] > 1.2


@pytest.mark.parametrize(("m", "T"), [(3, 2), (4, 3), (3, 1)])
def test_the_mask_view_shows_masks_at_every_step_after_the_prefill(tiny, m, T):
    """The drawn layout is the first re-mask iteration when a mask is among its inputs, else the
    block as first fed: with the defaults (m = 3, T = 2) the re-masked token is often the last,
    which is never an input, and a view of that iteration showed no mask at all."""
    res = generate(tiny, PROMPTS[1], "mask_predict", 24, m=m, T=T)
    layouts = {e.step: e for e in res.events if isinstance(e, AttentionMask)}
    steps = {e.step for e in res.events if isinstance(e, Commit)}
    assert {s for s in steps if s > 0} <= set(layouts)
    for step, e in layouts.items():
        budget_left = 24 - sum(
            len(c.tokens) for c in res.events if isinstance(c, Commit) and c.step < step
        )
        if min(m, budget_left) > 1:  # a block of one token has no input after x
            assert "mask" in e.branches, (step, e.branches)


def test_the_mask_view_of_a_block_without_masks_names_no_lookahead_branch(tiny):
    from visualizer.mask_view import attention_mask

    res = generate(tiny, PROMPTS[1], "mask_predict", 6, m=1, T=1)  # m = 1: no input after x
    steps = sorted({e.step for e in res.events if isinstance(e, AttentionMask)})
    assert steps
    for step in steps:
        subtitle = attention_mask(res.events, {}, step).layout.title.subtitle.text
        assert "lookahead" not in subtitle and "verify" not in subtitle, subtitle
