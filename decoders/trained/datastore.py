"""The retrieval datastore: the target's own writing, as token ids, for SAM-Decoding's static
automaton and Token Recycling's warm start.

`python -m decoders.train datastore` writes `assets/sam/<model>.safetensors`: the documents of the
shared self-generated corpus (chat turns the model wrote and answered, task turns over its own
passages, code it continued; decontaminated against Spec-Bench and HumanEval as the corpus is) as
one uint16 token stream with document offsets, and a card. Its suffix automaton is built on first
use (seconds) and cached as flat arrays in ~/.cache/decoding-lab/sam/, keyed by the file's hash.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from decoders.core.models import ModelBundle, cache_dir, canonical_id
from decoders.core.suffix_automaton import StaticAutomaton
from decoders.trained.artifacts import artifact_path

KIND = "sam"
ARRAYS = ("length", "link", "count", "offsets", "tokens", "targets")
FORMAT = 1  # the cached arrays' layout: a change to the automaton's construction bumps it

_stores: dict[str, StaticAutomaton | None] = {}
_lock = threading.Lock()


def store_path(model_id: str) -> Path:
    """assets/sam/<model>.safetensors (an exit-tuned model shares its base's tokenizer and text)."""
    base = canonical_id(model_id).removesuffix("-exit-tuned")
    return artifact_path(KIND, base)


def read_docs(path: Path) -> list[list[int]]:
    state = load_file(str(path))
    stream, offsets = state["tokens"].long().tolist(), state["offsets"].tolist()
    return [stream[a:b] for a, b in itertools.pairwise(offsets)]


def docs_tensors(docs: list[list[int]]) -> dict[str, torch.Tensor]:
    """The documents as the file holds them: one uint16 stream and int64 offsets."""
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    stream = np.fromiter((t for d in docs for t in d), dtype=np.int64, count=int(offsets[-1]))
    if stream.size and (stream.min() < 0 or stream.max() > np.iinfo(np.uint16).max):
        raise ValueError("datastore tokens must fit uint16 (a vocabulary of at most 65,536)")
    return {
        "tokens": torch.from_numpy(stream.astype(np.uint16)),
        "offsets": torch.from_numpy(offsets),
    }


def automaton(path: Path) -> StaticAutomaton:
    """The frozen automaton of the datastore at `path`, from the cache when built before."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    cached = cache_dir() / KIND / f"{path.stem}-{digest}-v{FORMAT}.npz"
    if cached.is_file():
        try:
            with np.load(cached) as z:
                sam = StaticAutomaton.__new__(StaticAutomaton)
                for name in ARRAYS:
                    setattr(sam, name, z[name])
                sam.size = int(z["size"])
                sam.build_s = float(z["build_s"])
                return sam
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
            pass  # a torn cache file: build again
    t0 = time.perf_counter()
    sam = StaticAutomaton(read_docs(path))
    sam.build_s = time.perf_counter() - t0
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp.npz")
    np.savez(tmp, size=sam.size, build_s=sam.build_s, **{n: getattr(sam, n) for n in ARRAYS})
    tmp.replace(cached)
    return sam


def load_store(bundle: ModelBundle) -> StaticAutomaton | None:
    """The model's datastore automaton, or None when none ships for it (shared, read-only)."""
    path = store_path(bundle.model_id)
    with _lock:
        if str(path) not in _stores:
            _stores[str(path)] = automaton(path) if path.is_file() else None
        return _stores[str(path)]
