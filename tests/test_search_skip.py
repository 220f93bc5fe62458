"""The skip-set search: optuna proposes sets, each is scored on real decodes, the best is written."""

import json

from decoders import search_skip
from decoders.events import Forward
from decoders.runtime import SkipSet


def test_modelled_cost_counts_draft_and_verify_forwards():
    events = [
        Forward(0, "prefill", 9, 4, 1.0),  # not counted: the same for every method
        Forward(1, "draft", 1, 3, 1.0),
        Forward(1, "verify", 3, 4, 1.0),
        Forward(2, "target", 1, 4, 1.0),
    ]
    expected = 0.5 + (1 + 2 * search_skip.VERIFY_PER_TOKEN) + 1.0
    assert abs(search_skip.modelled_cost(events, 0.5) - expected) < 1e-9


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
    assert record["command"].startswith("python -m decoders.search_skip --model tiny-random")
    assert record["trials"] == 3 and record["model"] == "tiny-random"
