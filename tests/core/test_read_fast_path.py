"""codec.tensor_at, the Trial's one-pass value path: it gives what read_record + decode_tensor_value give,
or None (then they run and say what is wrong); never a value for a record they reject."""

import numpy as np
import pytest

from smdebug import codec, layout
from smdebug.exceptions import CorruptRunError, SMDebugTypeError
from smdebug.store import Store
from smdebug.trials import create_trial

ARRAYS = [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.float64(2.5).reshape(()),
    np.arange(300, dtype=np.int64).reshape(3, 10, 10),  # lengths that take two-byte varints
    np.zeros((0, 4), np.float16),
    np.array([True, False]),
    np.array(["a", "bc"]),  # strings: not the dense form, left to the full decoder
]


def _slow(buf, pos, length, crc=None):
    try:
        return codec.decode_tensor_value(codec.read_record(buf[pos : pos + length], crc=crc))
    except (CorruptRunError, SMDebugTypeError) as exc:
        return exc


def _file(arrays, step=7, checksum=False, tags=None):
    records = []
    for i, array in enumerate(arrays):
        tag = tags[i] if tags else f"t{i}"
        records.append(codec.frame(codec.encode_tensor_event(tag, array, step, 1.5, 4, step), checksum))
    offsets = np.cumsum([0] + [len(r) for r in records])
    return b"".join(records), [(int(o), len(r)) for o, r in zip(offsets, records)]


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("key", [None, "k"])
def test_same_values_as_the_full_decoder(checksum, key):
    data, spans = _file(ARRAYS, checksum=checksum)
    for _ in range(2):  # the second pass goes through the remembered layouts
        for (pos, length), array in zip(spans, ARRAYS):
            fast = codec.tensor_at(data, pos, length, None, key and f"{key}{pos}")
            slow = _slow(data, pos, length)
            assert np.array_equal(slow.reshape(-1), array.reshape(-1))  # a 0-d array is written as (1,)
            if fast is not None:
                assert fast.dtype == slow.dtype and fast.shape == slow.shape and np.array_equal(fast, slow)
                assert fast.flags.writeable and fast.flags.owndata
    assert codec.tensor_at(data, *spans[0]) is not None  # the dense form is the fast path's
    assert codec.tensor_at(data, *spans[-1]) is None  # strings are not


def _damaged(data, spans):
    pos, length = spans[0]
    flip = lambda at: data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]  # noqa: E731
    yield "payload bit, real footer", flip(pos + 40), pos, length, None
    yield "length field", flip(pos + 1), pos, length, None
    yield "length CRC", flip(pos + 9), pos, length, None
    yield "footer", flip(pos + length - 2), pos, length, None
    yield "truncated file", data[: pos + length - 1], pos, length, None
    yield "slice too long", data, pos, length + 1, None
    yield "slice too short", data, pos, length - 1, None
    yield "index CRC", data, pos, length, 12345


@pytest.mark.parametrize("key", [None, "d"])
def test_a_damaged_record_is_never_decoded(key):
    data, spans = _file(ARRAYS[:2], checksum=True)
    for what, buf, pos, length, crc in _damaged(data, spans):
        assert codec.tensor_at(data, *spans[0], None, key) is not None  # its good layout remembered
        assert isinstance(_slow(buf, pos, length, crc), CorruptRunError), what
        assert codec.tensor_at(buf, pos, length, crc, key) is None, what


def test_a_checked_payload_with_smdebugs_no_checksum_footer():
    data, spans = _file(ARRAYS[:1], checksum=False)
    pos, length = spans[0]
    crc = codec.masked_crc32c(data[pos + 12 : pos + length - 4])
    assert np.array_equal(codec.tensor_at(data, pos, length, crc), ARRAYS[0])
    assert codec.tensor_at(data, pos, length, crc ^ 1) is None


def test_one_key_across_layouts_that_change():
    """Records read under one key whose shape, dtype, tag or step width change: each gives its own value."""
    arrays = [
        np.ones((2, 3), np.float32),
        np.ones((3, 2), np.float32),
        np.ones((2, 3), np.float64),
        np.arange(6, dtype=np.float32).reshape(2, 3),
    ]
    for step in (9, 10, 200, 70000):
        data, spans = _file(arrays, step=step, tags=["a", "a", "a", "bb"])
        for (pos, length), array in zip(spans, arrays):
            value = codec.tensor_at(data, pos, length, None, "same")
            assert value.dtype == array.dtype and np.array_equal(value, array)


def test_trial_reports_a_damaged_record_and_reads_the_others(tmp_path):
    store = Store(str(tmp_path))
    for step in range(3):
        data, spans = _file([np.full((4,), step, np.float32)], step=step, checksum=True, tags=["w"])
        if step == 1:
            data = data[:30] + bytes([data[30] ^ 1]) + data[31:]
        store.write_bytes(layout.event_file_path(step, "w0"), data)
        entry = layout.tensor_entry("w", 0, spans[0][1])
        index = layout.encode_index("GLOBAL", step, layout.event_file_path(step, "w0"), [entry], [])
        store.write_bytes(layout.index_file_path(step, "w0"), index)
    store.write_bytes(layout.END_OF_JOB_FILE, b"")
    tensor = create_trial(str(tmp_path)).tensor("w")
    assert sorted(tensor.values()) == [0, 2]
    assert tensor.value(2).tolist() == [2.0] * 4
    with pytest.raises(Exception, match="checksum"):
        tensor.value(1)
