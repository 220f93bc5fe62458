"""The benchmark runs end to end (tiny model, two prompts) and writes its three outputs."""

import json
import os

import pytest

from decoders import METHODS, bench
from decoders.core.errors import InvalidInput
from decoders.core.prices import PriceTable


def test_bench_end_to_end_on_tiny_model(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nWrite a limerick about tea.\n")
    rc = bench.main(
        [
            "--model",
            "tiny-random",
            "--dataset",
            str(prompts),
            "--max-new-tokens",
            "6",
            "--peers",
            "hf_greedy,hf_prompt_lookup:4",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert "| autoregressive | " in table and "| transformers greedy | " in table
    assert "Tracing overhead" in table
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["contestant"]: r for r in data["rows"]}
    assert rows["autoregressive"]["speedup"] == 1.0
    assert rows["autoregressive"]["tokens_per_target_forward"] == 1.0
    lossy = {name for name, m in METHODS.items() if not m.lossless}
    for name, r in rows.items():  # every lossless contestant must match our reference
        if name in lossy:  # a lossy one is scored instead (tests/test_mask_predict.py)
            assert set(r["quality"]) >= {"agreement", "rouge_l", "nll"}, r
        else:
            assert r["lossless"] == r["n"] == 2, r
    assert lossy and lossy <= set(rows)
    # early exit reports where tokens left beside the layers they cost (the same under CALM's
    # default propagation, weighed alike); methods without exits have none
    assert rows["calm"]["exit_depth"] == pytest.approx(rows["calm"]["layers_per_token"], abs=2e-4)
    assert rows["autoregressive"]["exit_depth"] is None
    assert "| exit depth |" in table
    assert (tmp_path / "out" / "speedup.html").stat().st_size > 1000
    assert (tmp_path / "out" / "table.md").read_text().startswith("Model tiny-random")
    assert data["meta"]["draft_dtype"] == "float32"  # tiny models draft in their own dtype
    from decoders.core.attention import NAME

    gqa = os.environ.get("DECODING_LAB_GQA") != "0"
    assert data["meta"]["attention"] == (NAME if gqa else "sdpa")  # what every contestant ran


def test_repeated_runs_report_each_runs_speedup(tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nWrite a limerick about tea.\nName three rivers.\n")
    out = tmp_path / "out"
    argv = ["--model", "tiny-random", "--dataset", str(prompts), "--max-new-tokens", "5"]
    argv += ["--methods", "autoregressive,prompt_lookup,jacobi", "--peers", "", "--no-overhead"]
    assert bench.main([*argv, "--repeat", "3", "--out", str(out)]) == 0
    # one price table for the whole run, recorded with it
    assert (
        json.loads((out / "results.json").read_text())["meta"]["prices"]["model"] == "tiny-random"
    )
    table = capsys.readouterr().out
    assert "the prompts run 3 times over" in table and "in each of the 3 runs" in table
    data = json.loads((out / "results.json").read_text())
    assert data["repeat"] == data["meta"]["repeat"] == 3
    assert len(data["prompts"]) == 3  # the set, once
    for row in data["rows"]:
        runs = row["speedup_runs"]
        assert len(runs) == 3 and row["n"] == row["lossless"] == 9, row
        # The whole's speedup is a ratio of sums of the runs' times: it lies between the runs'.
        assert min(runs) - 0.002 <= row["speedup"] <= max(runs) + 0.002, row
        assert f"| {' / '.join(f'{x:.2f}' for x in runs)} |" in table
    assert "arrayminus" in (out / "speedup.html").read_text()  # the runs' spread as whiskers
    assert bench.main([*argv, "--repeat", "0"]) == 2


def test_the_table_says_when_drafters_run_in_another_dtype():
    meta = {
        "model": "m",
        "device": "cpu",
        "dtype": "float32",
        "dataset": "humaneval",
        "n_prompts": 1,
        "max_new_tokens": 8,
        "torch": "2",
        "threads": 2,
    }
    result = {"rows": [], "groups": {}}
    assert "(cpu, float32)" in bench.markdown_table(result, meta)  # older results.json
    meta["draft_dtype"] = "bfloat16"
    assert "(cpu, float32, trained drafters in bfloat16)" in bench.markdown_table(result, meta)
    assert "priced" not in bench.markdown_table(result, meta)  # no size=cost tree ran
    meta["costs"] = {"input_cost": 0.0391, "forward_ms": 23.1}  # an older run's prices, said
    assert "one more input priced at 0.039 of a one-token forward." in bench.markdown_table(
        result, meta
    )
    meta["prices"] = PriceTable.linear("m", 0.035).to_dict()  # the table the work was priced by
    assert "work priced by this machine's table (one more input 0.035 of a" in (
        bench.markdown_table(result, meta)
    )
    assert "copying the cache" not in bench.markdown_table(result, meta)
    meta["attention"] = "sdpa"  # a run under DECODING_LAB_GQA=0 says so
    assert "bfloat16, grouped attention copying the cache (sdpa))" in bench.markdown_table(
        result, meta
    )


def test_datasets():
    he = bench.load_prompts("humaneval", limit=3)
    assert [p.id for p in he] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert he[0].chat is False and "def " in he[0].text
    if bench.DEFAULT_SPEC_BENCH.is_file():
        tr = bench.load_prompts("spec_bench", category="translation", limit=5)
        assert len(tr) == 5 and all(p.chat is None for p in tr)
        with pytest.raises(InvalidInput, match="valid: "):
            bench.load_prompts("spec_bench", category="poetry")
    with pytest.raises(InvalidInput, match="no dataset"):
        bench.load_prompts("/nonexistent/file.txt")


def test_spec_bench_task_groups_and_their_speedups(tmp_path, capsys):
    questions = tmp_path / "question.jsonl"
    rows = [(1, "writing"), (2, "coding"), (3, "translation"), (4, "translation"), (5, "rag")]
    questions.write_text(
        "".join(
            json.dumps({"question_id": i, "category": c, "turns": [f"Say {c} {i}.", "More."]})
            + "\n"
            for i, c in rows
        )
    )
    picked = bench.load_prompts(str(questions), per_group=1)
    # MT-Bench's categories form one group; the first question of each group, in file order.
    assert [(p.id, p.group) for p in picked] == [
        ("spec_bench/1", "multi-turn"),
        ("spec_bench/3", "translation"),
        ("spec_bench/5", "rag"),
    ]
    # Two per group come in turns (a run cut short by --deadline still covers every group)
    two = bench.load_prompts(str(questions), per_group=2)
    assert [p.id.split("/")[1] for p in two] == ["1", "3", "5", "2", "4"]
    # --deadline: no prompt starts after it; the result covers the prompts that ran
    out = tmp_path / "cut"
    args = ["--model", "tiny-random", "--dataset", str(questions), "--per-group", "2"]
    args += ["--max-new-tokens", "4", "--peers", "", "--no-overhead", "--out", str(out)]
    args += ["--methods", "autoregressive,prompt_lookup", "--deadline", "1e-9"]
    assert bench.main(args) == 0
    cut = json.loads((out / "results.json").read_text())
    assert cut["prompts"] == ["spec_bench/1"] and cut["cut"] == 4
    assert cut["meta"]["n_prompts"] == 1 and all(r["n"] == 1 for r in cut["rows"])
    with pytest.raises(InvalidInput, match="per-group"):
        bench.load_prompts("humaneval", per_group=1)
    out = tmp_path / "out"
    args = ["--model", "tiny-random", "--dataset", str(questions), "--per-group", "1"]
    args += ["--max-new-tokens", "4", "--peers", "", "--no-overhead", "--out", str(out)]
    args += ["--methods", "autoregressive,prompt_lookup"]
    assert bench.main(args) == 0
    table = capsys.readouterr().out
    assert "by task group" in table and "| multi-turn | translation | rag |" in table
    data = json.loads((out / "results.json").read_text())
    assert data["groups"] == ["multi-turn", "translation", "rag"]
    ar = next(r for r in data["rows"] if r["contestant"] == "autoregressive")
    assert ar["group_speedup"] == {"multi-turn": 1.0, "translation": 1.0, "rag": 1.0}


def test_method_specs_and_bad_peers(tiny):
    assert bench.parse_method("lookahead:N=4:W=5") == ("lookahead", {"N": "4", "W": "5"})
    assert bench.parse_method("speculative:draft=self:8:gamma=3") == (
        "speculative",
        {"draft": "self:8", "gamma": "3"},
    )
    with pytest.raises(InvalidInput):
        bench.parse_method("lookahead:N4")
    with pytest.raises(InvalidInput, match="unknown peer"):
        bench.hf_peer(tiny, "vllm")
