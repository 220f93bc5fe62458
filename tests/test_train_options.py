"""decoders.train's options and checks that need no shared target states, on tiny-random: --loss-on
answers, a --minutes budget, --init from git, a warm start refused for SPACE masks of another
configuration, the probe (greedy answers to the tuning prompts), and CALM's exits oracle. The
cache goes to a temporary DECODING_LAB_CACHE.
"""

import argparse
import json

import pytest
import torch
from test_train import (
    ELL,
    one_torch_thread,  # noqa: F401  (autouse)
    private_cache,  # noqa: F401  (autouse)
)

from conftest import ROOT
from decoders import generate
from decoders.train.loop import Loop, init_weights, warm_start
from decoders.train.states import States, answers_only, assistant_header, probe_states
from decoders.trained.artifacts import save_artifact


def test_answers_only_scores_chat_from_the_assistant_header_and_code_everywhere(tiny):
    """--loss-on answers: in a chat document the predictions count from the header's last token
    (it predicts the answer's first token); a code document keeps every position; a chat
    document with no answer header scores nothing."""
    assert tiny.tokenizer.decode(assistant_header(tiny)) == "<|im_start|>assistant\n"
    chat = [*tiny.encode("What is a list?", chat=True), 11, 12, 13]
    code, headless = [5, 6, 7, 8], [9, 10, 11]
    tokens = chat + code + headless
    states = States(
        tokens=torch.tensor(tokens),
        starts=[0, len(chat), len(chat) + len(code)],
        features=torch.zeros(len(tokens), 4),
        layers={},
        sources=["chat", "code", "task"],
    )
    scored = answers_only(tiny, states).scored.tolist()
    header_end = len(chat) - 4  # the header's last token, then the answer's 3 tokens
    assert scored[: len(chat)] == [False] * header_end + [True] * 4
    assert scored[len(chat) : len(chat) + len(code)] == [True] * 4
    assert scored[len(chat) + len(code) :] == [False] * 3
    assert states.scored is None  # the original is left as it was


def test_a_time_budget_fits_the_run_and_its_schedule_to_the_minutes():
    """--minutes: the first steps are timed, then the run is cut to what fits and the cosine
    schedule ends with it. A clock the loss advances by one second a step makes it exact."""
    now = [0.0]

    def step_loss(batch):
        now[0] += 1.0
        return {"loss": (module(batch) ** 2).mean()}

    module = torch.nn.Linear(4, 1)
    batches = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(50)]
    loop = Loop(epochs=4, lr=1e-2, minutes=0.5, clock=lambda: now[0])
    lrs = []
    original = torch.optim.AdamW.step

    def spy(opt, *a, **kw):
        lrs.append(opt.param_groups[0]["lr"])
        return original(opt, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", spy)
        result = loop.fit(module, batches, step_loss, lambda: {"x": 1.0})
    # 9 steps timed (the first is warm-up), 9 s spent of 30: 21 more steps fit, of 200.
    assert result["steps"] == 30
    assert [(h["epoch"], h["step"]) for h in result["history"]] == [(1, 30)]
    assert lrs[-1] < 0.01 * max(lrs)  # the schedule decayed within the budget, not over 200
    assert max(lrs) == pytest.approx(1e-2, rel=0.1)


def test_a_time_budget_stops_the_run_once_the_minutes_are_spent():
    """Steps that slow down after the timing (an evaluation, a busy machine) cannot overrun the
    budget: the run stops, scored, once the minutes are spent."""
    now = [0.0]
    module = torch.nn.Linear(4, 1)

    def step_loss(batch):
        now[0] += 1.0 if now[0] < 9 else 3.0  # 1 s per step while timed, then 3 s
        return {"loss": (module(batch) ** 2).mean()}

    batches = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(50)]
    loop = Loop(epochs=4, lr=1e-2, minutes=0.5, clock=lambda: now[0])
    result = loop.fit(module, batches, step_loss, lambda: {"x": 1.0})
    # 30 steps were fitted; at 3 s a step the 30 s run out after step 17 (33 s)
    assert result["steps"] == 17
    assert [(h["epoch"], h["step"]) for h in result["history"]] == [(1, 17)]


def test_init_reads_a_committed_head_from_git(tmp_path):
    committed = init_weights("git:HEAD:assets/eagle/tiny-random.safetensors")
    from safetensors.torch import load_file

    on_disk = load_file(str(ROOT / "assets" / "eagle" / "tiny-random.safetensors"))
    assert committed.keys() == on_disk.keys()
    with pytest.raises(SystemExit, match="no-such-file"):
        init_weights("git:HEAD:assets/eagle/no-such-file.safetensors")


def test_a_warm_start_refuses_space_masks_of_another_configuration(tiny, tmp_path):
    """SPACE's k, rank and alpha live in a float buffer: a warm start from masks trained with
    another alpha would load their weights under this run's card, so it is refused."""
    from decoders.trained.mask_model import MaskAdapter

    config = tiny.model.config
    trained = MaskAdapter(config, 3, 4, 8)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p))
    path = tmp_path / "space.safetensors"
    save_artifact(trained, path, {"model": "tiny-random"})
    same = MaskAdapter(config, 3, 4, 8)
    warm_start(same, str(path))
    assert all(
        torch.equal(p, q.half().float())
        for p, q in zip(same.parameters(), trained.parameters(), strict=True)
    )
    with pytest.raises(SystemExit, match=r"its meta is \[3.0, 4.0, 8.0\], this run's"):
        warm_start(MaskAdapter(config, 3, 4, 16), str(path))


# --- the probe: agreement outside the corpus ------------------------------------------------------


def test_the_probe_is_the_targets_greedy_answers_to_the_tuning_prompts_scored_on_answers(tiny):
    args = argparse.Namespace(probe_tokens=5, no_cache=False)
    probe = probe_states(tiny, (ELL,), args)
    rows = [json.loads(line) for line in (ROOT / "assets" / "tuning_prompts.jsonl").open()]
    assert probe.sources == ["probe"] * len(rows) and ELL in probe.layers
    for doc, row in enumerate(rows):
        prompt = tiny.encode(row["prompt"], chat=row["chat"])
        answer = generate(tiny, row["prompt"], "autoregressive", 5, chat=row["chat"], record=False)
        a, b = probe.span(doc)
        assert probe.tokens[a:b].tolist() == prompt + list(answer.token_ids)
        # scored: the prompt's last token (it predicts the first answer token) and the answer's
        assert probe.scored_at(a, b).tolist() == [False] * (len(prompt) - 1) + [True] * (
            b - a - len(prompt) + 1
        )
    assert torch.equal(probe_states(tiny, (ELL,), args).tokens, probe.tokens)  # cached


def test_the_exits_oracle_leaves_at_the_first_exit_that_agrees_with_the_final_layer():
    """CALM's oracle in the exits card: an exit whose features are the final ones agrees wherever
    the final token is in the draft vocabulary, so those tokens leave there (or earlier); a final
    token outside it can leave nowhere early; exits that never agree leave every token at L."""
    from types import SimpleNamespace

    from decoders.train.exits import oracle_depth
    from decoders.train.states import States

    torch.manual_seed(0)
    n, d, n_layers = 40, 8, 10
    feats = torch.randn(n, d)
    head = torch.randn(50, d)  # the full LM head; the exits score its first 30 rows
    w = head[:30]
    exits = SimpleNamespace(
        exit_layers=[2, 5], features=lambda i, h, norm: h, vocab=torch.arange(30)
    )
    noise = {ell: torch.randn(n, d) for ell in (2, 5)}
    final = (feats @ head.T).argmax(-1)

    def states(layers):
        return States(torch.zeros(n, dtype=torch.long), [0, 25], feats, layers, ["chat", "code"])

    def depth(at_2, at_5):
        hit_2, hit_5 = (at_2 @ w.T).argmax(-1) == final, (at_5 @ w.T).argmax(-1) == final
        return torch.where(hit_2, 2.0, torch.where(hit_5, 5.0, float(n_layers))) / n_layers

    perfect_at_5 = oracle_depth(exits, None, w, head, states({2: noise[2], 5: feats}), [0, 1], 10)
    expect = depth(noise[2], feats)
    assert 0 < int((final >= 30).sum()) < n  # some final tokens lie outside the draft vocabulary
    assert perfect_at_5["layers"] == pytest.approx(float(expect.mean()), abs=1e-4)
    assert perfect_at_5["layers_code"] == pytest.approx(float(expect[25:].mean()), abs=1e-4)
    assert set(perfect_at_5) == {"layers", "layers_chat", "layers_code"}
    # random states at both exits: a token runs all L layers unless one happens to agree
    got = oracle_depth(exits, None, w, head, states(noise), [0, 1], n_layers)
    assert got["layers"] == pytest.approx(float(depth(noise[2], noise[5]).mean()), abs=1e-4)
    assert got["layers"] > perfect_at_5["layers"]
