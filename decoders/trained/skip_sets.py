"""Draft & Verify's skip sets: the attention and MLP sublayers its draft leaves out, searched
offline with Bayesian optimisation (`python -m decoders.search_skip`) and shipped per model in
`assets/skip_sets/<model>.json`, or written by hand ('attn:10,12 mlp:11,13')."""

from __future__ import annotations

import json
from pathlib import Path

from decoders.core.errors import InvalidParameter
from decoders.core.models import ModelBundle, slug
from decoders.core.runtime import SkipSet

SKIP_SETS = Path(__file__).resolve().parents[2] / "assets" / "skip_sets"


def skip_set_path(model_id: str) -> Path:
    """Where the searched skip set for `model_id` ships."""
    return SKIP_SETS / f"{slug(model_id)}.json"


def parse_skip(text: str, n_layers: int) -> SkipSet:
    """'attn:1,3 mlp:2' -> SkipSet(attn={1, 3}, mlp={2})."""
    parts: dict[str, set[int]] = {"attn": set(), "mlp": set()}
    for chunk in text.replace(";", " ").split():
        kind, _, layers = chunk.partition(":")
        if kind not in parts or not layers:
            raise InvalidParameter(
                f"skip {text!r}: expected 'attn:I,J mlp:K' (layer indices), or 'searched'"
            )
        try:
            ids = {int(i) for i in layers.split(",") if i}
        except ValueError:
            raise InvalidParameter(f"skip {text!r}: layer indices must be integers") from None
        if any(not 0 <= i < n_layers for i in ids):
            raise InvalidParameter(f"skip {text!r}: layers must be in 0..{n_layers - 1}")
        parts[kind] |= ids
    return SkipSet(frozenset(parts["attn"]), frozenset(parts["mlp"]))


def format_skip(skip: SkipSet) -> str:
    """`parse_skip` backwards: SkipSet(attn={1, 3}, mlp={2}) -> 'attn:1,3 mlp:2'."""
    return " ".join(
        f"{kind}:{','.join(map(str, sorted(ids)))}"
        for kind, ids in (("attn", skip.attn), ("mlp", skip.mlp))
        if ids
    )


def searched_skip(bundle: ModelBundle) -> SkipSet:
    """The set the search shipped for this model; raises when none ships."""
    path = skip_set_path(bundle.model_id)
    if not path.is_file():
        raise InvalidParameter(
            f"no searched skip set for {bundle.model_id!r} (looked for {path.name} in "
            "assets/skip_sets); run `python -m decoders.search_skip --model ...` or give one, "
            "e.g. skip='attn:10,12 mlp:11,13'"
        )
    data = json.loads(path.read_text())
    return SkipSet(frozenset(data["attn"]), frozenset(data["mlp"]))


def resolve_skip(bundle: ModelBundle, text: str) -> SkipSet:
    """A `skip` parameter's set: 'searched' or one written out, never empty."""
    skip = (
        searched_skip(bundle) if text.strip() == "searched" else parse_skip(text, bundle.n_layers)
    )
    if not skip:
        raise InvalidParameter("skip: leave out at least one sublayer, or the draft IS the target")
    return skip
