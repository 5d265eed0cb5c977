"""State dict <-> ArrayRecord conversion, payload bytes, and flat stacking."""

import numpy as np
import pytest
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


@pytest.mark.parametrize("seed", range(5))
def test_a_stack_held_as_float64_has_exactly_the_float32_rows_values(seed):
    """Stacking straight into float64 (the averages' input) gives the bytes of stacking as
    float32, then converting: every dtype a state may hold (large int64 counters and float64
    values round through float32 as before)."""
    g = torch.Generator().manual_seed(seed)
    state = lambda: {  # noqa: E731
        "w": torch.randn(5, 3, generator=g) * 10.0 ** torch.randint(-30, 30, (1,), generator=g).item(),
        "h": torch.randn(4, generator=g).half(),
        "d": torch.randn(6, generator=g, dtype=torch.float64) * 1e300,
        "n": torch.randint(-(2**62), 2**62, (3,), generator=g),
        "b": torch.tensor(16777217),
        "e": torch.empty(0, 2),
        "bf": torch.randn(7, generator=g).bfloat16(),
        "t": torch.randn(4, 5, generator=g).t(),  # not contiguous
        "x": torch.randn(1, 3, generator=g).expand(4, 3),  # strides of 0
        "u": torch.randint(0, 256, (4,), generator=g, dtype=torch.uint8),
        "f": torch.tensor([True, False]),
        "s": torch.tensor([float("nan"), -0.0, 2.0**-149, float("inf")]),
    }
    states = [state() for _ in range(int(torch.randint(1, 6, (1,), generator=g)))]
    spec = FlatSpec.of(states[0])
    old = torch.stack([spec.flatten(s) for s in states]).double()
    new = spec.stack(states, torch.float64)
    assert new.dtype == torch.float64 and new.shape == old.shape
    assert new.numpy().tobytes() == old.numpy().tobytes()
    assert spec.stack(states).numpy().tobytes() == torch.stack([spec.flatten(s) for s in states]).numpy().tobytes()


def test_arrays_are_flowers_byte_for_byte_and_read_back_as_np_load_reads_them():
    """The fast paths of :func:`to_record` and :func:`from_record` give what ``Array(ndarray)``
    and ``Array.numpy()`` give; bytes that are not exactly np.save's for the declared dtype and
    shape (Fortran order, a shape that disagrees with the header) are read by Flower."""
    from flwr.app import Array

    from pflower.records import _array, _ndarray

    cases = [np.random.rand(3, 4).astype(np.float32), np.arange(5, dtype=np.int64), np.array(3.5), np.zeros((0, 3)),
             np.ones((2, 3, 4), np.float16), np.array([True, False]), np.array([1, 2], dtype=">i4"), np.array([1.5 + 2j], np.complex64)]  # fmt: skip
    for a in cases:
        fast, flower = _array(a), Array(a)
        assert (fast.dtype, fast.shape, fast.stype, fast.data) == (flower.dtype, flower.shape, flower.stype, flower.data)
        back = _ndarray(flower)
        assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a) and back.flags.writeable
    fortran = np.asfortranarray(np.random.rand(3, 4))
    assert np.array_equal(_ndarray(Array(fortran)), fortran)
    a = Array(np.random.rand(3, 4))
    assert _ndarray(Array(dtype=a.dtype, shape=(4, 3), stype=a.stype, data=a.data)).shape == (3, 4)  # the header's, as np.load


def test_a_declared_shape_the_bytes_do_not_hold_is_refused_without_allocating_it():
    """A hostile record declares a huge, negative or overflowing shape over a few bytes: the
    conversion fails as Flower's does (ValueError), never by building an array of that shape."""
    from flwr.app import Array, ArrayRecord

    for shape in [(10**6, 10**6), (-1,), (2**40, 2**40), (3,)]:
        array = Array(dtype="float32", shape=shape, stype="numpy.ndarray", data=b"\x93NUMPY" + b"0" * 100)
        with pytest.raises(ValueError):
            from_record(ArrayRecord({"w": array}))
