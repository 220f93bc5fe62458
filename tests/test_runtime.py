"""Forward primitives: tree masks, partial depth and cache rollback agree with plain sequential runs."""

import os

import pytest
import torch

from conftest import KERNEL_TOL, close
from decoders.core.runtime import (
    cache_arg,
    cache_length,
    crop_cache,
    forward,
    keep_cache,
    new_cache,
)
from decoders.core.tree import ancestors, chain, depths, leaf_paths, tree_mask, tree_positions
from decoders.engine import NEAR_TIE

PROMPT = [1, 504, 3458, 314, 253, 1345, 28, 1024]
# A tree with two roots, branching at several depths.
PARENTS = (-1, -1, 0, 0, 1, 2, 2, 5)
TREE_TOKENS = [42, 77, 1000, 2001, 303, 4404, 55, 9]


def prefilled(bundle, prompt=PROMPT):
    cache = new_cache(bundle)
    forward(bundle, cache, prompt, step=0, kind="prefill")
    return cache


def sequential_logits(bundle, tokens):
    """Logits for the last of `tokens`, run as a plain chain after the prompt in a fresh cache."""
    cache = prefilled(bundle)
    return forward(bundle, cache, tokens, step=1, kind="target").logits[-1]


def test_tree_helpers():
    assert depths(PARENTS) == [0, 0, 1, 1, 1, 2, 2, 3]
    assert ancestors(PARENTS, 7) == [0, 2, 5, 7]
    assert tree_positions(PARENTS, 10) == [10, 10, 11, 11, 11, 12, 12, 13]
    assert leaf_paths(PARENTS) == [[0, 3], [1, 4], [0, 2, 6], [0, 2, 5, 7]]
    assert chain(3) == (-1, 0, 1)
    mask = tree_mask(PARENTS, cache_len=2)[0, 0]
    allowed = (mask == 0).int().tolist()
    assert allowed[7] == [1, 1, 1, 0, 1, 0, 0, 1, 0, 1]  # cache + nodes 0, 2, 5, 7
    assert allowed[1] == [1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="parent must come before"):
        depths((-1, 2, 0))


def tree_forward(bundle, cache):
    """The tree (PARENTS, TREE_TOKENS) verified in one forward after what `cache` holds."""
    n = cache_length(cache)
    return forward(
        bundle,
        cache,
        TREE_TOKENS,
        step=1,
        kind="verify",
        positions=tree_positions(PARENTS, n),
        mask=tree_mask(PARENTS, n),
    )


def check_tree_matches_sequential(bundle, atol):
    out = tree_forward(bundle, prefilled(bundle))
    assert out.logits.shape == (len(PARENTS), bundle.model.config.vocab_size)
    for node in range(len(PARENTS)):
        path = [TREE_TOKENS[i] for i in ancestors(PARENTS, node)]
        expected = sequential_logits(bundle, path)
        torch.testing.assert_close(out.logits[node], expected, atol=atol, rtol=1e-4)
        top = expected.topk(2).values
        if float(top[0] - top[1]) > NEAR_TIE["float32"]:  # a near-tie may go either way
            assert int(out.logits[node].argmax()) == int(expected.argmax())


def test_tree_masked_forward_matches_sequential_branches(tiny):
    check_tree_matches_sequential(tiny, atol=1e-4)


@pytest.mark.slow
def test_tree_masked_forward_matches_sequential_branches_embedded(embedded):
    check_tree_matches_sequential(embedded, atol=2e-4)


def test_grouped_query_attention_reads_the_cache_in_place_with_the_same_bits(tiny, monkeypatch):
    """On a CPU the models attend with `sdpa_gqa` (decoders/core/attention.py): a masked
    multi-token forward (a tree, or a causal block after the cache) gives exactly the logits of
    transformers' `sdpa`, which copies the cache out to every query head first, and never copies."""
    import transformers.integrations.sdpa_attention as hf_sdpa

    from decoders.core.attention import NAME

    config = tiny.model.config
    assert config.num_key_value_heads < config.num_attention_heads  # tiny-random groups its heads
    loaded_with = config._attn_implementation  # sdpa under DECODING_LAB_GQA=0 (make test-kernels)
    assert loaded_with == ("sdpa" if os.environ.get("DECODING_LAB_GQA") == "0" else NAME)
    copy = hf_sdpa.repeat_kv
    runs = {}
    try:
        for impl in ("sdpa", NAME):
            tiny.model.set_attn_implementation(impl)
            if impl == NAME:  # the grouped path must not copy the cache
                monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda *a: pytest.fail("copied"))
            cache = prefilled(tiny)
            tree = tree_forward(tiny, cache).logits
            crop_cache(cache, len(PROMPT))
            block = forward(tiny, cache, TREE_TOKENS, step=1, kind="verify").logits
            runs[impl] = tree, block
    finally:
        monkeypatch.setattr(hf_sdpa, "repeat_kv", copy)
        tiny.model.set_attn_implementation(loaded_with)
    for before, now in zip(runs["sdpa"], runs[NAME], strict=True):
        assert torch.equal(before, now)


def test_crop_continues_like_a_fresh_cache(tiny):
    cache = prefilled(tiny)
    forward(tiny, cache, [5, 6, 7, 8, 9], step=1, kind="verify")
    crop_cache(cache, len(PROMPT) + 2)  # keep the first two of those five
    assert cache_length(cache) == len(PROMPT) + 2
    continued = forward(tiny, cache, [11, 12], step=2, kind="target").logits
    fresh = new_cache(tiny)
    reference = forward(tiny, fresh, [*PROMPT, 5, 6, 11, 12], step=0, kind="prefill").logits[-2:]
    torch.testing.assert_close(continued, reference, **KERNEL_TOL)


def test_keep_compacts_an_accepted_tree_path(tiny):
    cache = prefilled(tiny)
    n = cache_length(cache)
    tree_forward(tiny, cache)
    path = ancestors(PARENTS, 7)  # nodes 0, 2, 5, 7: not contiguous in the verify input
    keep_cache(cache, n, path)
    assert cache_length(cache) == n + len(path)
    continued = forward(tiny, cache, [99], step=2, kind="target").logits[-1]
    expected = sequential_logits(tiny, [*(TREE_TOKENS[i] for i in path), 99])
    torch.testing.assert_close(continued, expected, **KERNEL_TOL)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_partial_depth_reads_layer_k_through_norm_and_head(tiny, k):
    model = tiny.model
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        states = model(ids, output_hidden_states=True).hidden_states
        expected = model.lm_head(model.model.norm(states[k]))[0]
    out = forward(tiny, new_cache(tiny), PROMPT, step=0, kind="draft", layers=k, hidden_at=(k,))
    assert out.event.layers == k
    torch.testing.assert_close(out.logits, expected, **KERNEL_TOL)
    torch.testing.assert_close(out.hidden[k], states[k][0], **KERNEL_TOL)
    assert model.config.num_hidden_layers == 4  # the model's config is never touched


def test_partial_depth_continues_from_its_own_cache(tiny):
    """A k-layer draft pass over a k-layer cache equals recomputing the k-layer prefix from scratch."""
    cache = new_cache(tiny)
    forward(tiny, cache, PROMPT, step=0, kind="draft", layers=2)
    step = forward(tiny, cache, [7, 8], step=1, kind="draft", layers=2).logits
    fresh = forward(tiny, new_cache(tiny), [*PROMPT, 7, 8], step=0, kind="draft", layers=2).logits[
        -2:
    ]
    torch.testing.assert_close(step, fresh, **KERNEL_TOL)


def test_layer_subsets_and_full_depth(tiny):
    full = forward(tiny, new_cache(tiny), PROMPT, step=0, kind="target")
    all_layers = forward(tiny, new_cache(tiny), PROMPT, step=0, kind="target", layers=[0, 1, 2, 3])
    torch.testing.assert_close(full.logits, all_layers.logits)
    skip = forward(tiny, new_cache(tiny), PROMPT, step=0, kind="draft", layers=[0, 2, 3])
    assert skip.event.layers == 3
    assert not torch.allclose(skip.logits, full.logits)
    with pytest.raises(ValueError, match="layers must select"):
        forward(tiny, new_cache(tiny), PROMPT, step=0, kind="draft", layers=[0, 9])


def test_forward_event_and_logits_to_keep(tiny):
    out = forward(tiny, new_cache(tiny), PROMPT, step=3, kind="prefill", logits_to_keep=1)
    assert out.logits.shape[0] == 1
    ev = out.event
    assert (ev.step, ev.kind, ev.n_input_tokens, ev.layers) == (3, "prefill", len(PROMPT), 4)
    assert ev.wall_ms > 0


def test_packed_linear_matches_torch_linear():
    from decoders.core import packing

    if not packing.available():
        pytest.skip("this torch build has no oneDNN packed linear")
    torch.manual_seed(0)
    # 256 x 300 weights are packed; 7 x 256 are too few to pay for oneDNN's call (MIN_PACKED)
    net = torch.nn.Sequential(torch.nn.Linear(300, 256), torch.nn.ReLU(), torch.nn.Linear(256, 7))
    x = torch.randn(2, 5, 300)
    expected = net(x)
    assert packing.pack_linears(net) == 2
    assert all(not isinstance(m, torch.nn.Linear) for m in net.modules())
    assert net[0].packed_weight is not None and net[2].packed_weight is None
    assert "small: not packed" in repr(net[2])
    with torch.inference_mode():
        assert close(net(x), expected)  # oneDNN's packed kernel against torch's
    assert set(net.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # still saveable
    small_only = packing.PackedLinear(torch.nn.Linear(256, 7), keep_weight=False)
    assert small_only.weight is not None  # its only copy: a small layer keeps its weight


@pytest.mark.parametrize("packable", [True, False])
def test_a_bfloat16_linear_runs_where_onednn_cannot_pack_it(monkeypatch, packable):
    """oneDNN packs bfloat16 weights only on AVX512 / AVX-NE-CONVERT CPUs and raises on AVX2 ones
    (a 2-core AMD EPYC): there a bfloat16 head's linears run through F.linear instead."""
    from decoders.core import packing

    if not packing.available():
        pytest.skip("this torch build has no oneDNN packed linear")
    if packable and not packing.bf16_packable():
        pytest.skip("oneDNN cannot pack bfloat16 weights on this CPU")
    monkeypatch.setattr(packing, "bf16_packable", lambda: packable)
    torch.manual_seed(0)
    linear = torch.nn.Linear(300, 256).bfloat16()
    x = torch.randn(2, 5, 300).bfloat16()
    expected = linear(x)
    packed = packing.PackedLinear(linear)
    assert (packed.packed_weight is not None) is packable
    assert ("cannot pack" in repr(packed)) is not packable
    with torch.inference_mode():
        assert torch.allclose(packed(x).float(), expected.float(), atol=5e-2)


def test_drafting_heads_run_in_bfloat16_only_beside_float32_on_a_cpu_that_has_it(monkeypatch):
    from decoders.core import packing

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("DECODING_LAB_DRAFT_BF16", raising=False)  # (make test-kernels sets it)
    monkeypatch.setattr(packing, "available", lambda: True)
    monkeypatch.setattr(packing, "native_bf16", lambda: True)
    assert packing.draft_dtype(cpu, torch.float32) == torch.bfloat16
    assert packing.draft_dtype(cpu, torch.float16) == torch.float16  # never below the target
    assert packing.draft_dtype(cuda, torch.float32) == torch.float32  # a GPU's float32 is a choice
    monkeypatch.setenv("DECODING_LAB_DRAFT_BF16", "0")
    assert packing.draft_dtype(cpu, torch.float32) == torch.float32
    monkeypatch.delenv("DECODING_LAB_DRAFT_BF16")
    monkeypatch.setattr(packing, "native_bf16", lambda: False)  # emulated bfloat16 is slower
    assert packing.draft_dtype(cpu, torch.float32) == torch.float32


def test_tiny_models_draft_in_their_own_dtype(tiny):
    assert tiny.draft_dtype == tiny.dtype == torch.float32


def test_skipping_every_block_leaves_embedding_norm_and_head(tiny):
    from decoders.core.runtime import SkipSet

    every = frozenset(range(tiny.n_layers))
    cache = new_cache(tiny)
    forward(tiny, cache, [5, 6, 7], step=0, kind="prefill")
    out = forward(tiny, cache, [9], step=1, kind="draft", positions=[3], skip=SkipSet(every, every))
    inner = tiny.model.model
    with torch.inference_mode():
        expected = tiny.model.lm_head(inner.norm(inner.embed_tokens(torch.tensor([[9]]))))[0]
    assert close(out.logits, expected)
    assert cache_length(cache) == 3  # skipped attention wrote no KV
    assert out.event.layers == 0


def test_skipping_nothing_but_one_mlp_matches_a_reference_layer_loop(tiny):
    """Skip-forward with one MLP left out equals the layers run by hand without that MLP."""
    from decoders.core.runtime import SkipSet

    cache = new_cache(tiny)
    forward(tiny, cache, [5, 6, 7], step=0, kind="prefill")
    out = forward(tiny, cache, [9], step=1, kind="draft", positions=[3], skip=SkipSet(mlp={2}))
    ref_cache = new_cache(tiny)
    forward(tiny, ref_cache, [5, 6, 7], step=0, kind="prefill")
    inner = tiny.model.model
    with torch.inference_mode():
        ids, pos = torch.tensor([[9]]), torch.tensor([[3]])
        h = inner.embed_tokens(ids)
        rope = inner.rotary_emb(h, position_ids=pos)
        for i, layer in enumerate(inner.layers):
            a, _ = layer.self_attn(
                hidden_states=layer.input_layernorm(h),
                attention_mask=None,
                position_ids=pos,
                **cache_arg(ref_cache),
                use_cache=True,
                position_embeddings=rope,
            )
            h = h + a
            if i != 2:
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        expected = tiny.model.lm_head(inner.norm(h))[0]
        full = forward(tiny, new_cache(tiny), [5, 6, 7, 9], step=0, kind="prefill").logits[-1]
    assert close(out.logits, expected)
    assert not torch.allclose(out.logits[0], full, atol=1e-3)  # the skipped MLP mattered
