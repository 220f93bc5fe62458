"""Train the EAGLE draft head for a model (`speculative:draft=eagle`, `token_tree:draft=eagle`).

    python -m decoders.train_eagle --model embedded            # data + training, writes assets/eagle/

EAGLE (Li et al. 2024) drafts at the feature level: one decoder layer reads the target's final
hidden state f_i together with the embedding of the next token t_{i+1}, and predicts f_{i+1}; the
target's own LM head turns that into a token. Training follows EAGLE-1: a smooth-L1 loss on the
predicted feature plus 0.1 × cross-entropy against the target's distribution, with noise on the
input features so the head tolerates its own (imperfect) features when it drafts several steps.

Data, all offline and none of it benchmark prompts (never train on what you benchmark):
- self-distilled completions: Python standard-library functions cut after their docstring (the
  same shape as a code-completion prompt), continued greedily by the target itself, so the head
  learns what *this* model writes;
- raw standard-library source, teacher-forced.
The target reads both once; its final features and its distribution are the training signal.

The head ships as `assets/eagle/<model>.safetensors` (float16, ~8 MB for the embedded model) with a
JSON record of the command, the data and the held-out agreement.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.metadata
import importlib.util
import json
import math
import multiprocessing
import random
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .eagle import EagleHead, head_path, save_head
from .models import ModelBundle, cache_dir, load_model

FEATURE_NOISE = 0.2  # std of the Gaussian noise on input features, relative to their RMS
CLS_WEIGHT = 0.1  # EAGLE-1's weight of the classification loss


# --- data ---------------------------------------------------------------------------------------


SKIP_DIRS = {"test", "tests", "testing", "idlelib", "site-packages", "lib2to3", "turtledemo"}


def stdlib_files() -> list[Path]:
    return _python_files(Path(sysconfig.get_paths()["stdlib"]))


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts))


def source_files(sources: list[str]) -> tuple[list[Path], list[str]]:
    """The .py files of each source ('stdlib', or an installed package such as 'numpy'), and a
    label per source with its version, for the head's record."""
    files, labels = [], []
    for name in sources:
        if name == "stdlib":
            files += stdlib_files()
            labels.append(f"Python {sys.version.split()[0]} standard library")
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"error: --sources: no installed package {name!r}")
        files += _python_files(Path(next(iter(spec.submodule_search_locations))))
        # The import name can differ from the distribution's (sklearn is scikit-learn).
        dists = importlib.metadata.packages_distributions().get(name, [name])
        try:
            labels.append(f"{name} {importlib.metadata.version(dists[0])}")
        except importlib.metadata.PackageNotFoundError:
            labels.append(name)
    return files, labels


def function_prompts(files: list[Path]) -> list[str]:
    """Every documented top-level function, cut right after its docstring: signature + docstring,
    the shape of a code-completion prompt. Files are parsed in parallel, results kept in order."""
    if len(files) < 64:
        return [p for path in files for p in _file_prompts(path)]
    with multiprocessing.get_context("fork").Pool() as pool:  # workers only parse text
        return [p for found in pool.map(_file_prompts, files, chunksize=16) for p in found]


def _file_prompts(path: Path) -> list[str]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines, prompts = source.splitlines(), []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.body:
            continue
        doc = ast.get_docstring(node)
        if not doc or not 40 <= len(doc) <= 1200 or len(node.body) < 2:
            continue
        header = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
        if len(header) <= 2000:
            prompts.append(header)
    return prompts


def code_chunks(files: list[Path], n: int, chars: int, rng: random.Random) -> list[str]:
    """`n` random spans of raw source, each starting at a line boundary."""
    texts = [t for t in (p.read_text(encoding="utf-8", errors="replace") for p in files) if t]
    chunks = []
    while len(chunks) < n:
        text = rng.choice(texts)
        if len(text) < chars:
            continue
        start = text.rfind("\n", 0, rng.randrange(len(text) - chars + 1)) + 1
        chunks.append(text[start : start + chars])
    return chunks


@torch.inference_mode()
def complete(
    bundle: ModelBundle, prompts: list[str], max_new_tokens: int, batch: int
) -> list[list[int]]:
    """Greedy continuations of `prompts` by the target (batched, left-padded): prompt + completion ids."""
    tok = bundle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(bundle.eos_ids)
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        encoded = [bundle.encode(p, chat=False) for p in prompts[i : i + batch]]
        width = max(map(len, encoded))
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        gen = bundle.model.generate(
            input_ids=ids.to(bundle.device),
            attention_mask=mask.to(bundle.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        for e, row in zip(encoded, gen[:, width:].tolist(), strict=True):
            stop = next((j + 1 for j, t in enumerate(row) if t in bundle.eos_ids), len(row))
            out.append(e + row[:stop])
        print(f"  completed {len(out)}/{len(prompts)}", file=sys.stderr, flush=True)
    return out


@torch.inference_mode()
def target_features(
    bundle: ModelBundle, docs: list[list[int]], batch: int = 16
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The target's final (post-norm) features for every position of every document, concatenated
    in document order (float32, on the model's device), with the token ids and each document's
    start offset. Documents of similar length share a right-padded forward: causal attention keeps
    the padding out of every real position."""
    inner = bundle.model.model
    feats: list[torch.Tensor | None] = [None] * len(docs)
    order = sorted(range(len(docs)), key=lambda i: len(docs[i]))
    for k in range(0, len(order), batch):
        group = order[k : k + batch]
        width = max(len(docs[i]) for i in group)
        ids = torch.tensor([docs[i] + [0] * (width - len(docs[i])) for i in group])
        hidden = inner(input_ids=ids.to(bundle.device)).last_hidden_state.float()
        for row, i in enumerate(group):
            feats[i] = hidden[row, : len(docs[i])]
    starts = [0]
    for doc in docs[:-1]:
        starts.append(starts[-1] + len(doc))
    tokens = torch.tensor([t for doc in docs for t in doc], device=bundle.device)
    return torch.cat(feats), tokens, starts


def build_data(bundle: ModelBundle, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    files, labels = source_files(args.sources.split(","))
    prompts = function_prompts(files)
    rng.shuffle(prompts)
    prompts = sorted(prompts[: args.prompts], key=len)  # similar lengths batch with little padding
    t0 = time.perf_counter()
    print(
        f"self-distilling {len(prompts)} function prompts from {files and labels}", file=sys.stderr
    )
    docs = complete(bundle, prompts, args.completion_tokens, args.batch)
    chunks = code_chunks(files, args.chunks, args.chunk_chars, rng)
    docs += [bundle.encode(c, chat=False)[:512] for c in chunks]
    rng.shuffle(docs)
    feats, tokens, starts = target_features(bundle, docs)
    print(
        f"data: {len(docs)} documents, {len(tokens)} tokens in {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )
    return {
        "features": feats,
        "tokens": tokens,
        "starts": starts,
        "n_prompts": len(prompts),
        "sources": labels,
    }


# --- training -----------------------------------------------------------------------------------


def draft_vocabulary(bundle: ModelBundle, data: dict[str, Any], size: int) -> torch.Tensor:
    """The `size` tokens the target predicts most often on the training data (FR-Spec's frequency
    ranking), plus EOS: the head only scores these, which keeps each draft step cheap."""
    head = bundle.model.lm_head.weight
    counts = torch.zeros(head.shape[0], dtype=torch.long, device=head.device)
    with torch.inference_mode():
        for chunk in data["features"].split(4096):
            counts += torch.bincount((chunk @ head.T).argmax(-1), minlength=head.shape[0])
    size = min(size, head.shape[0])
    vocab = set(torch.topk(counts, size).indices.tolist()) | set(bundle.eos_ids)
    return torch.tensor(sorted(vocab), dtype=torch.long, device=head.device)


def windows(data: dict[str, Any], length: int) -> list[tuple[int, int]]:
    """(start, end) spans of at most `length + 1` positions that never cross a document boundary."""
    ends = [*data["starts"][1:], len(data["tokens"])]
    spans = []
    for s, e in zip(data["starts"], ends, strict=True):
        spans += [(a, min(a + length + 1, e)) for a in range(s, e - 1, length)]
    return [(a, b) for a, b in spans if b - a >= 2]


def batches(
    spans: list[tuple[int, int]], batch: int, rng: random.Random
) -> Iterator[list[tuple[int, int]]]:
    order = spans[:]
    rng.shuffle(order)
    for i in range(0, len(order), batch):
        yield order[i : i + batch]


def run_head(
    head: EagleHead,
    embed: torch.nn.Embedding,
    data: dict[str, Any],
    span_batch: list[tuple[int, int]],
    noise: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a batch of spans; returns predicted features, target features, and the valid mask."""
    width = max(b - a for a, b in span_batch) - 1
    d, dev = data["features"].shape[1], data["features"].device
    feats = torch.zeros(len(span_batch), width, d, device=dev)
    nexts = torch.zeros(len(span_batch), width, d, device=dev)
    ids = torch.zeros(len(span_batch), width, dtype=torch.long, device=dev)
    valid = torch.zeros(len(span_batch), width, dtype=torch.bool, device=dev)
    for r, (a, b) in enumerate(span_batch):
        n = b - a - 1
        feats[r, :n] = data["features"][a : b - 1]
        nexts[r, :n] = data["features"][a + 1 : b]
        ids[r, :n] = data["tokens"][a + 1 : b]
        valid[r, :n] = True
    if noise:
        feats = feats + torch.randn_like(feats) * noise * feats.pow(2).mean().sqrt()
    positions = torch.arange(width, device=dev).expand(len(span_batch), -1)
    with torch.no_grad():
        embeds = embed(ids)
    # Padding sits after each span's real positions, so causal attention never lets a real
    # position see it.
    pred = head(embeds, feats, positions)
    return pred, nexts, valid


def losses(
    w: torch.Tensor, pred, nexts, valid, cls_weight: float = CLS_WEIGHT
) -> dict[str, torch.Tensor]:
    """EAGLE-1's losses; `w` is the target's LM head cut to the draft vocabulary."""
    pred, nexts = pred[valid], nexts[valid]
    reg = F.smooth_l1_loss(pred, nexts)
    with torch.no_grad():
        target = torch.softmax(nexts @ w.T, -1)
    logits = pred @ w.T
    cls = -(target * torch.log_softmax(logits, -1)).sum(-1).mean()
    agree = (logits.argmax(-1) == target.argmax(-1)).float().mean()
    return {"loss": reg + cls_weight * cls, "reg": reg, "cls": cls, "top1": agree}


def evaluate(head, bundle, data, spans, batch) -> dict[str, float]:
    w, embed = bundle.model.lm_head.weight[head.vocab], bundle.model.model.embed_tokens
    totals: dict[str, float] = {}
    count = 0
    head.eval()
    with torch.no_grad():
        for i in range(0, len(spans), batch):
            pred, nexts, valid = run_head(head, embed, data, spans[i : i + batch], 0.0)
            n = int(valid.sum())
            for k, v in losses(w, pred, nexts, valid).items():
                totals[k] = totals.get(k, 0.0) + float(v) * n
            count += n
    head.train()
    return {k: round(v / max(count, 1), 4) for k, v in totals.items()}


def train(
    bundle: ModelBundle,
    data: dict[str, Any],
    args: argparse.Namespace,
    on_epoch: Callable[[EagleHead, dict], None] | None = None,
) -> tuple[EagleHead, dict]:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    vocab = draft_vocabulary(bundle, data, args.vocab)
    head = EagleHead(bundle.model.config, vocab).to(bundle.device)
    spans = windows(data, args.window)
    rng.shuffle(spans)
    held = max(1, len(spans) // 20)
    val, spans = spans[:held], spans[held:]
    steps = args.epochs * math.ceil(len(spans) / args.batch_size)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=steps, pct_start=0.05)
    w, embed = bundle.model.lm_head.weight[vocab].detach(), bundle.model.model.embed_tokens
    print(
        f"training: vocab {len(vocab)}, {len(spans)} spans, {steps} steps, "
        f"{sum(p.numel() for p in head.parameters()) / 1e6:.1f}M parameters",
        file=sys.stderr,
    )
    t0, step = time.perf_counter(), 0
    for epoch in range(args.epochs):
        for span_batch in batches(spans, args.batch_size, rng):
            pred, nexts, valid = run_head(head, embed, data, span_batch, FEATURE_NOISE)
            out = losses(w, pred, nexts, valid, args.cls_weight)
            opt.zero_grad()
            out["loss"].backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0:
                print(
                    f"  epoch {epoch + 1} step {step}/{steps} loss {out['loss'].item():.3f} "
                    f"top1 {out['top1'].item():.3f} ({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        score = evaluate(head, bundle, data, val, args.batch_size)
        print(f"epoch {epoch + 1}: held-out {score}", file=sys.stderr)
        if on_epoch:
            on_epoch(head, {"held_out": score, "epochs_done": epoch + 1})
    score = evaluate(head, bundle, data, val, args.batch_size)
    return head.cpu(), {
        "held_out": score,
        "train_tokens": int(sum(b - a - 1 for a, b in spans)),
        "minutes": round((time.perf_counter() - t0) / 60, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m decoders.train_eagle", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda when there is one)")
    ap.add_argument(
        "--sources",
        default="stdlib",
        help="comma-separated code sources: stdlib and/or installed packages (numpy,scipy,...)",
    )
    ap.add_argument("--prompts", type=int, default=800, help="function prompts to self-distill")
    ap.add_argument("--completion-tokens", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=300, help="raw stdlib source chunks")
    ap.add_argument("--chunk-chars", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32, help="generation batch")
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cls-weight", type=float, default=CLS_WEIGHT, help="weight of the token loss")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--data-only", action="store_true", help="build (and cache) the data, then stop"
    )
    ap.add_argument("--no-cache", action="store_true", help="do not cache the built data on disk")
    ap.add_argument(
        "--out", type=Path, default=None, help="default: assets/eagle/<model>.safetensors"
    )
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    # float32 everywhere: the head learns the features the CPU default (float32) will feed it.
    bundle = load_model(args.model, device=args.device, dtype="float32")
    sources = "" if args.sources == "stdlib" else f"-{args.sources}"
    key = f"{bundle.model_id}-{args.prompts}-{args.completion_tokens}-{args.chunks}-{args.chunk_chars}-{args.seed}{sources}"
    cached = cache_dir() / "eagle-data" / (key.replace("/", "--").replace(",", "+") + ".pt")
    if cached.is_file():
        data = torch.load(cached, map_location=bundle.device)
    else:
        data = build_data(bundle, args)
        if not args.no_cache:
            cached.parent.mkdir(parents=True, exist_ok=True)
            torch.save(data, cached)
    if args.data_only:
        return 0
    out = args.out or head_path(bundle.model_id)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--out" in given:  # where the file went is not how it was made
        i = given.index("--out")
        del given[i : i + 2]

    def record(head: EagleHead, score: dict) -> dict:
        return {
            "model": bundle.model_id,
            "vocab": len(head.vocab),
            **score,
            "data": {
                "self_distilled_prompts": data["n_prompts"],
                "completion_tokens": args.completion_tokens,
                "raw_chunks": args.chunks,
                "sources": data.get(
                    "sources", [f"Python {sys.version.split()[0]} standard library"]
                ),
                "device": str(bundle.device),
            },
            "epochs": args.epochs,
            "lr": args.lr,
            "cls_weight": args.cls_weight,
            "command": ("python -m decoders.train_eagle " + " ".join(given)).strip(),
            "date": datetime.date.today().isoformat(),
        }

    # Each epoch's head is written too, so a run cut short still leaves its best so far.
    head, score = train(bundle, data, args, lambda h, s: save_head(h, out, record(h, s)))
    save_head(head, out, record(head, score))
    print(json.dumps(record(head, score), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
