"""A model spread over devices with accelerate (load_model's device_map): here, with no GPU, a tiny
model whose middle layers are offloaded to disk (accelerate keeps their weights on the meta device
and brings them in only while they run). Every lossless method must still match greedy token for
token, the early exits that call a layer's parts one by one (state propagation, skipped sublayers,
SPACE's mask rows) must run, and bad maps are refused by name."""

from __future__ import annotations

import pytest

from conftest import PROMPTS, one_thread
from decoders import METHODS, InvalidInput, generate, load_model

# Layers 1 and 2 of 4 on disk; the embeddings, the norm and the (tied) LM head stay on the CPU.
OFFLOADED = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.layers.3": "cpu",
    "model.norm": "cpu",
    "lm_head": "cpu",
}
LOSSLESS = [name for name, m in METHODS.items() if m.lossless]
PARAMS = {"kangaroo": {"exit_layer": "1"}}  # the tiny model's adapters ship for ℓ = 1 and 2


@pytest.fixture(autouse=True)
def one_torch_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def spread():
    bundle = load_model("tiny-random", device_map=OFFLOADED)
    layer = bundle.model.model.layers[1]
    assert layer.self_attn.q_proj.weight.device.type == "meta"  # really offloaded
    assert bundle.device_map == OFFLOADED and not bundle.packed
    return bundle


@pytest.mark.slow
@pytest.mark.parametrize("method", LOSSLESS)
def test_every_lossless_method_matches_greedy_with_layers_offloaded(spread, tiny, method):
    for prompt in (PROMPTS[0], PROMPTS[1]):
        ids = tiny.encode(prompt, chat=False)
        want = generate(tiny, ids, "autoregressive", 24).token_ids
        got = generate(spread, ids, method, 24, **PARAMS.get(method, {}))
        assert got.token_ids == want, (method, prompt)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("calm", {"threshold": 0.0, "min_depth": 0.0}),  # every token exits: propagation
        ("hash_ee", {"min_depth": 0.0}),
        ("self_speculative", {"skip": "attn:1,2 mlp:2"}),  # sublayers of offloaded layers
        ("mask_predict", {}),
    ],
)
def test_methods_that_run_a_layers_parts_one_by_one_give_the_same_output(
    spread, tiny, method, params
):
    ids = tiny.encode(PROMPTS[3], chat=False)
    want = generate(tiny, ids, method, 20, **params)
    got = generate(spread, ids, method, 20, **params)
    assert got.token_ids == want.token_ids
    assert got.stats["layers_per_token"] == want.stats["layers_per_token"]


@pytest.mark.parametrize(
    ("device_map", "message"),
    [
        ("everywhere", "use 'auto'"),
        ("{not json", "not valid JSON"),
        ({"model.layers.0": "gpu7"}, "a GPU index, 'cpu' or 'disk'"),
        ({"model.embed_tokens": "cpu"}, "places no device for"),
    ],
)
def test_a_bad_device_map_is_refused_by_name(device_map, message):
    with pytest.raises(InvalidInput, match=message):
        load_model("tiny-random", device_map=device_map)


def test_a_budget_that_leaves_the_model_no_device_is_refused_by_name():
    with pytest.raises(InvalidInput, match="whole model on disk"):
        load_model("tiny-random", device_map="auto", max_memory={"cpu": "1MB"})


def test_max_memory_is_read_as_device_size_pairs():
    from decoders.core.models import _device_plan

    plan = _device_plan("auto", "0=20GiB, cpu=60GiB")
    assert plan.memory() == {0: "20GiB", "cpu": "60GiB"}
    with pytest.raises(InvalidInput, match="DEVICE=SIZE"):
        _device_plan("auto", "20GiB")


def test_auto_on_a_machine_without_a_gpu_fills_the_cpu_within_its_budget_then_disk():
    """'auto' with a CPU budget smaller than the model: what does not fit goes to disk, and the
    output is still greedy's."""
    # the tied embedding is 12.6 MB of the tiny model's 13.2: room for it and one layer
    bundle = load_model("tiny-random", device_map="auto", max_memory={"cpu": "12.9MB"})
    assert "disk" in set(bundle.device_map.values()), bundle.device_map
    tiny = load_model("tiny-random")
    ids = tiny.encode(PROMPTS[1], chat=False)
    assert (
        generate(bundle, ids, "token_tree", 16).token_ids
        == generate(tiny, ids, "autoregressive", 16).token_ids
    )
