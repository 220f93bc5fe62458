"""Build the retrieval datastore (SAM-Decoding's static text base, Token Recycling's warm start)
from the shared self-generated corpus: every document as token ids -> assets/sam/<model>.safetensors.

Nothing is trained: the corpus is what the target itself wrote (decontaminated against both
benchmarks when it was built), and the automaton over it is built where it is used
(decoders/trained/datastore.py). The card reports the documents, the tokens, the file's size, and
the automaton's build time and memory measured here.

    python -m decoders.train datastore --chat 1920 --tasks 576 --code 768 --chunks 384 --seed 6
"""

from __future__ import annotations

import argparse
import collections
import datetime
import time
from pathlib import Path

from safetensors.torch import save_file

from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.corpus import command_of


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    g = ap.add_argument_group("datastore")
    g.add_argument(
        "--keep", default="chat,task,code", help="the corpus's sources the datastore keeps"
    )
    g.add_argument(
        "--out", type=Path, default=None, help="where the file goes (default: assets/sam/)"
    )


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    import json

    from decoders.core.models import load_model
    from decoders.core.suffix_automaton import StaticAutomaton
    from decoders.train.corpus import load_or_build
    from decoders.trained.datastore import docs_tensors, store_path

    t0 = time.perf_counter()
    bundle = load_model(args.model, device=args.device, dtype="float32")
    corpus = load_or_build(bundle, args)
    keep = set(args.keep.split(","))
    docs = [d for d, s in zip(corpus.docs, corpus.sources, strict=True) if s in keep]
    kinds = collections.Counter(s for s in corpus.sources if s in keep)
    tokens = collections.Counter()
    for d, s in zip(corpus.docs, corpus.sources, strict=True):
        if s in keep:
            tokens[s] += len(d)
    t1 = time.perf_counter()
    sam = StaticAutomaton(docs)
    build_s = time.perf_counter() - t1
    card = {
        "model": bundle.model_id,
        "artifact": "datastore",
        "command": command_of(argv),
        "what": "the target's own writing from the shared corpus, as token ids (uint16) and "
        "document offsets; SAM-Decoding's static suffix automaton is built over it where it is "
        "used, and Token Recycling's adjacency starts from its most frequent successors",
        "documents": dict(kinds),
        "tokens": dict(tokens),
        "decontamination": corpus.report.get("decontamination", {}),
        "corpus_report": {
            k: v for k, v in corpus.report.items() if k not in ("decontamination", "tokens")
        },
        "automaton": {
            "states": len(sam.length),
            "transitions": len(sam.tokens),
            "memory_mb": round(sam.nbytes / 2**20, 1),
            "build_s": round(build_s, 1),
            "where": "measured by this command, one CPU thread",
        },
        "seconds": round(time.perf_counter() - t0, 1),
        "date": datetime.date.today().isoformat(),
    }
    path = args.out or store_path(bundle.model_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(docs_tensors(docs), str(path), metadata={"card": json.dumps(card)})
    card["file_mb"] = round(path.stat().st_size / 2**20, 2)
    path.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    return card
