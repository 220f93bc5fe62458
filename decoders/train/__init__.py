"""Training for every trained part on a frozen target: `python -m decoders.train NAME ...`.

    corpus     build (and cache) the shared self-distilled chat + code corpus, then stop
    eagle      the EAGLE draft head                   -> assets/eagle/<model>.safetensors
    block      the block drafter (one forward per draft) -> assets/block/<model>.safetensors
    kangaroo   Kangaroo adapters, a sweep over ℓ      -> assets/kangaroo/<model>-l<ℓ>.safetensors
    medusa     Medusa heads (also used by blockwise)  -> assets/medusa/<model>.safetensors
    space      SPACE's mask adapter (frozen base)     -> assets/space/<model>.safetensors
    exits      early-exit adapters (calm, free, hash_ee)    -> assets/exits/<model>.safetensors
    layerskip  LayerSkip tuning of the model itself (a delta) -> assets/layerskip/<model>.safetensors
    seq2seq    the Translation lab's models, from scratch  -> assets/seq2seq/<name>.safetensors
    datastore  the retrieval datastore (sam, recycling)  -> assets/sam/<model>.safetensors

Shared pieces: `corpus` (the data), `states` (the target's hidden states over it, computed once),
`loop` (AdamW, a warm-up + cosine schedule, tqdm, resumable checkpoints, held-out metrics).
Each artifact is one module with `add_arguments(parser)` and `run(args, argv) -> card`.
"""

from __future__ import annotations

ARTIFACTS = {
    "corpus": "the shared chat + code corpus (build and cache it, then stop)",
    "eagle": "EAGLE draft head (speculative / token_tree draft=eagle)",
    "block": "block drafter: a whole draft in one forward (block_draft)",
    "kangaroo": "Kangaroo adapters, one per exit layer ℓ (kangaroo)",
    "medusa": "Medusa heads (medusa, blockwise)",
    "space": "SPACE mask embedding + mask-row LoRA on a frozen base (space)",
    "exits": "early-exit adapters and classifiers, one per exit layer (calm, free, hash_ee)",
    "layerskip": "LayerSkip tuning of the model itself: <model>-exit-tuned (layerskip)",
    "seq2seq": "the Translation lab's encoder-decoder models (decoders/seq2seq), from scratch",
    "datastore": "the retrieval datastore: the corpus as token ids (sam, recycling, token_tree)",
}
