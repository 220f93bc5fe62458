"""Published drafters (decoders/trained/published.py): EAGLE-3 heads in SafeAILab/EAGLE's layout and
Medusa heads in FasterDecoding/Medusa's, written here over tiny-random's width and loaded by path;
and our trainer's official-architecture head written in that layout.

The EAGLE-3 forward is checked against the paper's equations recomputed from the raw tensors
(with the official code's norms); every method that drafts with a published head is checked
token for token against autoregressive greedy, with heads that get drafts accepted.
"""

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from conftest import PROMPTS, greedy, matches_greedy, one_thread
from decoders import InvalidParameter, generate
from decoders.train.corpus import Corpus
from decoders.train.eagle import fit_head, official_layers
from decoders.train.states import Prepared, target_states
from decoders.trained import published
from decoders.trained.artifacts import save_artifact
from decoders.trained.eagle import EagleHead
from decoders.trained.medusa_heads import heads_for, heads_path, load_heads

LAYERS = (1, 2, 3)  # tiny-random has 4 layers: EAGLE-3's default 2, L // 2, L - 3 collapses


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    with one_thread():
        yield


def randn(g, *shape, scale=0.1):
    return torch.randn(*shape, generator=g) * scale


def eagle3_state(tiny, draft_vocab=512, width=None, seed=0, heads=4, kv=2, head_dim=16):
    """Random weights in the official layout over tiny-random (d = 64; `width`: the target's)."""
    g = torch.Generator().manual_seed(seed)
    d, vocab = tiny.model.config.hidden_size, tiny.model.config.vocab_size
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    inter = 96
    state = {
        "fc.weight": randn(g, d, 3 * (width or d)),
        "midlayer.input_layernorm.weight": 1 + randn(g, d),
        "midlayer.hidden_norm.weight": 1 + randn(g, d),
        "midlayer.post_attention_layernorm.weight": 1 + randn(g, d),
        "midlayer.self_attn.q_proj.weight": randn(g, heads * head_dim, 2 * d),
        "midlayer.self_attn.k_proj.weight": randn(g, kv * head_dim, 2 * d),
        "midlayer.self_attn.v_proj.weight": randn(g, kv * head_dim, 2 * d),
        "midlayer.self_attn.o_proj.weight": randn(g, d, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": randn(g, inter, d),
        "midlayer.mlp.up_proj.weight": randn(g, inter, d),
        "midlayer.mlp.down_proj.weight": randn(g, d, inter),
        "norm.weight": 1 + randn(g, d),
        "lm_head.weight": randn(g, draft_vocab, d, scale=1.0),
        "d2t": ids - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill(0, ids, True),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "eagle_aux_hidden_state_layer_ids": list(LAYERS),
    }
    return state, config


def write(folder, state, config, weights="model.safetensors", config_name="config.json"):
    folder.mkdir(parents=True, exist_ok=True)
    if weights.endswith(".safetensors"):
        save_file(state, str(folder / weights))
    else:
        torch.save(state, folder / weights)
    if config is not None:
        (folder / config_name).write_text(json.dumps(config))
    return folder


def rms(x, w, eps=1e-6):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x, positions, theta=10000.0):
    """RoPE on [heads, n, hd]: pairs (i, i + hd/2) turned by position x theta^(-2i/hd)."""
    hd = x.shape[-1]
    angle = positions[:, None].double() / theta ** (torch.arange(0, hd, 2).double() / hd)
    cos, sin = torch.cat([angle.cos()] * 2, -1).float(), torch.cat([angle.sin()] * 2, -1).float()
    return x * cos + torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1) * sin


def reference_eagle3(s, embeds, g_in, heads=4, kv=2):
    """EAGLE-3's layer from the raw tensors, the whole sequence at once under a causal mask:
    u = [norm_in(e) ; norm_h(g)], a = g + O·attn(Q u, K u, V u), out = a + MLP(norm_post(a)),
    logits = lm_head(norm(out))."""
    n = len(g_in)
    u = torch.cat(
        [
            rms(embeds, s["midlayer.input_layernorm.weight"]),
            rms(g_in, s["midlayer.hidden_norm.weight"]),
        ],
        -1,
    )
    hd = s["midlayer.self_attn.q_proj.weight"].shape[0] // heads
    pos = torch.arange(n)
    q = rotate(
        (u @ s["midlayer.self_attn.q_proj.weight"].T).view(n, heads, hd).transpose(0, 1), pos
    )
    k = rotate((u @ s["midlayer.self_attn.k_proj.weight"].T).view(n, kv, hd).transpose(0, 1), pos)
    v = (u @ s["midlayer.self_attn.v_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    att = (q @ k.transpose(1, 2)) / hd**0.5
    att = att.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    a = g_in + (att @ v).transpose(0, 1).reshape(n, -1) @ s["midlayer.self_attn.o_proj.weight"].T
    m = rms(a, s["midlayer.post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(m @ s["midlayer.mlp.gate_proj.weight"].T) * (
        m @ s["midlayer.mlp.up_proj.weight"].T
    )
    out = a + mlp @ s["midlayer.mlp.down_proj.weight"].T
    return out, rms(out, s["norm.weight"]) @ s["lm_head.weight"].T


def official_fit(tiny, tmp_path_factory):
    """A head of the official architecture trained by our loop (`--official`) on tiny-random's
    greedy continuations of the test prompts, for a few epochs: enough for drafts to be taken."""
    docs = []
    for prompt in PROMPTS[:3]:
        docs.append(
            tiny.encode(prompt, chat=False) + list(greedy(tiny, prompt, 40, chat=False).token_ids)
        )
    corpus = Corpus(docs, ["code"] * len(docs))
    every = list(range(len(docs)))
    prep = Prepared(tiny, corpus, target_states(tiny, corpus, LAYERS), every, every, 0.0)
    args = argparse.Namespace(
        vocab=1024,
        window=32,
        batch_size=4,
        epochs=10,
        lr=1e-2,
        seed=0,
        cls_weight=1.0,
        warmup=0.05,
        max_steps=0,
        minutes=0.0,
        resume=False,
        init=None,
        official=True,
        fuse=LAYERS,
        unroll=2,
        reg_weight=0.0,
        step_decay=0.8,
        topk=0,
    )
    head, _ = fit_head(prep, args)
    return head


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """(trained head, our artifact file, the folder it was exported to in the official layout)."""
    head = official_fit(tiny, tmp_path_factory)
    root = tmp_path_factory.mktemp("official")
    save_artifact(head, root / "ours.safetensors", {"model": tiny.model_id})
    published.export_eagle3(head, tiny, root / "export")
    return head, root / "ours.safetensors", root / "export"


# --- EAGLE-3 --------------------------------------------------------------------------------------


def test_the_eagle3_forward_is_the_papers(tiny, tmp_path):
    state, config = eagle3_state(tiny)
    folder = write(tmp_path / "head", state, config)
    what = "test"
    head = published.build_eagle3(tiny, published.locate(str(folder), what), what)
    assert head.fused_layers == LAYERS
    assert torch.equal(head.token_ids, torch.arange(512) + state["d2t"])
    g = torch.Generator().manual_seed(1)
    n, d = 6, 64
    embeds = randn(g, n + 1, d, scale=1.0)
    h3 = randn(g, n, 3 * d, scale=1.0)  # the target's states after layers 1, 2, 3
    fused = h3 @ state["fc.weight"].T
    with torch.no_grad():
        assert torch.allclose(head.fused(torch.cat([h3, randn(g, n, d)], -1)), fused, atol=1e-5)
        cache = DynamicCache()
        first = head(embeds[None, :n], fused[None], torch.arange(n)[None], None, cache)[0]
        # The second draft step: fed the head's own output at the last position, cached history.
        second = head(embeds[None, n:], first[None, -1:], torch.tensor([[n]]), None, cache)[0]
        logits = head.scores(torch.cat([first, second]))
    out, ref_logits = reference_eagle3(state, embeds, torch.cat([fused, first[-1:]]))
    assert torch.allclose(torch.cat([first, second]), out, atol=1e-4, rtol=1e-4)
    assert torch.allclose(logits, ref_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["speculative", "token_tree"])
def test_a_published_eagle3_head_drafts_and_stays_greedy(tiny, exported, method):
    source = f"eagle3:{exported[2]}"
    accepted = 0
    for prompt in PROMPTS[:2]:
        res = matches_greedy(tiny, prompt, 32, method, chat=False, draft=source)
        accepted += res.stats["accepted_drafts"]
    assert accepted > 0  # its drafts are taken: the head runs as it was trained
    assert res.params["draft"] == source


def test_a_random_eagle3_head_in_a_bin_file_stays_greedy(tiny, tmp_path):
    state, config = eagle3_state(tiny, seed=3)
    folder = write(tmp_path / "bin", state, config, weights="pytorch_model.bin")
    matches_greedy(tiny, PROMPTS[0], 16, "token_tree", chat=False, draft=f"eagle3:{folder}")


def test_export_writes_the_official_layout_exactly(tiny, exported):
    head, ours, folder = exported
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert config["draft_vocab_size"] == len(head.token_ids) and "target_hidden_size" not in config
    state = load_file(str(folder / "model.safetensors"))
    d = tiny.model.config.hidden_size
    assert state["fc.weight"].shape == (d, 3 * d)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * d
    ids = torch.arange(len(state["d2t"])) + state["d2t"]
    assert torch.equal(ids, head.token_ids.cpu()) and int(state["t2d"].sum()) == len(ids)
    # Read back, it is our saved head, weight for weight (both float16 on disk).
    what = "test"
    back = published.build_eagle3(tiny, published.locate(str(folder), what), what)
    mine = published.read_official_artifact(tiny, ours)
    assert back.state_dict().keys() == mine.state_dict().keys()
    for k, v in mine.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # and our own loader drafts with the saved file as `eagle:<file>`, lossless too
    matches_greedy(tiny, PROMPTS[1], 24, "speculative", chat=False, draft=f"eagle:{ours}")


def test_the_export_command_writes_the_saved_head_as_training_did(tiny, exported, tmp_path):
    _, ours, folder = exported
    assert published.main(["export", "--model", "tiny-random", str(ours), str(tmp_path)]) == 0
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), name


def test_the_official_architecture_needs_three_layers(tiny):
    args = argparse.Namespace(fuse=())
    with pytest.raises(SystemExit, match=r"not three distinct layers.*--fuse"):
        official_layers(tiny, args)  # 2, L // 2, L - 3 of a 4-layer model: 2, 2, 1
    with pytest.raises(SystemExit, match=r"three increasing layers in 1\.\.3"):
        official_layers(tiny, argparse.Namespace(fuse=(1, 2, 4)))
    assert official_layers(tiny, argparse.Namespace(fuse=LAYERS)) == LAYERS


def test_our_own_head_is_never_exported(tiny, tmp_path):
    head = EagleHead(tiny.model.config, torch.arange(64), (1, 2))
    with pytest.raises(InvalidParameter, match="official EAGLE-3 architecture"):
        published.export_eagle3(head, tiny, tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 128}, "reads a target 128 wide"),
        ({"vocab_size": 1000}, "vocabulary is 1000 tokens"),
        ({"layers": None}, "not three distinct layers"),
        ({"layers": [1, 2, 9]}, "not distinct layers of this 4-layer target"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope type 'yarn'"),
    ],
)
def test_an_eagle3_head_that_does_not_fit_is_refused_by_name(tiny, tmp_path, change, message):
    state, config = eagle3_state(tiny, width=change.get("width"))
    if "vocab_size" in change:
        config["vocab_size"] = change["vocab_size"]
    if "layers" in change:
        config.pop("eagle_aux_hidden_state_layer_ids")
        if change["layers"]:
            config["eagle_aux_hidden_state_layer_ids"] = change["layers"]
    if "rope_scaling" in change:
        config["rope_scaling"] = change["rope_scaling"]
    folder = write(tmp_path / "bad", state, config)
    with pytest.raises(InvalidParameter, match=message):
        generate(tiny, PROMPTS[0], "speculative", 4, chat=False, draft=f"eagle3:{folder}")


def test_a_hub_id_is_refused_offline_by_name(tiny):
    # conftest sets HF_HUB_OFFLINE: the hub path is exercised for its refusal only
    with pytest.raises(InvalidParameter, match="hub cannot be reached"):
        generate(tiny, PROMPTS[0], "speculative", 4, chat=False, draft="eagle3:nobody/no-such-head")
    with pytest.raises(InvalidParameter, match="hub cannot be reached"):
        generate(tiny, PROMPTS[0], "medusa", 4, chat=False, heads="nobody/no-such-heads")


# --- Medusa ---------------------------------------------------------------------------------------


def official_layout(tiny, ours: dict, prefix=""):
    """Our Medusa heads' tensors (heads.i.j.linear.*) in the official layout: the same residual
    blocks, each head ending in the target's whole LM head (the official heads score every
    token). Returns the state and its config."""
    n = 1 + max(int(k.split(".")[1]) for k in ours if k.startswith("heads."))
    depth = 1 + max(int(k.split(".")[2]) for k in ours if k.startswith("heads.0."))
    out = {}
    for i in range(n):
        for j in range(depth):
            for p in ("weight", "bias"):
                out[f"{prefix}{i}.{j}.linear.{p}"] = ours[f"heads.{i}.{j}.linear.{p}"].float()
        out[f"{prefix}{i}.{depth}.weight"] = tiny.model.lm_head.weight.detach().clone()
    config = {"medusa_num_heads": n, "medusa_num_layers": depth, "base_model_name_or_path": "tiny"}
    return out, config


def test_official_medusa_heads_compute_what_ours_do(tiny, tmp_path):
    """The same blocks with the target's LM head: on our draft vocabulary, the same logits."""
    state, config = official_layout(tiny, load_file(str(heads_path(tiny.model_id))), "medusa_head.")
    folder = write(tmp_path / "m2", state, config, "model.safetensors", "medusa_config.json")
    theirs, ours = heads_for(tiny, str(folder)), load_heads(tiny)
    assert theirs.n_heads == ours.n_heads and len(theirs.vocab) == tiny.model.config.vocab_size
    f = torch.randn(tiny.model.config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(
            theirs.rows(f, 2)[:, ours.vocab], ours.rows(f, 2), atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize(("method", "params"), [("medusa", {"nodes": 16}), ("blockwise", {"k": 3})])
def test_published_medusa_heads_from_a_pt_file_stay_greedy(tiny, tmp_path, method, params):
    # medusa_lm_head.pt: the ModuleList's own keys, as Medusa's trainer saves them
    state, config = official_layout(tiny, load_file(str(heads_path(tiny.model_id))))
    folder = write(tmp_path / "m1", state, config, "medusa_lm_head.pt")
    accepted = 0
    for prompt in PROMPTS[:2]:
        res = matches_greedy(tiny, prompt, 24, method, chat=False, heads=str(folder), **params)
        accepted += res.stats["accepted_drafts"]
    if method == "medusa":  # the tree's top-10 ranks hold some right tokens (the chain's not)
        assert accepted > 0


def test_random_medusa_heads_of_two_blocks_stay_greedy(tiny, tmp_path):
    g = torch.Generator().manual_seed(5)
    d, vocab = tiny.model.config.hidden_size, tiny.model.config.vocab_size
    state = {}
    for i in range(3):
        for j in range(2):
            state[f"{i}.{j}.linear.weight"] = randn(g, d, d)
            state[f"{i}.{j}.linear.bias"] = randn(g, d)
        state[f"{i}.2.weight"] = randn(g, vocab, d, scale=1.0).half()
    path = tmp_path / "medusa_lm_head.pt"
    torch.save(state, path)  # a file alone, no config: the layout says heads and depth
    heads = heads_for(tiny, str(path))
    assert heads.n_heads == 3 and len(heads.medusa_head[0]) == 3
    matches_greedy(tiny, PROMPTS[2], 16, "medusa", chat=False, heads=str(path))
    with pytest.raises(InvalidParameter, match=r"1\.\.3"):
        generate(tiny, PROMPTS[0], "blockwise", 4, chat=False, heads=str(path), k=4)


class Payload:  # a pickled object that is not a tensor: weights_only must refuse it
    pass


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("width", "features 32 wide"),
        ("vocab", "score 1000 tokens"),
        ("pickle", "not a plain tensor file"),
        ("layers", "config says 2 blocks"),
    ],
)
def test_medusa_heads_that_do_not_fit_are_refused_by_name(tiny, tmp_path, tamper, message):
    d, vocab = tiny.model.config.hidden_size, tiny.model.config.vocab_size
    width = 32 if tamper == "width" else d
    rows = 1000 if tamper == "vocab" else vocab
    state = {"0.0.linear.weight": torch.zeros(width, width), "0.0.linear.bias": torch.zeros(width)}
    state["0.1.weight"] = torch.zeros(rows, width)
    config = {"medusa_num_heads": 1, "medusa_num_layers": 2 if tamper == "layers" else 1}
    if tamper == "pickle":
        state["payload"] = Payload()
    folder = write(tmp_path / tamper, state, config, "medusa_lm_head.pt")
    with pytest.raises(InvalidParameter, match=message):
        generate(tiny, PROMPTS[0], "medusa", 4, chat=False, heads=str(folder))


def test_our_heads_file_still_loads_as_heads(tiny, tmp_path):
    path = tmp_path / "ours.safetensors"
    path.write_bytes(heads_path(tiny.model_id).read_bytes())
    heads = heads_for(tiny, str(path))
    assert heads is load_heads(tiny, path)
    matches_greedy(tiny, PROMPTS[3], 16, "blockwise", chat=False, heads=str(path))


def test_the_public_page_loads_no_heads_it_does_not_ship(monkeypatch):
    from decoders.core.errors import InvalidInput
    from ui import models

    monkeypatch.setattr(models, "ALLOW_ANY_MODEL", False)
    models.check_draft({"heads": "", "draft": "auto"})
    for params in ({"heads": "/srv/other/medusa_lm_head.pt"}, {"draft": "eagle3:some/hub-id"}):
        with pytest.raises(InvalidInput, match=r"not offered|ships only"):
            models.check_draft(params)
