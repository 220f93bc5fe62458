"""Trained parts on a frozen target (EAGLE head, Kangaroo adapter, Medusa heads, the exit adapters,
SPACE's mask adapter): where they live, how they are saved and loaded, and the draft vocabulary
the drafting ones score.

Each artifact is `assets/<kind>/<model>.safetensors` (float16 weights; they run in the target's
dtype, drafting heads in `bundle.draft_dtype`) with a JSON card beside it: the command that made
it, the data, the time, the held-out agreement. `python -m decoders.train NAME` writes both.

Drafting heads score a draft vocabulary: the target's most frequent predictions on the training
data (FR-Spec's frequency ranking) plus EOS, i.e. rows of the target's own LM head. On this CPU the
full 49152-row head costs as much as eight decoder layers; 8192 rows keep a draft step cheap, and a
token outside them is simply never drafted (verification stays exact).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from decoders.core import packing
from decoders.core.errors import InvalidParameter
from decoders.core.models import ModelBundle, slug

ASSETS = Path(__file__).resolve().parents[2] / "assets"

M = TypeVar("M", bound=nn.Module)


def artifact_path(kind: str, model_id: str, variant: str = "") -> Path:
    """assets/<kind>/<model>[-<variant>].safetensors"""
    name = slug(model_id) + (f"-{variant}" if variant else "")
    return ASSETS / kind / f"{name}.safetensors"


def save_artifact(module: nn.Module | dict[str, torch.Tensor], path: Path, card: dict) -> None:
    """float16 weights (integer buffers as they are) + the card, embedded and as JSON beside it.
    Non-persistent buffers (rotary tables, packed copies) are left out. `module` may also be the
    tensors themselves, by name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = module if isinstance(module, dict) else module.state_dict()
    tensors = {
        k: (v.detach().half() if v.is_floating_point() else v.detach()).cpu().contiguous()
        for k, v in state.items()
    }
    if getattr(module, "SAVE_INT8", False):  # a drafter's matrices, int8 per row (half the bytes)
        tensors = to_int8(tensors)
    save_file(tensors, str(path), metadata={"card": json.dumps(card)})
    path.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")


INT8_SCALE = ".int8_scale"  # beside an int8 matrix: its rows' scales (float16)


def to_int8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every float matrix as int8 with one float16 scale per row (symmetric: row / scale rounds
    into -127..127). For drafters only: what they propose is verified, so rounding moves no
    output, only (slightly) what is proposed. The repository's artifacts must fit a device call."""
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if v.is_floating_point() and v.dim() == 2:
            scale = (v.float().abs().amax(1, keepdim=True) / 127).clamp_min(1e-8)
            out[k] = (v.float() / scale).round().clamp(-127, 127).to(torch.int8).contiguous()
            out[k + INT8_SCALE] = scale.half().contiguous()
        else:
            out[k] = v
    return out


def from_int8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`to_int8` undone (float32 matrices); a file without int8 matrices comes back as it is."""
    scales = {k[: -len(INT8_SCALE)]: v for k, v in state.items() if k.endswith(INT8_SCALE)}
    return {
        k: v.float() * scales[k].float() if k in scales else v
        for k, v in state.items()
        if not k.endswith(INT8_SCALE)
    }


def read_card(path: Path) -> dict:
    card = path.with_suffix(".json")
    return json.loads(card.read_text()) if card.is_file() else {}


# Loaded artifacts are shared read-only by every run (each decode keeps its own caches); the lock
# makes concurrent first uses load a file once. Kept per model object, not per model id: an
# artifact copies from the model it was loaded for (the LM head's rows, SPACE's stacked weights),
# and two bundles of one id may hold different weights (a test's doctored copy); an artifact
# goes when its model does.
_loaded: weakref.WeakKeyDictionary[nn.Module, dict[tuple, nn.Module]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def load_artifact(
    bundle: ModelBundle,
    path: Path,
    build: Callable[[dict[str, torch.Tensor]], M],
    what: str,
    train_hint: str,
    drafts: bool = False,
) -> M:
    """The module saved at `path`, built by `build(state)` for `bundle`'s config, in the target's
    device and dtype, frozen, with `lm_head` = the target's LM head cut to its `vocab` buffer.
    `drafts`: the module only proposes tokens the target verifies, so it may run in the cheaper
    `bundle.draft_dtype` (packing.draft_dtype). Cached per (loaded model, file, device, dtype). A
    missing or ill-fitting file is an InvalidParameter that says how to train one."""
    dtype = bundle.drafting_dtype if drafts else bundle.dtype
    key = (str(path), str(bundle.device), str(dtype))
    with _lock:
        loaded = _loaded.setdefault(bundle.model, {})
        if key not in loaded:
            loaded[key] = _load(bundle, path, build, what, train_hint, dtype)
        return loaded[key]  # type: ignore[return-value]


def _load(bundle, path: Path, build, what: str, train_hint: str, dtype: torch.dtype) -> nn.Module:
    if not path.is_file():
        raise InvalidParameter(
            f"no trained {what} for {bundle.model_id} (looked for "
            f"{path.relative_to(ASSETS.parent) if path.is_relative_to(ASSETS.parent) else path}); "
            f"train one with `{train_hint}`"
        )
    state = from_int8(load_file(str(path)))
    try:
        module = build(state)
        module.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError) as e:
        raise InvalidParameter(
            f"{what}: {path.name} does not fit {bundle.model_id} ({e})"
        ) from None
    module.to(device=bundle.device, dtype=dtype).eval().requires_grad_(False)
    if hasattr(module, "vocab"):  # drafting heads read a draft vocabulary (SPACE: the full head)
        module.lm_head = vocab_head(bundle, module.vocab, dtype)
    if bundle.packed:
        packing.pack_linears(module)
    return module


def vocab_head(
    bundle: ModelBundle, vocab: torch.Tensor, dtype: torch.dtype | None = None
) -> nn.Linear:
    """The target's LM head restricted to the rows of `vocab` (a copy for drafting; not saved)."""
    from decoders.core.runtime import weights_of

    lm_head = bundle.model.lm_head
    with weights_of(lm_head):  # under a device map the head may be offloaded until it runs
        rows = lm_head.weight[vocab.to(lm_head.weight.device)].detach()
        rows = rows.to(device=bundle.device, dtype=dtype or rows.dtype)
    head = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=rows.device)
    head.weight = nn.Parameter(rows, requires_grad=False)
    return head


def full_logits(bundle: ModelBundle, vocab: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Scores over the draft vocabulary placed into the full vocabulary (-inf elsewhere), float32,
    so the shared verifiers and samplers see ordinary logits."""
    out = torch.full(
        (*rows.shape[:-1], bundle.model.config.vocab_size), float("-inf"), device=rows.device
    )
    out[..., vocab] = rows.float()
    return out


def all_variants(kind: str, model_id: str) -> list[Path]:
    """Every shipped file of `kind` for the model: `<model>.safetensors` and `<model>-*.safetensors`."""
    folder = ASSETS / kind
    base = slug(model_id)
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.glob(f"{base}*.safetensors")
        if p.stem == base or p.stem.startswith(base + "-")
    )
