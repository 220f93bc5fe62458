"""The target's hidden states over the corpus, computed once and shared by every drafter:
the final features (after the final norm: what the LM head reads; EAGLE's and Medusa's input) and
the states after chosen layers ℓ (Kangaroo's input), stored float16 to halve the memory.

Also the *probe*: the target's greedy answers to the tuning prompts (`assets/tuning_prompts.jsonl`,
never benchmark prompts, never in the corpus) and its states over them, scored on the answers'
positions only. Held-out documents come from the corpus's own distribution (the same Magpie
sampler, the same templates) and flatter a drafter that learned that distribution; the probe
scores it where it will draft: measured, Kangaroo's adapter after 12 more epochs went from 0.32
to 0.43 on held-out chat answers but only from 0.25 to 0.26 on the probe's chat answers."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.masking_utils import create_causal_mask

from decoders.core.models import ModelBundle
from decoders.core.runtime import cache_arg
from decoders.train.corpus import Corpus, command_of


@dataclass
class States:
    tokens: torch.Tensor  # [N] every document's ids, concatenated in document order
    starts: list[int]  # where each document begins in `tokens`
    features: torch.Tensor  # [N, d] final features, float16
    layers: dict[int, torch.Tensor]  # ℓ -> [N, d] the state after ℓ decoder layers, float16
    sources: list[str]  # per document
    # [N] whose prediction (of the next token) is scored; None: every position's. The probe
    # scores only its answers: from the prompt's last token on.
    scored: torch.Tensor | None = None

    def span(self, doc: int) -> tuple[int, int]:
        end = self.starts[doc + 1] if doc + 1 < len(self.starts) else len(self.tokens)
        return self.starts[doc], end

    def scored_at(self, a: int, b: int) -> torch.Tensor:
        """[b - a] bool: whether the predictions made at positions a..b-1 count."""
        if self.scored is None:
            return torch.ones(b - a, dtype=torch.bool)
        return self.scored[a:b]


@torch.inference_mode()
def target_states(
    bundle: ModelBundle, corpus: Corpus, layers: tuple[int, ...] = (), batch: int = 16
) -> States:
    """One forward of the frozen target over every document (similar lengths share a right-padded
    batch: causal attention keeps the padding out of every real position)."""
    inner = bundle.model.model
    docs = corpus.docs
    feats: list[torch.Tensor | None] = [None] * len(docs)
    kept: dict[int, list[torch.Tensor | None]] = {ell: [None] * len(docs) for ell in layers}
    order = sorted(range(len(docs)), key=lambda i: len(docs[i]))
    for k in tqdm(range(0, len(order), batch), desc="target states", file=sys.stderr):
        group = order[k : k + batch]
        width = max(len(docs[i]) for i in group)
        ids = torch.tensor([docs[i] + [0] * (width - len(docs[i])) for i in group])
        h = inner.embed_tokens(ids.to(bundle.device))
        pos = torch.arange(width, device=bundle.device).expand(len(group), -1)
        mask = create_causal_mask(
            config=bundle.model.config,
            inputs_embeds=h,
            attention_mask=None,
            **cache_arg(None),
            position_ids=pos,
        )
        rope = inner.rotary_emb(h, position_ids=pos)
        for depth, layer in enumerate(inner.layers, start=1):
            h = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=rope)
            if depth in kept:
                for row, i in enumerate(group):
                    kept[depth][i] = h[row, : len(docs[i])].half().cpu()
        out = inner.norm(h)
        for row, i in enumerate(group):
            feats[i] = out[row, : len(docs[i])].half().cpu()
    starts = [0]
    for doc in docs[:-1]:
        starts.append(starts[-1] + len(doc))
    return States(
        tokens=torch.tensor([t for doc in docs for t in doc]),
        starts=starts,
        features=torch.cat(feats),  # type: ignore[arg-type]
        layers={ell: torch.cat(v) for ell, v in kept.items()},  # type: ignore[arg-type]
        sources=list(corpus.sources),
    )


def prediction_counts(bundle: ModelBundle, states: States) -> torch.Tensor:
    """[vocab] how often the target's greedy prediction is each token id over the corpus."""
    head = bundle.model.lm_head.weight
    counts = torch.zeros(head.shape[0], dtype=torch.long)
    with torch.inference_mode():
        for chunk in states.features.split(4096):
            top = (chunk.to(head.device, head.dtype) @ head.T).argmax(-1).cpu()
            counts += torch.bincount(top, minlength=head.shape[0])
    return counts


def draft_vocabulary(
    bundle: ModelBundle, states: States, size: int, counts: torch.Tensor | None = None
) -> torch.Tensor:
    """The `size` tokens the target predicts most often over the corpus (FR-Spec's frequency
    ranking), plus EOS: drafting heads score only these rows of the LM head."""
    head = bundle.model.lm_head.weight
    counts = prediction_counts(bundle, states) if counts is None else counts
    size = min(size, head.shape[0])
    vocab = set(torch.topk(counts, size).indices.tolist()) | set(bundle.eos_ids)
    return torch.tensor(sorted(vocab), dtype=torch.long)


def windows(states: States, docs: list[int], length: int) -> list[tuple[int, int]]:
    """(start, end) spans of at most `length + 1` positions inside the given documents."""
    spans = []
    for doc in docs:
        s, e = states.span(doc)
        spans += [(a, min(a + length + 1, e)) for a in range(s, e - 1, length)]
    return [(a, b) for a, b in spans if b - a >= 2]


@dataclass
class Prepared:
    """What every trainer starts from: the frozen target, the corpus, its states, the split."""

    bundle: ModelBundle
    corpus: Corpus
    states: States
    train_docs: list[int]
    held_docs: list[int]
    seconds: float  # building (or loading) corpus and states
    probe: States | None = None  # the tuning prompts' answers (see the module's docstring)

    def held_out(self, window: int) -> dict[str, tuple[States, list[tuple[int, int]]]]:
        """What each trainer scores after an epoch, per source: the held-out documents' spans
        (`window` positions at most), then the probe's as source "probe"."""
        states = self.states
        held = {
            source: (
                states,
                windows(states, [d for d in self.held_docs if states.sources[d] == source], window),
            )
            for source in sorted(set(states.sources))
        }
        if self.probe is not None:
            held["probe"] = (self.probe, windows(self.probe, range(len(self.probe.starts)), window))
        return held


def answers_only(bundle: ModelBundle, states: States) -> States:
    """The same states with, in chat and task documents, only the answer's predictions scored:
    from the assistant header's last token on (it predicts the answer's first token). The user's
    turn was sampled at temperature 1 and a drafter only ever drafts answers, so the official
    EAGLE code trains on the assistant's part alone. Code documents keep every position; a
    template without an assistant header leaves everything scored."""
    header = assistant_header(bundle)
    scored = states.scored.clone() if states.scored is not None else torch.ones_like(states.tokens)
    scored = scored.bool()
    tokens = states.tokens.tolist()
    for doc, source in enumerate(states.sources):
        if not header or source not in ("chat", "task"):
            continue
        a, b = states.span(doc)
        ids = tokens[a:b]
        starts = [
            i for i in range(len(ids) - len(header) + 1) if ids[i : i + len(header)] == header
        ]
        last = starts[-1] + len(header) - 1 if starts else b - a  # no header: nothing scored
        scored[a : a + last] = False
    return dataclasses.replace(states, scored=scored)


def assistant_header(bundle: ModelBundle) -> list[int]:
    """The tokens the chat template puts before an answer (its generation prompt), or []."""
    tok = bundle.tokenizer
    turn = [{"role": "user", "content": "x"}]
    try:
        asked = tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
        plain = tok.apply_chat_template(turn, add_generation_prompt=False, tokenize=False)
    except Exception:  # no chat template
        return []
    if not asked.startswith(plain) or asked == plain:
        return []
    return tok(asked[len(plain) :], add_special_tokens=False).input_ids


SHALLOW = range(1, 7)  # the layer-ℓ states kept for Kangaroo's sweep (ℓ < the model's depth)


def prepare(args, layers: tuple[int, ...] | None = None, probe: bool = True) -> Prepared:
    """Load the target (float32: the drafters learn the features the CPU default feeds them),
    the shared corpus and the target's states over it (final features and the states after each
    ℓ in `layers`, default SHALLOW), cached beside the corpus so every trainer reuses them; and
    the probe, unless `probe` is False or `--probe-tokens` is 0."""
    import time

    from decoders.core.models import cache_dir, load_model
    from decoders.train.corpus import corpus_key, load_or_build

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    bundle = load_model(args.model, device=args.device, dtype="float32")
    corpus = load_or_build(bundle, args)
    default = layers is None
    layers = tuple(ell for ell in (SHALLOW if default else layers) if ell < bundle.n_layers)
    key = corpus_key(bundle, args)
    tail = "" if default else "-" + "-".join(map(str, layers))  # another layer set, another file
    path = cache_dir() / "corpus" / f"{key}.states{tail}.pt"
    cached = States(**torch.load(path)) if path.is_file() and not args.no_cache else None
    if cached is not None and len(cached.tokens) == sum(map(len, corpus.docs)):
        states = cached  # (another corpus under the same options would differ in length)
    else:
        states = target_states(bundle, corpus, layers)
        if not args.no_cache:  # (a corpus taken from a datastore made no cache folder)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(states.__dict__, path)
    train, held = corpus.split(args.held_out, args.seed)
    scored = probe_states(bundle, layers, args) if probe and args.probe_tokens else None
    return Prepared(bundle, corpus, states, train, held, time.perf_counter() - t0, scored)


def probe_states(bundle: ModelBundle, layers: tuple[int, ...], args) -> States:
    """The target's states over its greedy answers (`--probe-tokens` long) to the tuning prompts,
    only the answers' positions scored; cached beside the corpus."""
    import hashlib
    import json

    from decoders import generate
    from decoders.core.models import cache_dir
    from decoders.trained.artifacts import ASSETS

    text = (ASSETS / "tuning_prompts.jsonl").read_text()
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    tail = "-".join(map(str, layers))
    name = f"probe-{bundle.model_id}-{args.probe_tokens}-{digest}-{tail}.pt".replace("/", "-")
    path = cache_dir() / "corpus" / name
    if path.is_file() and not args.no_cache:
        return States(**torch.load(path))
    docs, answer_from = [], []
    for row in (json.loads(line) for line in text.splitlines() if line.strip()):
        prompt = bundle.encode(row["prompt"], chat=row.get("chat"))
        res = generate(
            bundle,
            row["prompt"],
            method="autoregressive",
            max_new_tokens=args.probe_tokens,
            chat=row.get("chat"),
            record=False,
        )
        docs.append(prompt + list(res.token_ids))
        answer_from.append(len(prompt) - 1)  # the prompt's last token predicts the first answer's
    states = target_states(bundle, Corpus(docs, ["probe"] * len(docs)), layers)
    scored = torch.zeros(len(states.tokens), dtype=torch.bool)
    for doc, first in enumerate(answer_from):
        a, b = states.span(doc)
        scored[a + first : b] = True
    states.scored = scored
    if not args.no_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(states.__dict__, path)
    return states


def card(prep: Prepared, name: str, argv: list[str], **fields) -> dict:
    """The JSON card beside every artifact: the command, the data, the time, the scores."""
    import datetime

    return {
        "model": prep.bundle.model_id,
        "artifact": name,
        "command": command_of(argv),
        **fields,
        "data": {
            **prep.corpus.report,
            "train_documents": len(prep.train_docs),
            "held_out_documents": len(prep.held_docs),
        },
        "device": str(prep.bundle.device),
        "date": datetime.date.today().isoformat(),
    }


def checkpoint_path(out: Path) -> Path:
    """Where a run training `out` keeps its resumable checkpoint (the cache, not assets/)."""
    from decoders.core.models import cache_dir

    return cache_dir() / "train" / f"{out.parent.name}-{out.stem}.ckpt"
