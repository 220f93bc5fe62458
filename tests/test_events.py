import json

import pytest

from decoders.core.errors import TraceError
from decoders.core.events import (
    EVENT_TYPES,
    AttentionMask,
    BlockFill,
    CatchUp,
    Commit,
    CopySource,
    Done,
    Draft,
    DraftStop,
    Forward,
    HeadProposals,
    JacobiIteration,
    LayerExit,
    LookaheadWindow,
    MaskGroups,
    MaskPredictStep,
    NgramPool,
    Prefill,
    Priced,
    Recycled,
    StoreMatch,
    TopK,
    Verify,
)
from decoders.core.tracefile import SCHEMA_VERSION, event_from_dict, trace_from_json, trace_to_dict

SAMPLES = [
    Prefill((1, 2, 3)),
    Forward(0, "prefill", 3, 30, 12.5),
    Draft(1, "self:8", (5, 6, 7), (-1, 0, 0), (0.5, 0.25, 0.125)),
    Verify(1, (0,), 9, "greedy-tree"),
    Verify(2, (), None, "greedy-chain"),
    JacobiIteration(3, 0, (4, 5), (True, False)),
    NgramPool(3, ((1, 2, 3), (4, 5, 6)), 2),
    NgramPool(4, (), 1, 12, ((3, 1, 2, 3),)),
    LookaheadWindow(3, ((1, 2), (3, 4)), (5, 6)),
    AttentionMask(3, ("x", "look L0·0", "verify n0·d0"), ((0,), (0, 1), (0, 2))),
    Verify(3, (0, 1), 7, "greedy-tree", (0.9, 0.8)),
    DraftStop(4, 0.6, (0.9, 0.4), "confidence", 0.8),
    CopySource(4, 3, 2, 20),
    StoreMatch(4, 3, 12, (7, 5, 2), 1),
    Recycled(5, ((7, 8, 9), (8, 10, 11)), (True, False)),
    HeadProposals(5, 7, ((5, 6), (7, 8)), ((0.5, 0.25), (0.125, 0.0625))),
    BlockFill(5, 7, ((5, 6), (7, 8)), ((0.5, 0.25), (0.125, 0.0625))),
    MaskGroups(
        6, 9, (4, 5), ((4, 5), (5, 6), (6, 7)), ((0.5, 0.25), (0.5, 0.125), (0.25, 0.75)), 1, (5, 6)
    ),
    MaskPredictStep(7, 12, 1, (4, 5, 6), (0.9, 0.5, 0.25), (1, 2), (2,)),
    TopK(0, 0, (5, 6), (0.7, 0.2)),
    Commit(1, (5, 9), ("draft", "correction"), (0.5, 0.9)),
    Commit(7, (4, 5), ("target", "mask"), (0.9, 0.5)),
    Verify(8, (0, 1), 3, "relaxed-top-3", (0.9, 0.1), (1,), (6,)),
    Draft(12, "eagle + prompt lookup", (5, 6, 7, 8), (-1, 0, 0, 2), (0.5, 0.2, 1.0, 1.0), (2, 3)),
    Commit(8, (4, 5, 3), ("draft", "relaxed", "correction"), (0.9, 0.1, 0.8)),
    LayerExit(9, 14, 21, 30, (18, 21), (0.4, 0.995), 0.99, "confidence"),
    LayerExit(10, 15, 27, 30, (), (), 0.0, "hash"),
    Commit(9, (4,), ("exit",), (0.97,)),
    CatchUp(11, (14, 15), (True, False), 0.85),
    Priced(0, 0.0391, 0.2231, 23.1),
    Forward(1, "verify", 6, 30, 20.0, 2, 1),  # resumed at an exit, layer 2: one input ran 1..2
    Done("eos", {"new_tokens": 2, "acceptance_by_position": [1.0]}),
]


def test_every_event_type_has_a_sample():
    assert {type(e).type for e in SAMPLES} == set(EVENT_TYPES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_event_json_round_trip(event):
    again = event_from_dict(json.loads(json.dumps(event.to_dict())))
    assert again == event
    assert type(again) is type(event)


def test_events_are_frozen():
    with pytest.raises(AttributeError):
        SAMPLES[0].prompt_ids = (9,)


def test_trace_round_trip():
    data = trace_to_dict({"method": "autoregressive", "token_ids": [5, 9]}, SAMPLES)
    assert data["version"] == SCHEMA_VERSION
    meta, events = trace_from_json(json.dumps(data))
    assert events == SAMPLES
    assert meta == {"method": "autoregressive", "token_ids": [5, 9]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a trace file: it is not JSON"),
        (b"\x89PNG\r\n\x1a\n\x00\xff", "not a trace file: it is not text"),
        ("[1, 2]", "not a Decoding Lab trace"),
        pytest.param("[" * 100_000 + "]" * 100_000, "nested too deeply", id="deeply-nested"),
        ('{"format": "decoding-lab-trace", "version": 99, "events": []}', "version 99"),
        ('{"format": "decoding-lab-trace", "version": 1, "events": {}}', "must be a list"),
        (
            '{"format": "decoding-lab-trace", "version": 1, "events": [{"type": "Boom"}]}',
            "unknown event type",
        ),
        (
            '{"format": "decoding-lab-trace", "version": 1, "events": [{"type": "Prefill"}]}',
            "missing field 'prompt_ids'",
        ),
        (
            '{"format": "decoding-lab-trace", "version": 1, "events": [{"type": "Prefill", "prompt_ids": ["a"]}]}',
            "expected an integer",
        ),
        (
            '{"format": "decoding-lab-trace", "version": 1, "events": [{"type": "Verify", "step": 1, '
            '"accepted": [0], "correction": 1.5, "rule": "x"}]}',
            "expected an integer",
        ),
    ],
)
def test_corrupt_traces_are_refused_clearly(text, message):
    with pytest.raises(TraceError, match=message):
        trace_from_json(text)


def test_oversized_trace_is_refused():
    with pytest.raises(TraceError, match="limit"):
        trace_from_json("x" * 101, max_bytes=100)


def test_fields_added_later_have_defaults_for_old_traces():
    old = (
        '{"format": "decoding-lab-trace", "version": 1, "events": [{"type": "Verify", "step": 1, '
        '"accepted": [0], "correction": 7, "rule": "greedy-chain"}]}'
    )
    _, events = trace_from_json(old)
    assert events == [Verify(1, (0,), 7, "greedy-chain", ())]
