"""Token Recycling (Luo et al. 2025): draft from the candidates every forward already computed.

A verify forward scores the whole vocabulary at every input, then keeps one token and throws the
rest away. Token Recycling keeps the top k of each row in an adjacency matrix, vocabulary × k:
row t = the k tokens the target ranked likeliest right after token t, the last time t was one of
its inputs. Drafting is then a lookup, with no model and no training: from the last committed
token, follow the matrix breadth-first along a fixed tree template.

    M = warm start (each token's k most frequent successors in the datastore; the paper's
        "hot start" carries M over from earlier queries, which would make a run depend on the
        ones before it)
    repeat:
        x = last committed token
        tree = the template's paths read from M: path (r1, r2, ...) = M[M[x][r1]][r2] ...
        logits = target([x, *tree]) with a tree mask     # ONE forward verifies every branch
        keep the target's path, commit
        for every input i of that forward: M[input_i] = top-k(logits_i)   # recycle
Greedy is token-for-token lossless (the verifier decides); sampling uses the multi-draft rule
for point-mass drafts. The template's nodes are kept while they pay on this machine (size=cost):
a node's chance is its path's product of the target's own probabilities, stored beside M.
"""

from __future__ import annotations

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.costs import forward_ms
from decoders.core.errors import InvalidParameter
from decoders.core.events import Event, Priced, Recycled
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.drafting.recycled import Adjacency, K, RecycledProposer, warm_start
from decoders.drafting.trees import TreeDraft, draft_event, keep_paying, node_cost, parse_choices

# A template 4 deep: wide at the first level, where the matrix is most often right.
DEFAULT_TEMPLATE = (
    "0 1 2 3 4 5 0.0 0.1 0.2 1.0 1.1 2.0 3.0 0.0.0 0.0.1 0.1.0 1.0.0 0.0.0.0 0.0.0.1 0.1.0.0"
)

PARAMS = (
    Param(
        "template",
        str,
        DEFAULT_TEMPLATE,
        f"the tree template: paths of successor ranks (0..{K - 1}), e.g. '0 1 0.0' = the two "
        "likeliest successors of the last token and the likeliest successor of the first",
    ),
    Param(
        "size",
        str,
        "fixed",
        "fixed = the whole template; cost = keep only the template's nodes worth their input on "
        "this machine by the target's stored probabilities (stale ones: on the tuning prompts it "
        "kept too few, 1.55 tokens per forward against the whole template's 1.74)",
        choices=("cost", "fixed"),
    ),
    Param(
        "warm",
        str,
        "auto",
        "auto = start the matrix from the datastore's most frequent successors (when one ships "
        "for this model); none = start it empty (every row its token's own id)",
        choices=("auto", "none"),
    ),
)


def check(bundle: ModelBundle, params) -> None:
    template = parse_choices(params["template"])
    if any(r >= K for path in template for r in path):
        raise InvalidParameter(f"template: ranks must be in 0..{K - 1} (the matrix keeps {K})")


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    template = parse_choices(p["template"])
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    matrix = Adjacency(
        int(bundle.model.config.vocab_size), warm_start(bundle) if p["warm"] == "auto" else None
    )
    recycled = RecycledProposer(matrix, template)
    cost = node_cost(bundle, "cost") if p["size"] == "cost" else None

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    if cost is not None:
        yield Priced(0, round(cost, 5), 0.0, forward_ms(bundle))
    step = 0
    while not budget.done:
        step += 1
        tree = recycled.propose(context, step, budget.remaining - 1) or TreeDraft()
        if cost is not None and tree.tokens:  # the likeliest paths first, while they pay
            tree = keep_paying(tree, cost)  # with their ancestors: the template's shape
        if tree.tokens:
            rows = matrix.rows(recycled.root, tree)
            yield Recycled(
                step,
                tuple((t, *map(int, matrix.succ[t].tolist())) for t in rows),
                tuple(bool(matrix.fresh[t]) for t in rows),
                matrix.warm,
            )
            yield draft_event(step, "token recycling", tree)
        verdict, logits = yield from verify_tree(
            bundle, cache, context, tree.tokens, tree.parents, sampler, budget, step
        )
        recycled.accepted(tree, verdict.accepted, logits)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="no_drafter",
        place=3,
        title="Guessing without a drafter: Token Recycling",
        narration=(
            "Every verify forward scores the whole vocabulary at every input and keeps one token. "
            "Token Recycling keeps the runners-up: an adjacency matrix holds, for each token, the "
            "eight tokens the target ranked likeliest right after it the last time it saw it. A "
            "draft is a tree read from that table, starting at the last token; after the forward, "
            "every input's row is overwritten with its new top eight. No model drafts, and "
            "nothing is trained."
        ),
        look=("the rows the draft was read from, and which of their cells the target accepted."),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="recycling",
    family="draft and verify",
    rank=1,
    title="Token Recycling (an adjacency matrix of the target's own candidates)",
    decode=decode,
    params=PARAMS,
    # Luo et al. 2025: k = 8 and a template searched for a GPU (80 nodes; ours is smaller), the
    # matrix starting empty (their hot start carries it across queries instead)
    presets={"paper": {"size": "fixed", "warm": "none"}},
    check=check,
    summary="Keeps each token's likeliest successors from every forward's logits; drafts a tree "
    "from them with no model; one forward verifies.",
    relaxable=True,
    views=("adjacency", "token_tree"),
    events=("Recycled", "Draft", "Priced", "Verify"),
)
