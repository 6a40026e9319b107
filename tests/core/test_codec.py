"""Event-file codec: round trips, TFRecord framing, and bytes identical to smdebug 1.0.34's.

The GOLDEN_* constants were produced by smdebug 1.0.34 itself (protobuf 3.20.3, python runtime):
FileWriter._get_metadata + make_tensor_proto + Event(summary=...) for tensors, FileWriter.write_tensor
for whole records, scalar_summary / histogram_summary for TensorBoard events.
"""

import hashlib
import re
import struct

import numpy as np
import pytest

from smdebug import codec
from smdebug.exceptions import CorruptRunError
from smdebug.modes import ModeKeys

TRAIN, EVAL, PREDICT, GLOBAL = 1, 2, 3, 4

# name: (tag, array, step, wall_time, mode, mode_step, serialized Event)
GOLDEN_TENSORS = {
    "float32_2x3": (
        "layer1/weight",
        np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
        3,
        1700000000.25,
        TRAIN,
        3,
        "0900001040fc54d94110032a780a760a0d6c61796572312f77656967687442480801122a12130802120f6c61796572312f"
        "7765696768745f3212130803120f6c61796572312f7765696768745f332218000020c00000c0bf000000bf0000003f0000"
        "c03f000020404a1b0a0e0a096d6f64655f737465701201330a090a046d6f6465120131",
    ),
    "int64_shape1": (
        "loss",
        np.array([42], dtype=np.int64),
        5,
        1234.5,
        GLOBAL,
        5,
        "0900000000004a934010052a410a3f0a046c6f7373421a0809120c120a080112066c6f73735f3122082a000000000000004a"
        "1b0a0e0a096d6f64655f737465701201350a090a046d6f6465120134",
    ),
    "float16": (
        "h",
        np.array([1.5, -2.0, 65504.0], dtype=np.float16),
        1,
        10.0,
        TRAIN,
        1,
        "09000000000000244010012a390a370a0168421508131209120708031203685f332206003e00c0ff7b4a1b0a0e0a096d6f64"
        "655f737465701201310a090a046d6f6465120131",
    ),
    "bool_2x2": (
        "mask",
        np.array([[True, False], [False, True]]),
        2,
        20.0,
        PREDICT,
        0,
        "09000000000000344010022a490a470a046d61736b4222080a1218120a080212066d61736b5f32120a080212066d61736b5f"
        "322204010000014a1b0a0e0a096d6f64655f737465701201300a090a046d6f6465120133",
    ),
    "strings": (
        "names",
        np.array(["a", "h\u00e9llo", ""]),
        4,
        30.0,
        GLOBAL,
        4,
        "090000000000003e4010042a440a420a056e616d6573421c120d120b080312076e616d65735f33420161420668c3a96c6c6f"
        "42004a1b0a0e0a096d6f64655f737465701201340a090a046d6f6465120134",
    ),
    "eval_mode_step_7": (
        "acc",
        np.array([0.75], dtype=np.float32),
        12,
        40.5,
        EVAL,
        7,
        "090000000000404440100c2a3b0a390a0361636342150801120b1209080112056163635f3122040000403f4a1b0a0e0a096d"
        "6f64655f737465701201370a090a046d6f6465120132",
    ),
    "step0_wall_time0": (
        "zero",
        np.array([0.0], dtype=np.float64),
        0,
        0.0,
        TRAIN,
        0,
        "2a410a3f0a047a65726f421a0802120c120a080112067a65726f5f31220800000000000000004a1b0a0e0a096d6f64655f73"
        "7465701201300a090a046d6f6465120131",
    ),
    "float64_0d": (
        "s",
        np.array(-1.0, dtype=np.float64),
        7,
        50.0,
        GLOBAL,
        7,
        "09000000000000494010072a320a300a0173420e080212002208000000000000f0bf4a1b0a0e0a096d6f64655f7374657012"
        "01370a090a046d6f6465120134",
    ),
    "empty_0x3": (
        "e",
        np.zeros((0, 3), dtype=np.float32),
        8,
        60.0,
        GLOBAL,
        8,
        "090000000000004e4010082a380a360a016542140801121012051203655f30120708031203655f334a1b0a0e0a096d6f6465"
        "5f737465701201380a090a046d6f6465120134",
    ),
    "complex64": (
        "c",
        np.array([1 + 2j, -3.5j], dtype=np.complex64),
        9,
        70.0,
        GLOBAL,
        9,
        "09000000000080514010092a430a410a0163421f08081209120708021203635f3222100000803f0000004000000080000060"
        "c04a1b0a0e0a096d6f64655f737465701201390a090a046d6f6465120134",
    ),
    "int8": (
        "i8",
        np.array([-128, -1, 0, 127], dtype=np.int8),
        300,
        80.0,
        TRAIN,
        299,
        "09000000000000544010ac022a3b0a390a02693842140806120a12080804120469385f34220480ff007f4a1d0a100a096d6f"
        "64655f7374657012033239390a090a046d6f6465120131",
    ),
    "uint64_big_step": (
        "u64",
        np.array([2**64 - 1, 0], dtype=np.uint64),
        2**40,
        1e9 + 0.125,
        TRAIN,
        2**40,
        "090000100065cdcd41108080808080202a530a510a0375363442210817120b1209080212057536345f322210ffffffffffff"
        "ffff00000000000000004a270a1a0a096d6f64655f73746570120d313039393531313632373737360a090a046d6f64651201"
        "31",
    ),
}

# FileWriter(write_checksum=True) record of "float32_2x3": the frame around it, and the footer that
# smdebug writes by default (write_checksum=False): masked crc32c of b"0x12345678".
GOLDEN_HEADER = "8500000000000000e98acc59"
GOLDEN_FOOTER = "7086c55f"
SMDEBUG_NO_CHECKSUM_FOOTER = "b3c02d06"

# Four tensors written by smdebug 1.0.34's FileWriter (mode EVAL, mode_step 1, step 3) with its default
# "no checksum" footers; its index file put them at offsets 0, 108, 198, 279.
SMDEBUG_FILE = bytes.fromhex(
    "5c00000000000000c9cdf98f092c58d681e4c0da4110032a4f0a4d0a027430422a0801121412080802120474305f32120808"
    "02120474305f3222100000803f0000803f0000803f0000803f4a1b0a0e0a096d6f64655f737465701201310a090a046d6f64"
    "65120132b3c02d064a00000000000000af77dbb0092e5bd681e4c0da4110032a3d0a3b0a02743142180809120a1208080112"
    "0474315f31220805000000000000004a1b0a0e0a096d6f64655f737465701201310a090a046d6f6465120132b3c02d064100"
    "00000000000000a9c2ab09575dd681e4c0da4110032a340a320a027432420f120a12080801120474325f314201714a1b0a0e"
    "0a096d6f64655f737465701201310a090a046d6f6465120132b3c02d06440000000000000043592e9a09ef5ed681e4c0da41"
    "10032a370a350a02743342120806120a12080802120474335f32220201024a1b0a0e0a096d6f64655f737465701201310a09"
    "0a046d6f6465120132b3c02d06"
)

GOLDEN_SCALAR = (
    "090000000000e0584010032a130a110a0a747261696e2f6c6f7373150000003e"  # "train/loss", 0.125, 3, 99.5
)
GOLDEN_SCALAR_ZERO = "090000000000e058402a0c0a0a0a03615f621500000000"  # "/a b", 0.0, 0, 99.5
GOLDEN_SCALAR_ROUNDED = "09000000000000f03f10012a0a0a080a017815cdcccc3d"  # "x", 0.1, 1, 1.0
# "w/hist", float32 [0.5, 1, 1.5, 2, 2], step 4, wall_time 5.0, default bins
GOLDEN_HISTOGRAM = (
    "09000000000000144010042ad1020ace020a06772f686973742ac30209000000000000e03f11000000000000004019000000"
    "0000001440210000000000001c40290000000000002740328801fae55a25d31fde3fb03125ee8091e03f0f1d5c6ca739e23f"
    "2b53652a380ce43f16756ffb700de63f3267c747fc41e83f1e8b8ee8fbaeea3f08996919155aed3f2b14facdbe24f03f6349"
    "c61505c2f13fba508d319f88f33f333fe81caf7cf53f8545cc9fc0a2f73f794cfae2d3fff93f538746136999fc3fdc94cd2e"
    "8d75ff3fe011f10c744d01403a88010000000000000000000000000000f03f00000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000f03f00000000000000000000000000"
    "00000000000000000000000000000000000000000000000000f03f0000000000000000000000000000000000000000000000"
    "40"
)
# "w", [-3, 0, 0, 1e-3, 7], step 4, wall_time 5.0, default bins: 9930 bytes
GOLDEN_HISTOGRAM_WIDE_SHA256 = "7603e52e88dd317572ec9f44bfc7e8600aeb4d009e663de68d04a462a648896a"
# "w", int32 arange(10), step 4, wall_time 5.0, bins=4 (min 0 is omitted)
GOLDEN_HISTOGRAM_INT_BINS = (
    "09000000000000144010042a7f0a7d0a01772a78110000000000002240190000000000002440210000000000804640290000"
    "000000d0714032280000000000000000000000000000024000000000000012400000000000001b4000000000000022403a28"
    "00000000000000000000000000000840000000000000004000000000000000400000000000000840"
)
GOLDEN_FILE_VERSION = "09000000000000f83f1a0d627261696e2e4576656e743a32"  # wall_time 1.5

NUMERIC_DTYPES = [
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
]


def _round_trip(array, tag="t", step=1, wall_time=2.5, mode=TRAIN, mode_step=1):
    payload = codec.encode_tensor_event(tag, array, step, wall_time, mode, mode_step)
    event = codec.decode_event(payload)
    assert (event.step, event.wall_time) == (step, wall_time)
    (value,) = event.values
    assert (value.tag, value.mode, value.mode_step, value.simple_value) == (tag, mode, mode_step, None)
    return value.value


def _sample(dtype, shape, rng):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return (rng.standard_normal(shape) * 100).astype(dtype)


# --------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 4), (2, 1, 3), (0,), (4, 0, 2)])
def test_every_dtype_and_shape_round_trips(dtype, shape):
    array = np.asarray(_sample(dtype, shape, np.random.default_rng(len(shape))))  # () gives a numpy scalar
    assert array.shape == shape
    out = _round_trip(array)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == shape
    np.testing.assert_array_equal(out, array)
    assert out.flags.writeable and out.flags.c_contiguous


def test_extreme_values_survive():
    for dtype in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]:
        info = np.iinfo(dtype)
        array = np.array([info.min, info.max, 0], dtype=dtype)
        np.testing.assert_array_equal(_round_trip(array), array)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324], dtype=np.float64)
    out = _round_trip(special)
    assert np.array_equal(out, special, equal_nan=True)
    assert np.signbit(out[3])


def test_large_array_round_trips():
    array = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
    payload = codec.encode_tensor_event("big", array, 10, 3.0, GLOBAL, 10)
    assert len(payload) > array.nbytes
    (record,) = [p for _, p in codec.iter_records(codec.frame(payload))]
    out = codec.decode_event(record).values[0].value
    assert out.dtype == np.float32 and out.shape == array.shape
    np.testing.assert_array_equal(out, array)


def test_non_contiguous_and_big_endian_inputs_encode_as_their_values():
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    for view in [base[:, ::2], base.T, base[::-1, 1:4]]:
        assert not view.flags.c_contiguous
        np.testing.assert_array_equal(_round_trip(view), view)
        assert codec.encode_tensor_event("t", view, 1, 1.0, 1, 1) == codec.encode_tensor_event(
            "t", np.ascontiguousarray(view), 1, 1.0, 1, 1
        )
    big = np.array([1.5, -2.0], dtype=">f4")
    assert codec.encode_tensor_event("t", big, 1, 1.0, 1, 1) == codec.encode_tensor_event(
        "t", big.astype("<f4"), 1, 1.0, 1, 1
    )


@pytest.mark.parametrize(
    "array",
    [
        np.array(["a", "h\u00e9llo", "", "\U0001f600"]),
        np.array([["ab", "c"], ["d", "ef"]]),
        np.array("alone"),
        np.array([], dtype=str),
        np.array(["x", "yz"], dtype=object),
        np.array([b"raw", b"bytes"]),
    ],
)
def test_string_arrays_round_trip_as_str(array):
    out = _round_trip(array)
    assert out.dtype.kind == "U"
    assert out.shape == array.shape
    expected = [s.decode() if isinstance(s, bytes) else s for s in array.reshape(-1).tolist()]
    assert out.reshape(-1).tolist() == expected


def test_python_scalar_is_written_with_shape_1_like_smdebug():
    assert _round_trip(3.5).shape == (1,)
    assert _round_trip(np.float32(2.0)).dtype == np.float32


def test_mode_accepts_mode_keys():
    event = codec.decode_event(codec.encode_tensor_event("t", np.ones(2), 4, 1.0, ModeKeys.PREDICT, 2))
    assert (event.values[0].mode, event.values[0].mode_step) == (PREDICT, 2)


@pytest.mark.parametrize(
    "array", [np.array(["2020-01-01"], dtype="datetime64[D]"), np.zeros(2, dtype=[("a", "<f4")])]
)
def test_unsupported_dtypes_raise_type_error_naming_them(array):
    with pytest.raises(TypeError, match=re.escape(str(array.dtype))):
        codec.encode_tensor_event("t", array, 1, 1.0, 1, 1)


def test_object_array_of_non_strings_is_rejected():
    with pytest.raises(TypeError, match="int"):
        codec.encode_tensor_event("t", np.array([1, "a"], dtype=object), 1, 1.0, 1, 1)


# --------------------------------------------------------------------------------------------- golden bytes


@pytest.mark.parametrize("name", sorted(GOLDEN_TENSORS))
def test_tensor_event_bytes_match_smdebug(name):
    tag, array, step, wall_time, mode, mode_step, expected = GOLDEN_TENSORS[name]
    payload = codec.encode_tensor_event(tag, array, step, wall_time, mode, mode_step)
    assert payload.hex() == expected
    # ... and smdebug's events decode back to the same tensor.
    (value,) = codec.decode_event(bytes.fromhex(expected)).values
    assert (value.tag, value.mode, value.mode_step) == (tag, mode, mode_step)
    assert value.value.shape == array.shape
    assert value.value.dtype == array.dtype or array.dtype.kind == "U"
    np.testing.assert_array_equal(value.value, array)


def test_framed_record_matches_smdebug_with_checksums():
    payload = bytes.fromhex(GOLDEN_TENSORS["float32_2x3"][-1])
    assert codec.frame(payload).hex() == GOLDEN_HEADER + payload.hex() + GOLDEN_FOOTER


def test_smdebug_no_checksum_footer_is_accepted():
    payload = bytes.fromhex(GOLDEN_TENSORS["float32_2x3"][-1])
    record = bytes.fromhex(GOLDEN_HEADER + payload.hex() + SMDEBUG_NO_CHECKSUM_FOOTER)
    assert list(codec.iter_records(record)) == [(0, payload)]
    assert codec.read_record(record) == payload


def test_reads_a_file_written_by_smdebug_and_its_index_slices():
    records = list(codec.iter_records(SMDEBUG_FILE, "x.tfevents"))
    assert [offset for offset, _ in records] == [0, 108, 198, 279]
    events = [codec.decode_event(p) for _, p in records]
    assert [(e.step, e.values[0].tag, e.values[0].mode, e.values[0].mode_step) for e in events] == [
        (3, f"t{i}", EVAL, 1) for i in range(4)
    ]
    values = [e.values[0].value for e in events]
    np.testing.assert_array_equal(values[0], np.ones((2, 2), np.float32))
    assert values[1].dtype == np.int64 and values[1].tolist() == [5]
    assert values[2].tolist() == ["q"]
    assert values[3].dtype == np.int8 and values[3].tolist() == [1, 2]
    start, length = 198, 81
    assert codec.read_record(SMDEBUG_FILE[start : start + length], "x", start) == records[2][1]


def test_scalar_events_match_smdebug():
    assert codec.encode_scalar_event("train/loss", 0.125, 3, 99.5).hex() == GOLDEN_SCALAR
    # A 0.0 scalar is still written (simple_value is a oneof member); the tag is cleaned.
    assert codec.encode_scalar_event("/a b", 0.0, 0, 99.5).hex() == GOLDEN_SCALAR_ZERO
    assert codec.encode_scalar_event("x", np.float64(0.1), 1, 1.0).hex() == GOLDEN_SCALAR_ROUNDED
    event = codec.decode_event(bytes.fromhex(GOLDEN_SCALAR))
    assert (event.step, event.values[0].tag, event.values[0].simple_value) == (3, "train/loss", 0.125)
    assert event.values[0].value is None


def test_scalar_event_rejects_arrays():
    with pytest.raises(ValueError):
        codec.encode_scalar_event("x", np.ones(2), 1, 1.0)


def test_histogram_events_match_smdebug():
    values = np.array([0.5, 1.0, 1.5, 2.0, 2.0], dtype=np.float32)
    assert codec.encode_histogram_event("w/hist", values, 4, 5.0).hex() == GOLDEN_HISTOGRAM
    wide = codec.encode_histogram_event("w", np.array([-3.0, 0.0, 0.0, 1e-3, 7.0]), 4, 5.0)
    assert len(wide) == 9930
    assert hashlib.sha256(wide).hexdigest() == GOLDEN_HISTOGRAM_WIDE_SHA256
    ints = codec.encode_histogram_event("w", np.arange(10, dtype=np.int32), 4, 5.0, bins=4)
    assert ints.hex() == GOLDEN_HISTOGRAM_INT_BINS


def test_histogram_of_nothing_raises_value_error():
    with pytest.raises(ValueError):
        codec.encode_histogram_event("w", np.array([]), 1, 1.0)


def test_file_version_event():
    assert codec.encode_file_version_event(1.5).hex() == GOLDEN_FILE_VERSION
    event = codec.decode_event(bytes.fromhex(GOLDEN_FILE_VERSION))
    assert (event.file_version, event.wall_time, event.values) == ("brain.Event:2", 1.5, [])


# --------------------------------------------------------------------------------------------- framing


def _records(n=4):
    payloads = [codec.encode_tensor_event(f"t{i}", np.arange(i + 1.0), i, 1.0, TRAIN, i) for i in range(n)]
    return payloads, b"".join(codec.frame(p) for p in payloads)


def test_iter_records_yields_offsets_and_payloads():
    payloads, data = _records()
    offsets, offset = [], 0
    for p in payloads:
        offsets.append(offset)
        offset += 16 + len(p)
    assert list(codec.iter_records(data)) == list(zip(offsets, payloads))
    for start, p in zip(offsets, payloads):
        assert codec.read_record(data[start : start + 16 + len(p)], "f", start) == p
    assert list(codec.iter_records(b"")) == []


def test_flipped_payload_bit_is_reported_with_path_and_offset():
    payloads, data = _records()
    second = 16 + len(payloads[0])
    damaged = bytearray(data)
    damaged[second + 12 + 5] ^= 0x04
    with pytest.raises(CorruptRunError, match=rf"^events/a\.tfevents: record at offset {second} .*checksum"):
        list(codec.iter_records(bytes(damaged), "events/a.tfevents"))
    with pytest.raises(CorruptRunError, match=f"offset {second} "):
        codec.read_record(bytes(damaged[second : second + 16 + len(payloads[1])]), "a", second)


def test_truncation_is_detected():
    payloads, data = _records(2)
    second = 16 + len(payloads[0])
    for cut in [len(data) - 1, second + 5, second + 12 + 3]:
        with pytest.raises(CorruptRunError, match=f"f: record at offset {second} is truncated"):
            list(codec.iter_records(data[:cut], "f"))
    with pytest.raises(CorruptRunError, match="truncated"):
        codec.read_record(data[: second - 1])


def test_corrupt_length_field_is_detected():
    _, data = _records(2)
    damaged = bytearray(data)
    damaged[0] ^= 0x01
    with pytest.raises(CorruptRunError, match="offset 0 has a corrupt length"):
        list(codec.iter_records(bytes(damaged), "f"))


def test_read_record_rejects_a_slice_longer_than_the_record():
    payloads, data = _records(2)
    with pytest.raises(CorruptRunError, match="offset 7 is"):
        codec.read_record(data[: 16 + len(payloads[0]) + 3], "f", 7)


def test_on_error_skips_a_bad_payload_and_goes_on():
    payloads, data = _records(4)
    offsets = [sum(16 + len(p) for p in payloads[:i]) for i in range(4)]
    damaged = bytearray(data)
    damaged[offsets[1] + 20] ^= 0xFF
    errors = []
    got = list(codec.iter_records(bytes(damaged), "f", on_error=errors.append))
    assert got == [(offsets[i], payloads[i]) for i in (0, 2, 3)]
    assert len(errors) == 1 and isinstance(errors[0], CorruptRunError)
    assert f"offset {offsets[1]}" in str(errors[0])


def test_on_error_stops_when_the_length_is_corrupt_or_the_file_truncated():
    payloads, data = _records(3)
    offsets = [sum(16 + len(p) for p in payloads[:i]) for i in range(3)]
    damaged = bytearray(data)
    damaged[offsets[1] + 2] ^= 0x10  # length field of the second record
    errors = []
    assert list(codec.iter_records(bytes(damaged), on_error=errors.append)) == [(0, payloads[0])]
    assert "corrupt length" in str(errors[0])
    errors.clear()
    assert [o for o, _ in codec.iter_records(data[:-2], on_error=errors.append)] == offsets[:2]
    assert len(errors) == 1 and "truncated" in str(errors[0])


# --------------------------------------------------------------------------------------------- decoding


def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(num, wire_type, value):
    """One protobuf field: value is an int (wire type 0) or the raw bytes."""
    if wire_type == 0:
        return _varint(num << 3) + _varint(value)
    if wire_type == 2:
        return _varint(num << 3 | 2) + _varint(len(value)) + value
    return _varint(num << 3 | wire_type) + value


JUNK = (
    _field(1000, 0, 12345)
    + _field(1001, 1, b"\x01" * 8)
    + _field(1002, 2, b"\x08\x01unknown")
    + _field(1003, 5, b"\x02" * 4)
)


def test_unknown_fields_are_skipped_at_every_level():
    dim = _field(1, 0, 3) + JUNK + _field(2, 2, b"t_3")
    shape = JUNK + _field(2, 2, dim) + _field(3, 0, 0)
    tensor = (
        _field(1, 0, 1)
        + _field(3, 0, 7)  # version_number
        + _field(2, 2, shape)
        + JUNK
        + _field(4, 2, np.array([1, 2, 3], "<f4").tobytes())
    )
    plugin = _field(1, 2, b"mode_step") + JUNK + _field(2, 2, b"9")
    metadata = _field(1, 2, plugin) + JUNK + _field(1, 2, _field(1, 2, b"mode") + _field(2, 2, b"2"))
    value = _field(7, 2, b"node") + _field(1, 2, b"t") + _field(8, 2, tensor) + JUNK + _field(9, 2, metadata)
    summary = JUNK + _field(1, 2, value)
    event = JUNK + _field(1, 1, struct.pack("<d", 7.5)) + _field(2, 0, 11) + _field(5, 2, summary) + JUNK
    decoded = codec.decode_event(event)
    assert (decoded.wall_time, decoded.step) == (7.5, 11)
    (v,) = decoded.values
    assert (v.tag, v.mode, v.mode_step) == ("t", EVAL, 9)
    np.testing.assert_array_equal(v.value, np.array([1, 2, 3], np.float32))
    # Our own event with junk appended still decodes.
    payload = codec.encode_tensor_event("x", np.arange(3), 2, 1.0, TRAIN, 2) + JUNK
    np.testing.assert_array_equal(codec.decode_event(payload).values[0].value, np.arange(3))


def test_missing_mode_defaults_to_global_and_no_mode_step():
    tensor = _field(1, 0, 9) + _field(2, 2, b"") + _field(4, 2, struct.pack("<q", -4))
    event = _field(2, 0, 5) + _field(5, 2, _field(1, 2, _field(1, 2, b"t") + _field(8, 2, tensor)))
    (v,) = codec.decode_event(event).values
    assert (v.mode, v.mode_step, v.value.shape, v.value.tolist()) == (GLOBAL, None, (), -4)


def _tensor_event(tensor):
    return _field(5, 2, _field(1, 2, _field(1, 2, b"t") + _field(8, 2, tensor)))


def _shape(*dims):
    return _field(2, 2, b"".join(_field(2, 2, _field(1, 0, d)) for d in dims))


@pytest.mark.parametrize(
    "tensor, expected",
    [
        # packed float_val
        (_field(1, 0, 1) + _shape(2) + _field(5, 2, struct.pack("<2f", 1.5, -2)), np.array([1.5, -2], "f4")),
        # unpacked double_val
        (
            _field(1, 0, 2)
            + _shape(2)
            + _field(6, 1, struct.pack("<d", 3))
            + _field(6, 1, struct.pack("<d", 4)),
            np.array([3.0, 4.0]),
        ),
        # int_val negative numbers are sign-extended varints, packed or not
        (
            _field(1, 0, 3) + _shape(3) + _field(7, 0, -5) + _field(7, 2, _varint(6) + _varint(-7)),
            np.array([-5, 6, -7], "i4"),
        ),
        (
            _field(1, 0, 6) + _shape(2) + _field(7, 2, _varint(-128) + _varint(127)),
            np.array([-128, 127], "i1"),
        ),
        (_field(1, 0, 4) + _shape(1) + _field(7, 0, 255), np.array([255], "u1")),
        (
            _field(1, 0, 9) + _shape(2) + _field(10, 2, _varint(-(2**63)) + _varint(2**40)),
            np.array([-(2**63), 2**40], "i8"),
        ),
        (_field(1, 0, 10) + _shape(3) + _field(11, 2, b"\x01\x00\x01"), np.array([True, False, True])),
        (
            _field(1, 0, 19) + _shape(2) + _field(13, 2, _varint(0x3E00) + _varint(0xC000)),
            np.array([1.5, -2.0], "f2"),
        ),
        (_field(1, 0, 22) + _shape(1) + _field(16, 0, 2**32 - 1), np.array([2**32 - 1], "u4")),
        (_field(1, 0, 23) + _shape(1) + _field(17, 2, _varint(2**64 - 1)), np.array([2**64 - 1], "u8")),
        (_field(1, 0, 8) + _shape(1) + _field(9, 2, struct.pack("<2f", 1, 2)), np.array([1 + 2j], "c8")),
        (_field(1, 0, 18) + _shape(1) + _field(12, 2, struct.pack("<2d", 3, -4)), np.array([3 - 4j])),
        # TensorFlow's splat: a single value fills the shape; missing values repeat the last one
        (_field(1, 0, 1) + _shape(2, 2) + _field(5, 2, struct.pack("<f", 7)), np.full((2, 2), 7, "f4")),
        (_field(1, 0, 3) + _shape(4) + _field(7, 2, _varint(1) + _varint(2)), np.array([1, 2, 2, 2], "i4")),
        (_field(1, 0, 2) + _shape(2), np.zeros(2)),
        # DT_STRING as TensorFlow writes it
        (
            _field(1, 0, 7) + _shape(2) + _field(8, 2, b"ab") + _field(8, 2, "\u00e9".encode()),
            np.array(["ab", "\u00e9"]),
        ),
    ],
)
def test_typed_value_fields_decode(tensor, expected):
    out = codec.decode_event(_tensor_event(tensor)).values[0].value
    assert out.dtype == expected.dtype and out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a",  # key without a value
        b"\x2a\x05\x0a\x03",  # length runs past the end
        b"\x0b\x00",  # group wire type
        bytes.fromhex(GOLDEN_TENSORS["float32_2x3"][-1])[:-30],
        _tensor_event(_field(1, 0, 1) + _shape(3) + _field(4, 2, b"\x00" * 8)),  # content/shape mismatch
        _tensor_event(_field(1, 0, 1) + _shape(1) + _field(4, 2, b"\x00" * 3)),  # partial element
    ],
)
def test_malformed_events_raise_corrupt_run_error(payload):
    with pytest.raises(CorruptRunError):
        codec.decode_event(payload)


def test_unsupported_tensor_dtype_on_read_raises_type_error():
    with pytest.raises(TypeError, match="14"):
        codec.decode_event(_tensor_event(_field(1, 0, 14) + _shape(1) + _field(4, 2, b"\x00\x00")))


@pytest.mark.parametrize("mode_step", [0, 7, 300])
def test_a_steps_reductions_framed_together_equal_one_by_one(mode_step):
    names = [["gradient/a_max", "gradient/a_mean"], ["w/b_l2"], ["x_min", "x_max", "x_sum"]]
    values = [
        np.array([1.5, -0.0], dtype=np.float32),
        np.array([3.25]),
        np.array([-2, 7, 0], dtype=np.int64),
    ]
    data, records = codec.scalar_records(names, values, 12, 1700000000.25, ModeKeys.EVAL, mode_step)
    expected, offset = b"", 0
    for some, array in zip(names, values):
        for name, value in zip(some, array):
            event = codec.tensor_event_chunks(name, np.asarray(value), 12, 1700000000.25, 2, mode_step)
            chunks, size, crc = codec.frame_chunks(event, checksum=False)
            expected += b"".join(chunks)
            assert records.pop(0) == (name, offset, size, crc)
            offset += size
    assert data == expected and not records


def test_steps_of_the_same_reductions_encode_as_scalar_records():
    """step_scalar_records reuses the last step's records: the bytes and entries stay scalar_records'
    through steps whose step, mode step and wall time change their fields' sizes, and other name lists."""
    names = [[f"smdebug/reductions/{r}/w{i}" for r in ("mean", "max", "l2")] for i in range(5)]
    names[2] = ['odd "name" \u00e9', "x", "y"]
    other = [list(names[0]), *names[1:]]  # equal names, another list: encoded again, the same bytes
    templates = codec.Templates(1 << 20)
    rng = np.random.default_rng(0)
    steps = [(1, 1, 1.5), (2, 2, 1.5), (0, 0, 0.0), (127, 9, 2.0), (128, 10, 2.0), (5000, 4000, 3.0)]
    for step, mode_step, wall_time in steps:
        for which, values in [
            (names, rng.random((5, 3), dtype=np.float32)),
            (names, [rng.random(3) for _ in range(5)]),
            (other, rng.random((5, 3), dtype=np.float32)),
            (names, [np.arange(3), np.arange(3.0), np.arange(3), np.arange(3), np.arange(3)]),
        ]:
            expected = codec.scalar_records(which, values, step, wall_time, ModeKeys.EVAL, mode_step)
            for _ in range(2):
                got = codec.step_scalar_records(
                    which, values, step, wall_time, ModeKeys.EVAL, mode_step, templates
                )
                assert got == expected
    assert templates.layout is not None and templates.held <= templates.budget


def test_a_steps_records_larger_than_half_the_budget_are_not_kept():
    names = [[f"smdebug/reductions/max/w{i}"] for i in range(50)]
    templates = codec.Templates(4096)
    codec.step_scalar_records(names, np.ones((50, 1), np.float32), 1, 1.0, 1, 1, templates)
    assert templates.layout is None and templates.held <= templates.budget
