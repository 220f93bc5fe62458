"""Published drafters: EAGLE-3 and Medusa heads as their authors release them, run as drafters of
this lab's methods, and our own official-architecture EAGLE-3 head written out in that layout.

    speculative:draft=eagle3:<folder or hub id>       token_tree:draft=eagle3:<folder or hub id>
    medusa:heads=<folder, weights file or hub id>     blockwise:heads=<folder, weights file or hub id>

EAGLE-3 (SafeAILab/EAGLE's `LlamaForCausalLMEagle3`, the layout SpecForge writes and vLLM reads):
config.json (hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
rms_norm_eps, rope_theta / rope_scaling, vocab_size, draft_vocab_size, maybe target_hidden_size,
norm_before_residual, eagle_aux_hidden_state_layer_ids) and model.safetensors or pytorch_model.bin:

    fc.weight [d, 3 d_target]                         the three target layers' states -> d
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight
    midlayer.self_attn.{q,k,v}_proj.weight [*, 2d]    the normed embedding and hidden side by side
    midlayer.self_attn.o_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight, norm.weight
    lm_head.weight [draft_vocab, d]                   its own LM head over the draft vocabulary
    d2t [draft_vocab]                                 target id = draft id + d2t[draft id]
    t2d [vocab] (bool), embed_tokens.weight           (optional; without it: the target's embedding)

The layers it reads are the config's `eagle_aux_hidden_state_layer_ids` (top level or in
`eagle_config`), else the official choice: the states entering layers 2, L // 2 and L - 3 of an
L-layer target (= after that many layers, this lab's convention), in increasing order.

Medusa (FasterDecoding/Medusa): medusa_config.json or config.json (medusa_num_heads,
medusa_num_layers, base_model_name_or_path) and medusa_lm_head.pt / .safetensors (or the whole
model's model.safetensors / pytorch_model.bin, of which only the heads are read):

    [medusa_head.]{i}.{j}.linear.{weight,bias}    head i's residual blocks, j < medusa_num_layers
    [medusa_head.]{i}.{medusa_num_layers}.weight  head i's own LM head [vocab, d]

A source is a local folder (or, for Medusa, a weights file) or a hub id (owner/name), which is
read as a hub model is (core/model_sources.py): from the local hub cache, else from the hub
where it can be reached. Only config files and weights are read, never code: safetensors, or
torch.load(weights_only=True) for .pt and .bin. On the public page the app's own opt-in
(DECODING_LAB_ALLOW_ANY_MODEL) decides whether a visitor may name one at all. A head that does not
fit the target (its width, vocabulary, layers) is refused by name.

`export_eagle3` writes an `Eagle3Head` (trained by `python -m decoders.train eagle --official`)
in the official layout: `python -m decoders.trained.published export --model M HEAD DIR`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from decoders.core import packing
from decoders.core.errors import InvalidParameter
from decoders.core.models import ModelBundle, hub_reachable
from decoders.trained.eagle import Eagle3Head, head_config
from decoders.trained.medusa_heads import PublishedMedusaHeads

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
EAGLE3_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
MEDUSA_CONFIGS = ("medusa_config.json", "config.json")
MEDUSA_WEIGHTS = (
    "medusa_lm_head.safetensors",
    "medusa_lm_head.pt",
    "medusa_lm_head.bin",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
ROPE_TYPES = ("default", "linear", "llama3")  # what the official heads use; others are refused
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MEDUSA_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


# --- where the files are ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A published drafter's files: a local folder, one local weights file (its folder holds the
    config), or a hub repo (`online`: files not in the local cache may be fetched)."""

    text: str  # as the parameter gave it
    folder: Path | None = None
    file: Path | None = None
    repo: str | None = None
    online: bool = False

    @property
    def key(self) -> str:
        return f"hub:{self.repo}" if self.repo else str((self.file or self.folder).resolve())

    def get(self, name: str) -> Path | None:
        """The file `name` of this source, None where it has none."""
        if self.repo is None:
            path = (self.folder or self.file.parent) / name
            return path if path.is_file() else None
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(self.repo, name)
        except Exception:  # an id the hub client refuses: nothing cached under it
            cached = None
        if isinstance(cached, str):
            return Path(cached)
        if not self.online:
            return None
        try:
            return Path(hf_hub_download(self.repo, name))
        except Exception:  # not in the repo (or the hub went away): the next name is tried
            return None


def locate(text: str, what: str) -> Source:
    """`text` as a local folder or file, else as a hub id; refused by name when neither."""
    text = text.strip()
    path = Path(text).expanduser()
    if path.is_dir():
        return Source(text, folder=path)
    if path.is_file():
        return Source(text, file=path)
    if not HUB_ID.match(text) or text.startswith((".", "~")):
        raise InvalidParameter(f"{what}: no such folder or file (or hub id owner/name)")
    online = hub_reachable()
    source = Source(text, repo=text, online=online)
    if not online and not any(source.get(n) for n in ("config.json", "medusa_config.json")):
        raise InvalidParameter(
            f"{what}: not a local folder or file, and as a hub id it is not in the local hub "
            "cache and the hub cannot be reached (no network, or HF_HUB_OFFLINE); give a local "
            "folder, which loads offline"
        )
    return source


def read_config(source: Source, names: Sequence[str], what: str) -> dict | None:
    """The first of the `names` JSON files the source has (None: it has none)."""
    for name in names:
        path = source.get(name)
        if path is None:
            continue
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidParameter(f"{what}: {name} is not readable JSON ({exc})") from None
        if not isinstance(config, dict):
            raise InvalidParameter(f"{what}: {name} is not a JSON object")
        return config
    return None


def read_weights(
    source: Source,
    names: Sequence[str],
    what: str,
    keep: Callable[[str], bool] = lambda key: True,
) -> dict[str, torch.Tensor]:
    """The tensors `keep` selects from the source's weights: its one file, or the first of
    `names` it has (a safetensors index: the shards that hold them)."""
    if source.file is not None:
        return _read(source.file, what, keep)
    for name in names:
        path = source.get(name)
        if path is None:
            continue
        if not name.endswith(".index.json"):
            return _read(path, what, keep)
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidParameter(f"{what}: {name} is not a weight index ({exc})") from None
        state: dict[str, torch.Tensor] = {}
        for shard in sorted({f for k, f in weight_map.items() if keep(k)}):
            shard_path = source.get(shard)
            if shard_path is None:
                raise InvalidParameter(f"{what}: {name} names {shard}, which it does not have")
            state |= _read(shard_path, what, keep)
        return state
    raise InvalidParameter(f"{what}: no weights (looked for {', '.join(names)})")


def _read(path: Path, what: str, keep: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """safetensors, or a pickle of tensors read by torch.load(weights_only=True): no code runs."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                names = f.keys()  # (a safe_open handle is not iterable)
                return {k: f.get_tensor(k) for k in names if keep(k)}
        except Exception as exc:  # a damaged or foreign file
            raise InvalidParameter(
                f"{what}: {path.name} is not a safetensors file ({exc})"
            ) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses any pickle that is not plain tensors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InvalidParameter(
            f"{what}: {path.name} is not a plain tensor file "
            f"(torch.load(weights_only=True) refused it: {first})"
        ) from None
    if not isinstance(state, Mapping) or not all(torch.is_tensor(v) for v in state.values()):
        raise InvalidParameter(f"{what}: {path.name} holds no name -> tensor mapping")
    return {str(k): v for k, v in state.items() if keep(str(k))}


def is_our_artifact(text: str, key: str) -> bool:
    """Whether `text` names a safetensors file this lab's trainer wrote (it has `key` and the
    draft vocabulary), not a published layout."""
    path = Path(text.strip()).expanduser()
    if not path.is_file() or path.suffix != ".safetensors":
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
    except Exception:
        return False
    return key in keys and "vocab" in keys


# --- loading ---------------------------------------------------------------------------------------

# As artifacts.py keeps its files: per loaded model object, read-only, shared by every run.
_loaded: weakref.WeakKeyDictionary[nn.Module, dict[tuple, nn.Module]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _cached(bundle: ModelBundle, key: tuple, build: Callable[[], nn.Module]) -> nn.Module:
    dtype = bundle.drafting_dtype
    key = (*key, str(bundle.device), str(dtype))
    with _lock:
        loaded = _loaded.setdefault(bundle.model, {})
        if key not in loaded:
            module = build().to(device=bundle.device, dtype=dtype).eval().requires_grad_(False)
            if bundle.packed:
                packing.pack_linears(module)
            loaded[key] = module
        return loaded[key]


def load_eagle3(bundle: ModelBundle, text: str) -> Eagle3Head:
    """The published EAGLE-3 head `text` names, for `bundle`'s target (cached per process)."""
    what = f"draft 'eagle3:{text}'"
    source = locate(text, what)
    head = _cached(bundle, ("eagle3", source.key), lambda: build_eagle3(bundle, source, what))
    return head  # type: ignore[return-value]


def target_layers(config: Mapping, n_layers: int, what: str) -> tuple[int, ...]:
    """The target layers an EAGLE-3 head reads: its config's, else the official default."""
    inner = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    named = config.get("eagle_aux_hidden_state_layer_ids") or inner.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if named:
        layers = [int(ell) for ell in named]
        if len(set(layers)) != len(layers) or not all(0 <= ell < n_layers for ell in layers):
            raise InvalidParameter(
                f"{what}: its layers {layers} are not distinct layers of this "
                f"{n_layers}-layer target (0..{n_layers - 1})"
            )
        return tuple(sorted(layers))
    return default_layers(n_layers, what)


def default_layers(n_layers: int, what: str) -> tuple[int, ...]:
    """EAGLE-3's choice: the states entering layers 2, L // 2 and L - 3."""
    layers = (2, n_layers // 2, n_layers - 3)
    if len(set(layers)) < 3 or min(layers) < 0:
        raise InvalidParameter(
            f"{what}: EAGLE-3's layers 2, L // 2, L - 3 are {layers} for this {n_layers}-layer "
            "target, not three distinct layers; name them in the head's config "
            "(eagle_aux_hidden_state_layer_ids)"
        )
    return tuple(sorted(layers))


def llama_config(config: Mapping, target: ModelBundle, what: str):
    """The head's config.json as a one-layer Llama config (the widths, norms, rope it runs)."""
    from transformers import LlamaConfig

    need = ("hidden_size", "intermediate_size", "num_attention_heads")
    missing = [k for k in need if not isinstance(config.get(k), int)]
    if missing:
        raise InvalidParameter(f"{what}: its config.json lacks {', '.join(missing)}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    if rope_type not in ROPE_TYPES:
        raise InvalidParameter(
            f"{what}: its rope type {rope_type!r} is not supported here ({', '.join(ROPE_TYPES)})"
        )
    fields = {
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config.get("num_key_value_heads", config["num_attention_heads"]),
        "num_hidden_layers": 1,
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
        "hidden_act": config.get("hidden_act", "silu"),
        "max_position_embeddings": config.get("max_position_embeddings", 2048),
        "attention_bias": bool(config.get("attention_bias", False)),
        "mlp_bias": bool(config.get("mlp_bias", False)),
        "vocab_size": target.model.config.vocab_size,
    }
    if config.get("head_dim"):
        fields["head_dim"] = config["head_dim"]
    if "rope_parameters" in config:
        fields["rope_parameters"] = dict(config["rope_parameters"])
    else:
        fields["rope_theta"] = config.get("rope_theta", 10000.0)
        if config.get("rope_scaling"):
            fields["rope_scaling"] = dict(config["rope_scaling"])
    try:
        out = LlamaConfig(**fields)
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidParameter(
            f"{what}: its config.json does not describe a head ({exc})"
        ) from None
    out.norm_before_residual = bool(config.get("norm_before_residual", False))
    out._attn_implementation = target.model.config._attn_implementation or "sdpa"
    return out


def build_eagle3(bundle: ModelBundle, source: Source, what: str) -> Eagle3Head:
    """Read, check against the target and build the head (float32, on the CPU)."""
    config = read_config(source, ("config.json",), what)
    if config is None:
        raise InvalidParameter(f"{what}: no config.json")
    archs = config.get("architectures") or []
    if archs and not set(archs) & set(ARCHITECTURES):
        raise InvalidParameter(
            f"{what}: its architecture {', '.join(archs)} is not an EAGLE-3 head "
            f"({' or '.join(ARCHITECTURES)})"
        )
    if config.get("num_hidden_layers", 1) != 1:
        raise InvalidParameter(
            f"{what}: {config['num_hidden_layers']} layers; the official EAGLE-3 head has one"
        )
    target = bundle.model.config
    vocab, width = target.vocab_size, target.hidden_size
    if config.get("vocab_size", vocab) != vocab:
        raise InvalidParameter(
            f"{what}: its vocabulary is {config['vocab_size']} tokens, {bundle.model_id}'s is "
            f"{vocab}: it was trained for another tokenizer"
        )
    head_cfg = llama_config(config, bundle, what)
    layers = target_layers(config, bundle.n_layers, what)
    state = read_weights(source, EAGLE3_WEIGHTS, what)
    for key in ("fc.weight", "lm_head.weight", "norm.weight"):
        if key not in state:
            raise InvalidParameter(f"{what}: its weights lack {key}")
    fc = state["fc.weight"]
    reads = fc.shape[1] / len(layers)
    if reads != width or config.get("target_hidden_size", width) != width:
        stated = config.get("target_hidden_size", reads)
        raise InvalidParameter(
            f"{what}: it reads a target {stated:g} wide (fc takes {fc.shape[1]} = "
            f"{len(layers)} layers x {reads:g}); {bundle.model_id} is {width} wide"
        )
    d = head_cfg.hidden_size
    if fc.shape[0] != d:
        raise InvalidParameter(f"{what}: fc gives {fc.shape[0]} features, its config says {d}")
    token_ids = draft_tokens(state, config, vocab, what)
    own = "embed_tokens.weight" in state
    if own and tuple(state["embed_tokens.weight"].shape) != (vocab, d):
        raise InvalidParameter(
            f"{what}: its embed_tokens is {tuple(state['embed_tokens.weight'].shape)}, "
            f"not ({vocab}, {d})"
        )
    if not own and d != width:
        raise InvalidParameter(
            f"{what}: it is {d} wide and brings no embed_tokens, so it would read "
            f"{bundle.model_id}'s {width}-wide embedding"
        )
    head = Eagle3Head(head_cfg, token_ids, layers, width, own)
    weights = {
        k: v
        for k, v in state.items()
        if k not in ("d2t", "t2d") and not k.endswith("rotary_emb.inv_freq")
    }
    weights |= {"token_ids": token_ids, "fuse": head.fuse}
    try:
        head.load_state_dict(
            {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
        )
    except RuntimeError as exc:  # missing, unexpected or resized keys, named by torch
        detail = " ".join(str(exc).split())[:400]
        raise InvalidParameter(f"{what}: not the official EAGLE-3 layout ({detail})") from None
    head.source = f"eagle3:{source.text}"
    return head


def draft_tokens(state: Mapping, config: Mapping, vocab: int, what: str) -> torch.Tensor:
    """The target token of each lm_head row: r + d2t[r] (no d2t: the whole vocabulary), as the
    official drafting loop and vLLM place them."""
    rows = state["lm_head.weight"].shape[0]
    if config.get("draft_vocab_size", rows) != rows:
        raise InvalidParameter(
            f"{what}: lm_head has {rows} rows, its config's draft_vocab_size is "
            f"{config['draft_vocab_size']}"
        )
    if "d2t" not in state:
        if rows != vocab:
            raise InvalidParameter(f"{what}: {rows} draft tokens but no d2t to place them")
        return torch.arange(vocab)
    d2t = state["d2t"].long()
    if d2t.shape != (rows,):
        raise InvalidParameter(f"{what}: d2t has {tuple(d2t.shape)} entries, lm_head {rows} rows")
    ids = torch.arange(rows) + d2t
    if ids.min() < 0 or ids.max() >= vocab or len(ids.unique()) != rows:
        raise InvalidParameter(
            f"{what}: its d2t maps draft tokens outside the target's {vocab} or twice onto one"
        )
    return ids  # (t2d, the same set as a mask over the target's vocabulary, serves training)


def load_medusa(bundle: ModelBundle, text: str) -> PublishedMedusaHeads:
    """The published Medusa heads `text` names, for `bundle`'s target (cached per process)."""
    what = f"heads {text!r}"
    source = locate(text, what)
    heads = _cached(bundle, ("medusa", source.key), lambda: build_medusa(bundle, source, what))
    return heads  # type: ignore[return-value]


def build_medusa(bundle: ModelBundle, source: Source, what: str) -> PublishedMedusaHeads:
    """Read, check against the target and build the heads (float32, on the CPU)."""
    config = read_config(source, MEDUSA_CONFIGS, what) or {}

    def ours(key: str) -> bool:
        return key.startswith("medusa_head.") or MEDUSA_KEY.match(key) is not None

    state = {
        k.removeprefix("medusa_head."): v
        for k, v in read_weights(source, MEDUSA_WEIGHTS, what, ours).items()
    }
    parsed = {k: MEDUSA_KEY.match(k) for k in state}
    if not state or not all(parsed.values()):
        odd = [k for k, m in parsed.items() if not m][:3]
        raise InvalidParameter(
            f"{what}: not Medusa heads in the official layout (medusa_head.i.j...)"
            + (f"; unexpected keys {odd}" if odd else "")
        )
    n_file = 1 + max(int(m.group(1)) for m in parsed.values())
    n = int(config.get("medusa_num_heads") or n_file)
    if not 1 <= n <= n_file:
        raise InvalidParameter(f"{what}: its config names {n} heads, its weights hold {n_file}")
    lm_heads = {int(m.group(1)): int(m.group(2)) for m in parsed.values() if m.group(3) == "weight"}
    depths = {lm_heads.get(i) for i in range(n)}
    if None in depths or len(depths) != 1:
        raise InvalidParameter(f"{what}: its heads do not all end in an LM head at one depth")
    depth = depths.pop()
    if config.get("medusa_num_layers", depth) != depth:
        raise InvalidParameter(
            f"{what}: its config says {config['medusa_num_layers']} blocks per head, its weights "
            f"{depth}"
        )
    rows, d = state[f"0.{depth}.weight"].shape
    target = bundle.model.config
    if d != target.hidden_size:
        raise InvalidParameter(
            f"{what}: the heads read features {d} wide; {bundle.model_id} is "
            f"{target.hidden_size} wide (they were trained for "
            f"{config.get('base_model_name_or_path', 'another model')})"
        )
    if rows != target.vocab_size:
        raise InvalidParameter(
            f"{what}: the heads score {rows} tokens, {bundle.model_id}'s vocabulary is "
            f"{target.vocab_size}: they were trained for another tokenizer"
        )
    heads = PublishedMedusaHeads(d, rows, n, depth)
    kept = {f"medusa_head.{k}": v.float() for k, v in state.items() if int(k.split(".")[0]) < n}
    try:
        heads.load_state_dict(kept)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:400]
        raise InvalidParameter(f"{what}: not the official Medusa layout ({detail})") from None
    return heads


# --- writing our head in the official layout -------------------------------------------------------


def export_eagle3(
    head: Eagle3Head, bundle: ModelBundle, folder: Path, dtype: torch.dtype = torch.float16
) -> Path:
    """Write an official-architecture head as SafeAILab/EAGLE and SpecForge do: config.json and
    model.safetensors (d2t, t2d; the draft vocabulary in increasing token order, lm_head's rows
    reordered with it). The head's weights are written as they are: nothing is approximated."""
    from safetensors.torch import save_file

    if not isinstance(head, Eagle3Head):
        raise InvalidParameter(
            "only a head of the official EAGLE-3 architecture can be written in its layout "
            "(python -m decoders.train eagle --official); ours (fc over [embedding ; feature] "
            "and a plain decoder layer) has no exact counterpart there"
        )
    order = torch.argsort(head.token_ids.cpu())
    ids = head.token_ids.cpu()[order]
    state = {k: v for k, v in head.state_dict().items() if k not in ("token_ids", "fuse")}
    state["lm_head.weight"] = state["lm_head.weight"].cpu()[order]
    vocab = bundle.model.config.vocab_size
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    tensors |= {"d2t": (ids - torch.arange(len(ids))).contiguous(), "t2d": t2d}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = eagle3_config(head, bundle, dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def eagle3_config(head: Eagle3Head, bundle: ModelBundle, dtype: torch.dtype) -> dict:
    """The official config.json of `head` (what `llama_config` reads back)."""
    c = head.config
    rope = dict(getattr(c, "rope_parameters", None) or {})
    theta = rope.pop("rope_theta", getattr(c, "rope_theta", 10000.0))
    rope_type = rope.get("rope_type", "default")
    target = bundle.model.config
    layers = list(head.fused_layers)
    out = {
        "architectures": [ARCHITECTURES[0]],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": head.midlayer.self_attn.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": theta,
        "rope_scaling": None if rope_type == "default" else {**rope, "type": rope_type},
        "attention_bias": bool(c.attention_bias),
        "vocab_size": target.vocab_size,
        "draft_vocab_size": len(head.token_ids),
        "tie_word_embeddings": False,
        "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_id,
        "pad_token_id": target.pad_token_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
        # SafeAILab's own runtime always reads 2, L // 2, L - 3; vLLM and this lab read these
        "eagle_aux_hidden_state_layer_ids": layers,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
    }
    if head.target_width != c.hidden_size:
        out["target_hidden_size"] = head.target_width
    if head.midlayer.norm_before_residual:
        out["norm_before_residual"] = True
    return out


def read_official_artifact(bundle: ModelBundle, path: Path) -> Eagle3Head:
    """An `--official` head as our trainer saved it (assets/eagle/...), in float32 on the CPU,
    unpacked: the weights of the file exactly, for export."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise InvalidParameter(f"no head file {path}")
    state = load_file(str(path))
    if "midlayer.hidden_norm.weight" not in state:
        raise InvalidParameter(
            f"{path.name}: not a head of the official EAGLE-3 architecture (train one with "
            "python -m decoders.train eagle --official)"
        )
    own = "embed_tokens.weight" in state
    head = Eagle3Head(
        head_config(bundle.model.config), state["token_ids"], state["fuse"], None, own
    )
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return head


def main(argv: list[str] | None = None) -> int:
    from decoders.core.models import EMBEDDED_ID, load_model

    ap = argparse.ArgumentParser(
        prog="python -m decoders.trained.published",
        description="Write an official-architecture EAGLE-3 head in the official layout.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="a head trained with decoders.train eagle --official")
    ex.add_argument("head", type=Path, help="the head's .safetensors (assets/eagle/<model>...)")
    ex.add_argument("out", type=Path, help="the folder to write config.json, model.safetensors")
    ex.add_argument("--model", default=EMBEDDED_ID, help="the target it was trained on")
    args = ap.parse_args(argv)
    bundle = load_model(args.model, device="cpu", dtype="float32")
    try:
        export_eagle3(read_official_artifact(bundle, args.head), bundle, args.out)
    except InvalidParameter as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
