"""The translation lab (decoders/seq2seq): its tasks and its metrics."""

from __future__ import annotations

import itertools

import pytest

from decoders.seq2seq.metrics import best_bleu, bleu, excess_repeats, mixed, valid
from decoders.seq2seq.tasks import (
    CHOICES,
    MAX_TARGET,
    MAX_WORDS,
    MIN_WORDS,
    REG,
    SRC,
    TASKS,
    VOCAB,
    describe,
    examples,
    training_pairs,
    translate,
)


@pytest.mark.parametrize("task", TASKS)
def test_every_reference_is_a_right_translation_and_every_right_translation_is_there(task):
    for ex in examples(task, 7, 300):
        assert MIN_WORDS <= len(ex.source) <= MAX_WORDS
        assert all(SRC <= s < REG[0] for s in ex.source)
        right = {translate(ex.source, r, rev, task) for r, rev in CHOICES[task]}
        assert set(ex.references) == right and len(ex.references) == len(right)
        for ref in ex.references:
            assert all(REG[0] <= t < VOCAB for t in ref) and len(ref) <= MAX_TARGET
            assert valid(ref, ex.references) and not mixed(ref, ex.source)
    n_refs = {len(ex.references) for ex in examples(task, 7, 300)}
    assert max(n_refs) == len(CHOICES[task])  # as many as the task leaves open


def test_the_tasks_differ_as_their_names_say():
    source = tuple(SRC + w for w in (3, 1, 4, 1, 5))
    assert [describe(t) for t in (translate(source, 0, False, "modes"),)] == [
        ["a3", "a1", "a4", "a1", "a5"]
    ]
    assert describe(translate(source, 1, True, "modes")) == ["b5", "b1", "b4", "b1", "b3"]
    # `length`: register 1 writes the even words as two-token phrases
    assert describe(translate(source, 1, False, "length")) == ["b3", "b1", "b4", "b4'", "b1", "b5"]
    lengths = {len(r) for ex in examples("length", 1, 50) for r in ex.references}
    assert len(lengths) > 3


def test_sets_are_the_same_for_a_seed_and_held_out_seeds_are_new_sentences():
    assert examples("modes", 5, 20) == examples("modes", 5, 20)
    train = {s for s, _ in training_pairs("modes", 2000)}
    test = {ex.source for ex in examples("modes", 1, 500)}
    assert len(test - train) >= 495  # 20^5..20^9 sentences: a held-out set barely meets training


def test_training_targets_take_every_choice_as_often():
    pairs = training_pairs("modes", 4000)
    counts = {choice: 0 for choice in CHOICES["modes"]}
    for source, target in pairs:
        for choice in CHOICES["modes"]:
            if translate(source, *choice, "modes") == target:
                counts[choice] += 1
                break
    assert all(800 <= c <= 1200 for c in counts.values()), counts


def test_mixing_is_told_apart_from_a_wrong_word():
    source = tuple(SRC + w for w in (1, 2, 3, 4, 5))
    refs = [translate(source, r, rev, "modes") for r, rev in CHOICES["modes"]]
    reg_mix = (REG[0] + 1, REG[1] + 2, REG[0] + 3, REG[0] + 4, REG[0] + 5)
    order_mix = (REG[0] + 1, REG[0] + 2, REG[0] + 3, REG[0] + 2, REG[0] + 1)  # a1 a2 a3 | a2 a1
    wrong = (REG[0] + 1, REG[0] + 2, REG[0] + 9, REG[0] + 4, REG[0] + 5)
    assert mixed(reg_mix, source) and mixed(order_mix, source) and not mixed(wrong, source)
    assert not any(valid(o, refs) for o in (reg_mix, order_mix, wrong))
    # the order mix repeats nothing adjacent; a stutter does, beyond the references' none
    assert excess_repeats(order_mix, refs) == 0
    assert excess_repeats((REG[0] + 1, REG[0] + 1, REG[0] + 2), refs) == 1


def test_bleu_is_100_on_a_reference_and_takes_the_closest():
    ref = (10, 11, 12, 13, 14, 15)
    assert bleu(ref, ref) == pytest.approx(100)
    assert bleu((), ref) == 0.0 and bleu((99, 98), ref) == 0.0
    half = (10, 11, 12, 99, 98, 97)
    assert 0 < bleu(half, ref) < 100
    assert best_bleu(half, [(99, 98, 97), ref]) == max(bleu(half, (99, 98, 97)), bleu(half, ref))
    shorter = ref[:3]
    assert bleu(shorter, ref) < bleu(ref[:5], ref)  # the brevity penalty
    for a, b in itertools.combinations([ref, half, shorter], 2):
        assert 0 <= bleu(a, b) <= 100


# --- the models (tiny budgets) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def trained():
    """Each model after a tiny budget on the control task (one right translation)."""
    import torch

    from decoders.seq2seq.models import AR, CMLM, NAT
    from decoders.seq2seq.training import fit

    torch.set_num_threads(1)
    pairs = training_pairs("control", 3000)
    out = {}
    for cls in (AR, NAT, CMLM):
        torch.manual_seed(0)
        model = cls()
        fit(model, pairs, steps=120, batch=32, lr=3e-3)
        out[cls.name] = model
    return out


def token_accuracy(outputs, refs) -> float:
    hits = total = 0
    for out, ref in zip(outputs, refs, strict=True):
        total += len(ref)
        hits += sum(a == b for a, b in zip(out, ref, strict=False))
    return hits / total


def test_every_model_beats_chance_after_a_tiny_budget(trained):
    from decoders.seq2seq.models import sources

    held = examples("control", 11, 64)
    src = sources([ex.source for ex in held])
    refs = [ex.references[0] for ex in held]
    chance = 1 / 40  # a target token is one of 40 synonyms
    ar, ar_passes = trained["ar"].greedy(src)
    nat, nat_passes = trained["nat"].greedy(src)
    cmlm, cmlm_passes, _ = trained["cmlm"].mask_predict(src, 4)
    for name, out in (("ar", ar), ("nat", nat), ("cmlm", cmlm)):
        assert token_accuracy(out, refs) > 5 * chance, name
    # decoder passes: the output length + 1 for the autoregressive model (the longest row's,
    # for a batch), one for the NAT, T for Mask-Predict
    assert nat_passes == 1 and cmlm_passes == 4
    assert ar_passes <= max(len(o) for o in ar) + 1


def test_the_remasking_schedule_is_mask_predicts():
    from decoders.seq2seq.models import remask_count

    assert [remask_count(10, t, 4) for t in (1, 2, 3, 4)] == [7, 5, 2, 0]
    assert [remask_count(7, t, 1) for t in (1,)] == [0]  # one iteration: nothing re-masked
    assert all(remask_count(L, T, T) == 0 for L in range(1, 19) for T in range(1, 11))


def test_mask_predict_remasks_its_least_confident_tokens(trained):
    from decoders.seq2seq.models import remask_count, sources

    src = sources([ex.source for ex in examples("control", 12, 4)])
    _, _, history = trained["cmlm"].mask_predict(src, 4)
    for rows in history:
        length = len(rows[0]["tokens"])
        for t, row in enumerate(rows, start=1):
            assert len(row["remasked"]) == remask_count(length, t, 4)
            kept = [p for j, p in enumerate(row["probs"]) if j not in row["remasked"]]
            again = [row["probs"][j] for j in row["remasked"]]
            assert not again or not kept or max(again) <= min(kept)  # the least sure ones


def test_noisy_parallel_decoding_keeps_the_candidate_the_teacher_prefers(trained):
    from decoders.seq2seq.models import sources

    src = sources([ex.source for ex in examples("control", 13, 3)])
    outs, passes = trained["nat"].npd(src, trained["ar"], n=3)
    assert len(outs) == 3 and passes == 1
    for row, out in zip(src, outs, strict=True):
        lengths = trained["nat"].predict_lengths(row[None], 3)[0]
        cands = [
            tuple(b[:n])
            for b, n in zip(
                trained["nat"].logits(row[None].expand(3, -1), lengths).argmax(-1).tolist(),
                lengths,
                strict=True,
            )
        ]
        scores = trained["ar"].score(row[None].expand(3, -1), cands)
        assert out == cands[int(scores.argmax())]


def test_beam_search_of_width_one_is_greedy(trained):
    from decoders.seq2seq.models import sources

    src = sources([ex.source for ex in examples("control", 14, 3)])
    greedy, _ = trained["ar"].greedy(src)
    beamed, passes = trained["ar"].beam(src, width=1)
    assert beamed == greedy and passes >= 1
    wide, _ = trained["ar"].beam(src, width=3)
    assert len(wide) == 3


def test_distillation_keeps_the_sources_and_takes_the_teachers_translations(trained):
    from decoders.seq2seq.models import sources
    from decoders.seq2seq.training import distill

    pairs = training_pairs("control", 40)
    taught = distill(trained["ar"], pairs, batch=16)
    greedy, _ = trained["ar"].greedy(sources([s for s, _ in pairs]))
    expected = [(s, g) for (s, _), g in zip(pairs, greedy, strict=True) if g]
    assert taught == expected
