"""Who writes the draft: the target's own first k layers (`self:k`), a smaller model, a
trained EAGLE head (`eagle`, see eagle.py), or a published EAGLE-3 head (`eagle3:<folder or hub
id>`, read by published.py).

All speak one small protocol (core/drafter.py: begin, forward, end, observe), so `speculative`
(chains) and `token_tree` (trees) do not care which.

`self:k` (the target's first k layers and its LM head) shares the target's KV cache: the target's verification
forward already wrote layers 0..k-1 for every committed token, so drafting needs no catch-up, and
`end()` crops the draft's entries from those layers. A separate draft model keeps its own cache
and, at the start of each step, feeds the tokens committed since it last saw the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import DynamicCache

from decoders.core.drafter import Drafter
from decoders.core.errors import InvalidParameter
from decoders.core.models import ModelBundle, load_model
from decoders.core.runtime import ForwardResult, new_cache, require_layers

if TYPE_CHECKING:
    from decoders.trained.block import BlockHead
    from decoders.trained.eagle import Eagle3Head, EagleHead

SELF_DRAFT = re.compile(r"^self:(\d+)$")
# The `draft` parameter's help, shared by the methods that take one (speculative, token_tree).
DRAFT_HELP = (
    "auto = the trained EAGLE head shipped for this model if there is one, else self; "
    "self:k = the target's first k layers (self = a quarter of them); eagle = the trained EAGLE "
    "head shipped for this model (eagle:<file> for another); block = the block head shipped "
    "for this model (token_tree only: one forward drafts every depth; block:<file> for "
    "another); eagle3:<folder or hub id> = a "
    "published EAGLE-3 head (SafeAILab/EAGLE and SpecForge's layout); or a model id with the same "
    "tokenizer (e.g. tiny-random-2, HuggingFaceTB/SmolLM2-135M-Instruct)"
)


class SelfDrafter(Drafter):
    """The target's first k layers, then its final norm and LM head, on the target's own cache."""

    def __init__(self, target: ModelBundle, cache: DynamicCache, k: int) -> None:
        super().__init__(target, cache, k, f"self:{k} (first {k} of {target.n_layers} layers)")

    def begin(self, context: Sequence[int], step: int) -> list[ForwardResult]:
        self.prefix = len(context) - 1  # the verification forward filled every layer up to here
        return []


class ModelDrafter(Drafter):
    """A smaller model with the same tokenizer, on its own KV cache."""

    def __init__(self, draft: ModelBundle) -> None:
        super().__init__(draft, new_cache(draft), None, draft.model_id)

    def begin(self, context: Sequence[int], step: int) -> list[ForwardResult]:
        missing = list(context[self.prefix : len(context) - 1])
        self.prefix = len(context) - 1
        if not missing:
            return []
        # Catch up on what was committed since last step (prompt first, then accepted tokens).
        return [self.forward(missing, step, logits_to_keep=1)]


def auto_draft(target: ModelBundle) -> str:
    """What `draft=auto` means for `target`: the EAGLE head shipped for it in assets/eagle/ when
    there is one (the best drafter we have), else `self` (a quarter of its layers)."""
    from decoders.trained.eagle import head_path

    return "eagle" if head_path(target.model_id).is_file() else "self"


def resolve_draft(
    spec: str, target: ModelBundle
) -> int | ModelBundle | EagleHead | Eagle3Head | BlockHead:
    """`auto` -> see `auto_draft`; `self`/`self:k` -> k; `eagle` -> the model's trained head
    (`eagle:<file>`: that head); `block` -> its trained block head (`block:<file>`: that one);
    `eagle3:<source>` -> that published head; a model id -> its loaded bundle (same tokenizer
    required)."""
    spec = spec.strip()
    if spec.lower() == "auto":
        spec = auto_draft(target)
    if spec.lower() == "block" or spec.lower().startswith("block:"):
        from decoders.trained.block import load_block

        require_layers(target, "a block head's features")
        path = spec.partition(":")[2].strip()
        return load_block(target, Path(path) if path else None)
    if spec.lower().startswith("eagle3:"):
        from decoders.trained.published import load_eagle3

        source = spec.partition(":")[2].strip()
        if not source:
            raise InvalidParameter("draft 'eagle3:': name the head, eagle3:<folder or hub id>")
        require_layers(target, "a published EAGLE-3 head's features")
        return load_eagle3(target, source)
    if spec.lower() == "eagle" or spec.lower().startswith("eagle:"):
        from decoders.trained.eagle import load_head

        require_layers(target, "an EAGLE head's features")
        path = spec.partition(":")[2].strip()
        return load_head(target, Path(path) if path else None)
    m = SELF_DRAFT.match(spec)
    if spec == "self" or m:
        k = int(m.group(1)) if m else max(1, round(target.n_layers / 4))
        if not 1 <= k <= target.n_layers:  # k = all layers: the target drafts for itself
            raise InvalidParameter(
                f"draft 'self:{k}': k must be in 1..{target.n_layers} for this "
                f"{target.n_layers}-layer model"
            )
        if k < target.n_layers:  # all of them is a whole-model forward, which any model runs
            require_layers(target, f"draft 'self:{k}' (the target's first layers alone)")
        return k
    if spec.lower().startswith("self"):
        raise InvalidParameter(f"draft {spec!r}: write self:k with a layer count k, e.g. self:8")
    draft = load_model(spec, device=target.device, dtype=target.dtype)
    if not same_vocabulary(draft, target):
        raise InvalidParameter(
            f"draft model {spec!r} does not share the target's tokenizer; "
            "draft-and-verify needs the same token ids (or use self:k)"
        )
    return draft


def check_draft(target: ModelBundle, params, trees: bool = False) -> None:
    """The `draft` parameter names a drafter this model can run; `trees`: a method that grows
    trees (the block head drafts trees only: a chain of it is the block_draft method)."""
    spec = str(params["draft"]).strip().lower()
    if not trees and (spec == "block" or spec.startswith("block:")):
        raise InvalidParameter(
            "draft 'block': the block head fills every position in one forward; as a chain it "
            "is the block_draft method (as a tree: token_tree with draft=block)"
        )
    resolve_draft(params["draft"], target)


def make_drafter(spec: str, target: ModelBundle, cache: DynamicCache) -> Drafter:
    """The drafter a `draft` parameter names (see `resolve_draft`). With `auto`, its label says
    what auto chose, e.g. "eagle (auto: 1 trained layer on the target's features)"."""
    from decoders.trained.block import BlockHead, BlockTreeDrafter

    draft = resolve_draft(spec, target)
    if isinstance(draft, BlockHead):  # (an EagleHead too: its fc and layer are one)
        drafter: Drafter = BlockTreeDrafter(target, draft)
    elif isinstance(draft, int):
        drafter = SelfDrafter(target, cache, draft)
    elif isinstance(draft, ModelBundle):
        drafter = ModelDrafter(draft)
    else:
        from decoders.trained.eagle import EagleDrafter

        drafter = EagleDrafter(target, draft)
    if spec.strip().lower() == "auto":
        name, _, detail = drafter.label.partition(" (")
        drafter.label = f"{name} (auto: {detail}" if detail else f"{name} (auto)"
    return drafter


def same_vocabulary(a: ModelBundle, b: ModelBundle) -> bool:
    return a.tokenizer is b.tokenizer or a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
