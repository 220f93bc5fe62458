"""The skip-set search: optuna proposes sets, each is scored on real decodes, the best is written."""

import json

from decoders import search_skip
from decoders.core.events import Forward
from decoders.core.runtime import SkipSet


def test_modelled_cost_counts_draft_and_verify_forwards():
    events = [
        Forward(0, "prefill", 9, 4, 1.0),  # not counted: the same for every method
        Forward(1, "draft", 1, 3, 1.0),
        Forward(1, "verify", 3, 4, 1.0),
        Forward(2, "target", 1, 4, 1.0),
    ]
    expected = 0.5 + (1 + 2 * search_skip.VERIFY_PER_TOKEN) + 1.0
    assert abs(search_skip.modelled_cost(events, 0.5) - expected) < 1e-9


def result(speedup, share, acceptance):
    return {"modelled_speedup": speedup, "draft_share": share, "draft_acceptance_rate": acceptance}


def test_the_objective_rejects_a_set_that_never_drafts():
    # The old objective's winner: never clears θ, so every step pays one wasted draft forward and
    # commits one target token. Its cost is low, but it must lose to ANY set whose drafts are used.
    silent = result(0.65, 0.0, 0.0)
    drafting = result(0.30, 0.9, 0.7)
    assert search_skip.shortfall(silent) > 0 and search_skip.shortfall(drafting) == 0
    assert search_skip.objective_value(silent) < 0 < search_skip.objective_value(drafting)
    assert search_skip.objective_value(drafting) == 0.30
    # Drafting that the target throws away is as bad: the acceptance constraint catches it.
    assert search_skip.objective_value(result(0.9, 1.0, 0.1)) < 0
    # Closer to feasibility scores higher, so the search is pulled towards it.
    assert search_skip.objective_value(result(0.6, 0.5, 0.45)) > search_skip.objective_value(silent)


def test_an_infeasible_search_writes_nothing(tiny, tmp_path):
    out = tmp_path / "skip.json"
    argv = ["--model", "tiny-random", "--trials", "2", "--limit", "1", "--max-new-tokens", "4"]
    assert search_skip.main([*argv, "--min-draft-share", "1.01", "--out", str(out)]) == 1
    assert not out.exists()


def test_search_writes_the_best_set_with_its_command(tiny, tmp_path):
    out = tmp_path / "skip.json"
    assert (
        search_skip.main(
            [
                "--model",
                "tiny-random",
                "--trials",
                "3",
                "--limit",
                "1",
                "--max-new-tokens",
                "6",
                "--min-acceptance",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())
    skip = SkipSet(frozenset(record["attn"]), frozenset(record["mlp"]))
    assert skip and all(0 <= i < tiny.n_layers for i in skip.attn | skip.mlp)
    assert 0 < record["score"]["modelled_speedup"] <= 2
    assert record["score"]["feasible"] and record["score"]["draft_share"] >= 0.6
    assert record["command"].startswith("python -m decoders.search_skip --model tiny-random")
    assert record["trials"] == 3 and record["model"] == "tiny-random"
