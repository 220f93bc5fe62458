"""Concurrent runs are isolated: runs made at the same time, on the same shared model, give exactly
the tokens, statistics and trace events of the same runs made alone (only timings may differ).

Nothing per run may live on the shared model or its modules (hooks, attributes, caches): a hook
registered by one run fires for every other run's forward while it is registered.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from conftest import PROMPTS
from decoders import METHODS, stream
from decoders.core.events import Done, Event, Forward
from decoders.core.runtime import forward, new_cache
from decoders.core.stats import untimed
from decoders.trained.eagle import load_head

# Every method with its defaults, plus variants that exercise each drafter and rule.
TINY_RUNS: list[tuple[str, dict[str, Any]]] = [
    *((name, {}) for name in METHODS),
    ("speculative", {"draft": "eagle"}),
    ("speculative", {"draft": "self:2", "gamma": 3, "schedule": "fixed"}),
    ("speculative", {"draft": "eagle", "temperature": 0.8, "seed": 3}),
    ("token_tree", {"draft": "eagle"}),
    ("token_tree", {"draft": "eagle", "lookup": 8, "trust": 2}),
    ("token_tree", {"draft": "self:2", "shape": "static"}),
    ("token_tree", {"draft": "eagle", "temperature": 0.7, "seed": 1}),
    ("self_speculative", {"skip": "attn:1 mlp:2", "adaptive": False}),
    ("lookahead", {"N": 4, "W": 3, "G": 2}),
    ("medusa", {"nodes": 63, "temperature": 0.7, "seed": 2}),
    ("blockwise", {"k": 2, "temperature": 0.8, "seed": 3}),
    ("kangaroo", {"exit_layer": "2", "eta": 0.0, "temperature": 0.8, "seed": 4}),
    ("space", {"k": 3, "groups": 3, "temperature": 0.8, "seed": 5}),
    ("mask_predict", {"m": 4, "T": 3}),
]


def comparable(events: list[Event]) -> list[Event]:
    """The events with their wall-clock measurements zeroed (the only thing allowed to differ)."""
    out = []
    for e in events:
        if isinstance(e, Forward):
            e = dataclasses.replace(e, wall_ms=0.0)
        elif isinstance(e, Done):
            e = dataclasses.replace(e, stats=untimed(e.stats))
        out.append(e)
    return out


def run_once(bundle, prompt, method, params, budget, barrier=None) -> list[Event]:
    """One run's events. With a barrier: decode the prefill, wait there until every other run has
    done the same (so all runs are in flight at once, each holding its own cache and drafter),
    then decode the rest concurrently."""
    events: list[Event] = []
    for event in stream(bundle, prompt, method, budget, **params):
        events.append(event)
        if barrier is not None and isinstance(event, Forward) and event.kind == "prefill":
            barrier.wait(timeout=120)
    return events


def check_isolated(bundle, runs, budget, rounds=1):
    """Every run alone, then all of them at once in threads: identical up to timings."""
    jobs = [(PROMPTS[i % len(PROMPTS)], method, params) for i, (method, params) in enumerate(runs)]
    alone = [comparable(run_once(bundle, p, m, kw, budget)) for p, m, kw in jobs]
    for _ in range(rounds):
        barrier = threading.Barrier(len(jobs))
        with ThreadPoolExecutor(len(jobs)) as pool:
            futures = [
                pool.submit(run_once, bundle, p, m, kw, budget, barrier) for p, m, kw in jobs
            ]
            together = [comparable(f.result()) for f in futures]
        for (_, method, params), a, t in zip(jobs, alone, together, strict=True):
            label = f"{method} {params}"
            assert t[-1].stats == a[-1].stats, label
            assert t == a, label


def module_state(model) -> dict[str, tuple]:
    """Per module: its attribute names and how many hooks it holds."""
    return {
        name: (
            sorted(vars(m)),
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
            sorted(m._buffers),
        )
        for name, m in model.named_modules()
    }


def test_runs_register_no_hooks_and_leave_nothing_on_the_model(tiny, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("a run registered a hook on a (shared) module")

    load_head(tiny)  # the shared head is loaded once, before the runs
    before = module_state(tiny.model)
    for hook in ("register_forward_hook", "register_forward_pre_hook"):
        monkeypatch.setattr(torch.nn.Module, hook, refuse)
    monkeypatch.setattr(torch.nn.modules.module, "register_module_forward_hook", refuse)
    for method, params in TINY_RUNS:
        run_once(tiny, PROMPTS[0], method, params, 12)
    out = forward(tiny, new_cache(tiny), [1, 2, 3], step=0, kind="target", hidden_at=(1, 4))
    assert sorted(out.hidden) == [1, 4]
    assert module_state(tiny.model) == before


@pytest.mark.slow
def test_every_method_at_once_on_tiny(tiny):
    check_isolated(tiny, TINY_RUNS, budget=24)


@pytest.mark.slow
def test_methods_at_once_on_embedded(embedded):
    runs = [
        ("token_tree", {}),  # auto: the shipped EAGLE head + a copied branch
        ("token_tree", {"draft": "eagle", "lookup": 0, "trust": 0}),
        ("speculative", {}),  # auto: the shipped EAGLE head
        ("lookahead", {}),
        ("self_speculative", {}),
    ]
    check_isolated(embedded, runs, budget=32)


# --- the app: concurrent /run calls through gradio_client ------------------------------------------

# Through the app: every method in the registry, at its defaults but where the tiny model needs
# other settings to show its work, plus variants that exercise the EAGLE head and relaxed rule.
APP_SETTINGS: dict[str, dict[str, Any]] = {
    "layerskip": {"exit_layer": "2"},
    "calm": {"threshold": 0.5, "min_depth": 0.0},  # exits on the placeholder exits
    "hash_ee": {"min_depth": 0.0},
    "free": {"exit_layer": "2", "threshold": 0.0016},  # about half the tokens held back
}
APP_RUNS: list[tuple[str, dict[str, Any]]] = [
    *((name, APP_SETTINGS.get(name, {})) for name in METHODS),
    ("token_tree", {"draft": "eagle"}),
    ("token_tree", {"draft": "eagle", "lookup": 8, "trust": 2}),
    ("speculative", {"draft": "eagle"}),
    ("speculative", {"draft": "eagle", "beta": 4, "tolerance": 3.0}),  # relaxed verification
]


def test_the_app_settings_name_registered_methods():
    assert set(APP_SETTINGS) <= set(METHODS)


def app_result(client, prompt: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """What /run returns, minus timings: text, stats (lossless badge included) and the trace."""
    text, stats, trace = client.predict(prompt, method, "", 40, json.dumps(params), api_name="/run")
    for event in trace["events"]:
        if event["type"] == "Forward":
            event["wall_ms"] = 0.0
        elif event["type"] == "Done":
            event["stats"] = untimed(event["stats"])
    trace["stats"] = untimed(trace["stats"])
    return {"text": text, "stats": untimed(stats), "trace": trace}


@pytest.mark.slow
def test_concurrent_run_calls_of_every_method(server):
    """The issue's report: six concurrent /run calls broke EAGLE trees; here every method's at
    once, each identical to its run alone."""
    from gradio_client import Client

    client = Client(server, verbose=False)
    jobs = [(PROMPTS[i % len(PROMPTS)], m, params) for i, (m, params) in enumerate(APP_RUNS)]
    alone = [app_result(client, *job) for job in jobs]
    # Once: test_every_method_at_once_on_tiny repeats the in-process runs under a barrier.
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(app_result, Client(server, verbose=False), *job) for job in jobs]
        together = [f.result() for f in futures]  # re-raises any failed call
    for (_, method, params), a, t in zip(jobs, alone, together, strict=True):
        assert t == a, f"{method} {params}"
