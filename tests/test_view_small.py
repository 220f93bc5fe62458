"""The Translation lab's small things: every code named in words, tables that stack on a phone,
and a bad source that clears the last translation (no model is run)."""

from types import SimpleNamespace


def test_every_model_and_decoding_code_is_named_in_words():
    from decoders.seq2seq.evaluate import MODELS, SETTINGS
    from decoders.seq2seq.lab import MODEL_WORDS, decoding_words

    assert set(MODELS) <= set(MODEL_WORDS)
    words = {d: decoding_words(m, d) for m, d in SETTINGS}
    assert all(w and w != d for d, w in words.items())
    assert words["npd:n=8"] == "noisy parallel decoding, 8 candidates (the teacher picks)"
    assert words["iw:n=8"].startswith("importance weighting, 8 candidates")
    assert MODEL_WORDS["nat_kd"] == "NAT trained on distilled data"


def test_the_labs_tables_name_their_codes_and_stack_on_a_phone():
    from decoders.seq2seq.lab import PICK_WORDS, Row
    from visualizer.translation_views import CSS, latents_html, metrics_html, outputs_html

    row = Row("nat_kd", "npd:n=8", ["a1", "a2"], True, False, [], ["a1", "a2"], 100.0, 2.0, "ok")
    latent = {"sample": "f(0)", "tokens": ["a1"], "prior": -1.0, "teacher": -2.0, "iw": -3.0}
    lab = SimpleNamespace(rows=[row], flowseq=[latent | {"valid": True}], pick_words=PICK_WORDS)
    out = outputs_html(lab)
    assert "<code>nat_kd</code>" in out and "NAT trained on distilled data" in out
    assert "noisy parallel decoding, 8 candidates" in out and 'data-label="verdict"' in out
    assert "the teacher&#x27;s best" in latents_html(lab) and "z = f(0), the prior" in latents_html(
        lab
    )
    card = {"model": "cmlm", "decoding": "T=4", "valid": 0.5, "mixed": 0.1, "bleu": 80.0}
    card |= {"excess_repeats": 0.0, "passes": 4, "model_words": "Mask-Predict (CMLM)"}
    table = metrics_html([card | {"decoding_words": "4 iterations, a pass each"}], "modes")
    assert "Mask-Predict (CMLM)" in table and "4 iterations" in table
    assert all('class="stack"' in t for t in (out, table, latents_html(lab)))
    assert "@media (max-width: 640px)" in CSS and "td[data-label]::before" in CSS


def test_a_bad_source_clears_the_last_translation():
    from ui.translation_tab import SHOWN, shown_outputs

    got = shown_outputs("modes", "w3 w1 w44 w2 w5")
    assert len(got) == len(SHOWN) and "'w44' is not a source word" in got[0]
    assert got[1:] == [""] * (len(SHOWN) - 1)  # nothing left under the message
