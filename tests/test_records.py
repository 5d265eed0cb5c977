"""State dict <-> ArrayRecord conversion, payload bytes, and flat stacking."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from pflower.records import FlatSpec, from_record, payload_bytes, to_record

STATE = {"a.weight": torch.randn(3, 4), "a.bias": torch.randn(3), "n.count": torch.tensor(7)}


def test_roundtrip_keeps_values_dtypes_and_order():
    rec = to_record(STATE)
    back = from_record(rec)
    assert list(back) == list(STATE)
    for k in STATE:
        assert torch.equal(back[k], STATE[k]) and back[k].dtype == STATE[k].dtype


def test_subset_of_keys():
    assert list(to_record(STATE, ["a.bias"])) == ["a.bias"]


def test_payload_bytes_counts_array_data_only():
    rec = to_record(STATE, ["a.weight", "a.bias"])
    content = RecordDict({"arrays": rec, "config": ConfigRecord({"x": 1})})
    expected = sum(len(a.data) for a in rec.values())
    assert payload_bytes(content) == expected
    # raw float32 payload plus one .npy header per array
    assert 4 * (12 + 3) < expected < 4 * (12 + 3) + 2 * 256
    assert payload_bytes(RecordDict({"arrays": ArrayRecord()})) == 0


def test_flat_spec_stack_and_unflatten():
    spec = FlatSpec.of(STATE, ["a.weight", "a.bias"])
    assert spec.size == 15 and spec.slice("a.bias") == slice(12, 15)
    other = {k: v + 1 for k, v in STATE.items()}
    stacked = spec.stack([STATE, other])
    assert stacked.shape == (2, 15)
    back = spec.unflatten(stacked[1])
    assert torch.allclose(back["a.weight"], STATE["a.weight"] + 1)
