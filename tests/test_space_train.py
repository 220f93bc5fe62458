"""SPACE's trainer (decoders/train/space.py) on tiny-random's own target states: a few steps lower
the loss, mask decay weighs each mask's rows, full SFT leaves the shared model alone and its
model decodes losslessly against its own greedy, and the training layout is what decoding
computes.
"""

import random

import pytest
import torch
from test_space import (
    one_torch_thread,  # noqa: F401  (autouse)
    same_as_greedy,
)

from conftest import KERNEL_TOL, PROMPTS
from decoders import generate
from decoders.train import space as trainer
from decoders.train.corpus import Corpus
from decoders.train.states import target_states, windows
from decoders.trained.mask_model import MaskAdapter, load_adapter, masked_forward

# --- training -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def states(tiny):
    docs = []
    for prompt in PROMPTS:
        ref = generate(tiny, prompt, "autoregressive", 40, chat=False, record=False)
        docs.append(tiny.encode(prompt, chat=False) + list(ref.token_ids))
    return target_states(tiny, Corpus(docs, ["code"] * len(docs)))


def fit(loss, parameters, lr: float, steps: int) -> tuple[dict, dict]:
    """The loss's outputs before and after `steps` of AdamW on a fixed batch."""
    with torch.no_grad():
        before = loss()
    opt = torch.optim.AdamW(parameters, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss()["loss"].backward()
        opt.step()
    with torch.no_grad():
        return before, loss()


def test_a_few_steps_lower_the_loss_on_a_fixed_batch(tiny, states):
    batch = windows(states, list(range(len(states.starts))), 32)[:4]
    torch.manual_seed(0)
    adapter = MaskAdapter(tiny.model.config, 3, 4, 8)

    def loss():
        out = trainer.run_masks(tiny, adapter, states, batch, 6, random.Random(0))
        return trainer.losses(tiny.model.lm_head, *out, 3)

    before, after = fit(loss, adapter.parameters(), lr=1e-2, steps=25)
    assert float(after["loss"]) < float(before["loss"]) - 0.5
    assert sum(float(after[f"top1_m{j}"]) for j in (1, 2, 3)) > 0.3


def test_mask_decay_weighs_each_mask_s_rows_by_its_power(tiny, states):
    batch = windows(states, list(range(len(states.starts))), 32)[:2]
    torch.manual_seed(0)
    adapter = MaskAdapter(tiny.model.config, 3, 4, 8)
    with torch.no_grad():
        logits, target, valid = trainer.run_masks(tiny, adapter, states, batch, 4, random.Random(0))
        p = torch.softmax(tiny.model.lm_head(target), -1)
        ce = -(p * torch.log_softmax(logits, -1)).sum(-1)  # [b, G·k]
        mask_of = torch.arange(ce.shape[1]) % 3
        per_mask = [ce[valid & (mask_of == j)].mean() for j in range(3)]
        alike = trainer.losses(tiny.model.lm_head, logits, target, valid, 3)
        first = trainer.losses(tiny.model.lm_head, logits, target, valid, 3, decay=0.0)
        half = trainer.losses(tiny.model.lm_head, logits, target, valid, 3, decay=0.5)
    torch.testing.assert_close(alike["loss"], ce[valid].mean())
    torch.testing.assert_close(first["loss"], per_mask[0])  # 0^0 = 1: mask 1 alone
    n = [int((valid & (mask_of == j)).sum()) for j in range(3)]
    w = [0.5**j * n[j] for j in range(3)]
    expected = sum(wj * m for wj, m in zip(w, per_mask, strict=True)) / sum(w)
    torch.testing.assert_close(half["loss"], expected)
    assert alike["top1_m1"] == first["top1_m1"]  # agreement is not weighted


@pytest.mark.parametrize("decay", ["-0.5", "1.5", "lots"])
def test_a_mask_decay_outside_0_1_is_refused_before_any_work(decay, capsys):
    from decoders.train.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["space", "--model", "tiny-random", "--mask-decay", decay])
    assert exit_.value.code == 2
    assert "--mask-decay" in capsys.readouterr().err


def test_full_sft_lowers_the_loss_and_leaves_the_shared_model_alone(tiny, states):
    """(b), the paper's SFT: every weight of a copy learns; the served model is never touched."""
    batch = windows(states, list(range(len(states.starts))), 32)[:2]
    before_w = tiny.model.model.layers[0].mlp.up_proj.weight.clone()
    torch.manual_seed(0)
    sft = trainer.FullSFT(tiny, 3)

    def loss():
        out = trainer.run_full(sft, tiny, states, batch, 4, random.Random(0))
        return trainer.full_losses(tiny.model.lm_head, *out, k=3)

    with torch.no_grad():  # untrained, the copy's real rows are the original model's
        real_logits, real_target, real_valid, *_ = trainer.run_full(
            sft, tiny, states, batch, 4, random.Random(0)
        )
        original = tiny.model.lm_head(real_target[real_valid])
        torch.testing.assert_close(real_logits[real_valid], original, atol=1e-3, rtol=0)
    before, after = fit(loss, sft.parameters(), lr=2e-3, steps=12)
    assert float(after["mask_loss"]) < float(before["mask_loss"]) - 0.3
    assert torch.equal(tiny.model.model.layers[0].mlp.up_proj.weight, before_w)
    assert not any(p.requires_grad for p in tiny.model.parameters())


def test_a_fully_tuned_model_decodes_losslessly_against_its_own_greedy(tiny, states, tmp_path):
    import argparse

    from decoders import load_model
    from decoders.train.states import Prepared

    docs = list(range(len(states.starts)))
    prep = Prepared(tiny, Corpus([], []), states, docs[:-1], docs[-1:], 0.0)
    args = argparse.Namespace(
        k=3, groups=4, window=32, batch_size=2, epochs=1, lr=2e-3, mask_lr=1e-2, warmup=0.1, max_steps=4,
        minutes=0.0, resume=False, seed=0, out=tmp_path / "sft", mask_decay=0.8,
    )  # fmt: skip
    card = trainer.train_full(prep, args, ["space", "--full"])
    assert card["variant"].startswith("full SFT") and card["steps"] == 4
    assert card["mask_decay"] == 0.8
    assert {f"top1_code_m{j}" for j in (1, 2, 3)} <= set(card["held_out_top1"])
    tuned = load_model(str(tmp_path / "sft"))
    assert load_adapter(tuned).rank == 0  # the mask alone: the model itself learned it
    for prompt in PROMPTS[:3]:
        same_as_greedy(tuned, prompt, 30, k=3, groups=3)
        same_as_greedy(tuned, prompt, 9, k=2, groups=1)


def test_the_training_layout_is_what_decoding_computes(tiny, states):
    """A mask group in the training pass (real tokens cached first, many groups at once) gives the
    same logits as the decoder's prefill of the text up to its cut, followed by k masks."""
    torch.manual_seed(2)
    adapter = MaskAdapter(tiny.model.config, 3, 4, 8)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_(0, 0.2)
    a, b = states.span(1)
    rng = random.Random(5)
    with torch.no_grad():
        logits, _, _ = trainer.run_masks(tiny, adapter, states, [(a, b)], 4, rng)
    cuts = sorted(random.Random(5).sample(range(max(1, b - a - 3)), 4))
    for g, s in enumerate(cuts):
        ids = states.tokens[a : a + s + 1].tolist()
        n = len(ids)
        mask = torch.full((n + 3, n + 3), float("-inf")).triu(1)
        mask[n:, n:] = torch.full((3, 3), float("-inf")).triu(1)
        with torch.no_grad():
            feats = masked_forward(
                tiny,
                adapter,
                None,
                torch.tensor([ids + [0] * 3]),
                n,
                torch.arange(n + 3)[None],
                mask[None, None],
            )
        torch.testing.assert_close(
            logits[0, g * 3 : g * 3 + 3], tiny.model.lm_head(feats[0, n:]), **KERNEL_TOL
        )
