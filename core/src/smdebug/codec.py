"""Reader and writer for smdebug 1.0's event files, without protobuf.

An event file is a sequence of TFRecords, each holding one serialized ``Event`` protobuf message
(TensorFlow's event.proto, summary.proto, tensor.proto, with the field numbers smdebug 1.0 uses).
Encoding follows the python protobuf runtime (proto3: fields in number order, scalars at their
default value omitted, members of a oneof always written), so events are byte-identical to the ones
smdebug 1.0.34 writes for the same inputs.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Optional

import crc32c as _crc32c
import numpy as np

from smdebug.exceptions import CorruptRunError, SMDebugTypeError, SMDebugValueError

__all__ = [
    "Event",
    "SummaryValue",
    "frame",
    "iter_records",
    "read_record",
    "masked_crc32c",
    "encode_tensor_event",
    "encode_scalar_event",
    "encode_histogram_event",
    "encode_file_version_event",
    "decode_event",
]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_HEADER = 12  # uint64 length + uint32 masked crc of the length
_FOOTER = 4  # uint32 masked crc of the payload

# ---------------------------------------------------------------------------------------------------
# TFRecord framing


def masked_crc32c(data) -> int:
    """CRC32C rotated and offset as TFRecord stores it (a CRC over data containing CRCs stays useful)."""
    return _mask(_crc32c.crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# smdebug 1.0 writes this footer instead of the payload's CRC unless write_checksum=True (its default is
# False), and its own reader insists on it; it means "no checksum".
_NO_CHECKSUM = masked_crc32c(b"0x12345678")


def frame(payload: bytes, checksum: bool = True) -> bytes:
    """One TFRecord holding payload, with the real payload CRC in the footer (TensorBoard's form), or
    with checksum=False smdebug's "no checksum" footer: smdebug 1.0's reader rejects anything else in
    tensor event files."""
    header = _U64.pack(len(payload))
    footer = masked_crc32c(payload) if checksum else _NO_CHECKSUM
    return b"".join((header, _U32.pack(masked_crc32c(header)), payload, _U32.pack(footer)))


def _parse_record(view: memoryview, pos: int, path: str, base: int):
    """Check the record at view[pos:]: return (payload, end, error).

    error is None or a CorruptRunError; end is where the next record starts, None when the length
    field cannot be trusted (then nothing after it can be located).
    """

    if len(view) - pos < _HEADER:
        return None, None, _corrupt(path, base + pos, "is truncated")
    if _U32.unpack_from(view, pos + 8)[0] != masked_crc32c(view[pos : pos + 8]):
        return None, None, _corrupt(path, base + pos, "has a corrupt length field")
    start = pos + _HEADER
    stop = start + _U64.unpack_from(view, pos)[0]
    if stop + _FOOTER > len(view):
        return None, None, _corrupt(path, base + pos, "is truncated")
    payload = view[start:stop]
    crc = _U32.unpack_from(view, stop)[0]
    if crc != _NO_CHECKSUM and crc != masked_crc32c(payload):
        return None, stop + _FOOTER, _corrupt(path, base + pos, "fails its checksum")
    return bytes(payload), stop + _FOOTER, None


def _corrupt(path: str, offset: int, what: str) -> CorruptRunError:
    prefix = f"{path}: " if path else ""
    return CorruptRunError(f"{prefix}record at offset {offset} {what}")


def iter_records(
    data: bytes, path: str = "", on_error: Optional[Callable[[CorruptRunError], None]] = None
) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, payload) for each record of a whole file's bytes.

    A damaged record raises CorruptRunError, unless on_error is given: it then receives the error and
    iteration resumes at the next record when the damaged one's length field is intact, else stops.
    """
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        payload, end, error = _parse_record(view, pos, path, 0)
        if error is not None:
            if on_error is None:
                raise error
            on_error(error)
            if end is None:
                return
        else:
            yield pos, payload
        pos = end


def read_record(data: bytes, path: str = "", offset: int = 0, crc: Optional[int] = None) -> bytes:
    """Payload of the single record data holds (an index entry's slice, which starts at offset).

    crc is the payload's masked CRC32C when the index entry gives one: it checks records whose footer
    is smdebug's "no checksum" constant.
    """
    payload, end, error = _parse_record(memoryview(data), 0, path, offset)
    prefix = f"{path}: " if path else ""
    if error is not None:
        raise error
    if end != len(data):
        raise CorruptRunError(f"{prefix}record at offset {offset} is {end} bytes, not {len(data)}")
    if crc is not None and masked_crc32c(payload) != crc:
        raise CorruptRunError(f"{prefix}record at offset {offset} fails its checksum")
    return payload


# ---------------------------------------------------------------------------------------------------
# Protobuf wire encoding. A message is built as a list of byte chunks so that a large tensor_content is
# copied once, by the final join.

# TensorFlow DataType enum value -> numpy dtype of the little-endian bytes in tensor_content.
_DTYPES = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    8: np.dtype("<c8"),  # DT_COMPLEX64
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    17: np.dtype("<u2"),  # DT_UINT16
    18: np.dtype("<c16"),  # DT_COMPLEX128
    19: np.dtype("<f2"),  # DT_HALF
    22: np.dtype("<u4"),  # DT_UINT32
    23: np.dtype("<u8"),  # DT_UINT64
}
_DT_STRING = 7
# Keyed by (kind, itemsize) so that big-endian input maps too (it is written little-endian).
_ENUM_OF = {(dt.kind, dt.itemsize): enum for enum, dt in _DTYPES.items()}
_MODE_STEP, _MODE = b"mode_step", b"mode"  # smdebug's plugin names
_BAD_TAG_CHARS = re.compile(r"[^-/\w\.]")


_ONE_BYTE = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _ONE_BYTE[n]
    n &= 0xFFFFFFFFFFFFFFFF  # a negative int64 is written as its 10-byte two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(num: int, wire_type: int) -> bytes:
    return _varint(num << 3 | wire_type)


def _int(num: int, value: int) -> list:
    return [_key(num, 0), _varint(value)] if value else []


def _double(num: int, value: float) -> list:
    # `if value` also drops -0.0, as the python protobuf runtime does.
    return [_key(num, 1), _F64.pack(value)] if value else []


def _sub(num: int, chunks: list) -> list:
    """A length-delimited field (message or bytes) made of chunks; written even when empty."""
    return [_key(num, 2), _varint(sum(len(c) for c in chunks)), *chunks]


def _text(num: int, text) -> list:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return _sub(num, [data]) if data else []


def _event(wall_time: float, step: int, what: list) -> bytes:
    return b"".join(_double(1, float(wall_time)) + _int(2, int(step)) + what)


def dtype_enum(array: np.ndarray) -> int:
    """The TensorFlow DataType of a numeric array; SMDebugTypeError when event files have none for it."""
    enum = _ENUM_OF.get((array.dtype.kind, array.dtype.itemsize))
    if enum is None or array.dtype.fields is not None:
        raise SMDebugTypeError(f"Numpy dtype {array.dtype} is not supported in event files")
    return enum


def _not_a_string(element) -> SMDebugTypeError:
    return SMDebugTypeError(
        f"cannot encode a {type(element).__name__} element ({str(element)[:40]}): event files hold numbers "
        "of numpy's fixed-size dtypes (an int within 64 bits) and strings"
    )


def check_encodable(array: np.ndarray) -> None:
    """SMDebugTypeError when an event file cannot hold the array (an int past int64, float128, objects):
    checked as a value is saved, where it is recorded unsaved, not only when the writer encodes it."""
    if array.dtype.kind == "O":
        for element in array.reshape(-1):
            if not isinstance(element, (str, bytes)):
                raise _not_a_string(element)
    elif array.dtype.kind not in "US":
        dtype_enum(array)


def _tensor_proto(tag: str, array: np.ndarray) -> list:
    dims = []
    for size in array.shape:  # smdebug names every dim "{tag}_{size}"
        dims += _sub(2, _int(1, size) + _text(2, f"{tag}_{size}"))
    shape = _sub(2, dims)  # present even for a 0-d array, like smdebug's TensorProto(tensor_shape=...)
    if array.dtype.kind in "USO":
        # smdebug leaves dtype unset and writes one utf-8 string_val per element (it only handles 1-d
        # str arrays; other ranks go in C order here and bytes are kept as they are).
        strings = []
        for s in array.reshape(-1):
            if not isinstance(s, (str, bytes)):
                raise _not_a_string(s)
            strings += _sub(8, [s.encode("utf-8") if isinstance(s, str) else bytes(s)])
        return shape + strings
    enum = dtype_enum(array)
    content = np.ascontiguousarray(array, dtype=_DTYPES[enum]).reshape(-1).view(np.uint8)
    return _int(1, enum) + shape + (_sub(4, [content]) if content.size else [])


def encode_tensor_event(
    tag: str, array: np.ndarray, step: int, wall_time: float, mode: int, mode_step: int
) -> bytes:
    """Serialized Event holding one tensor, as smdebug 1.0's FileWriter.write_tensor makes it."""
    if not isinstance(array, np.ndarray):  # smdebug's make_numpy_array turns a scalar into shape (1,)
        array = np.array([array]) if np.isscalar(array) else np.asarray(array)
    mode = int(getattr(mode, "value", mode))  # ModeKeys or its number
    plugins = _sub(1, _text(1, _MODE_STEP) + _text(2, str(int(mode_step))))
    plugins += _sub(1, _text(1, _MODE) + _text(2, str(mode)))
    value = _text(1, tag) + _sub(8, _tensor_proto(tag, array)) + _sub(9, plugins)
    return _event(wall_time, step, _sub(5, _sub(1, value)))


class Templates:
    """What a tensor's event holds besides its step, wall time, mode step and content (its tag, dtype,
    shape and mode): the same at every step, so encoded once and kept here, within ``budget`` bytes (an
    estimate of what the entries hold, names included; past it the cache starts over), with the last
    step's reduction records (step_scalar_records). A writer owns one, so that the bytes it keeps per
    tensor name count in its memory bound whatever the number of names."""

    # an entry besides its name and header bytes: its dict slot, key and value tuples (measured: ~160)
    ENTRY_BYTES = 200

    def __init__(self, budget: int):
        self.budget = budget
        self.held = 0
        # (tag, shape, dtype, mode) -> (header bytes, mode entry, dtype); scalar records: (name, dtype
        # enum, mode, tail length) -> (the bytes between the wall time and step and the content, its size)
        self.tensors: dict[tuple, tuple] = {}
        self.scalars: dict[tuple, tuple[bytes, int]] = {}
        self.layout: tuple | None = None  # the last step's reduction records (step_scalar_records)
        self.layout_bytes = 0

    def room(self, name: str, head: bytes) -> None:
        """Count a new entry, first emptying the cache when it would pass its budget."""
        self._hold(self.ENTRY_BYTES + len(name) + len(head))

    def _hold(self, nbytes: int) -> None:
        if self.held + nbytes > self.budget:
            self.tensors.clear()
            self.scalars.clear()
            self.layout, self.layout_bytes = None, 0
            self.held = 0
        self.held += nbytes

    def keep_layout(self, layout: tuple) -> None:
        """Keep a step's reduction records in place of the last one's, if they fit in half the budget
        (their bytes, and per record its positions, name, offset and size: about 100 bytes)."""
        self.held -= self.layout_bytes
        self.layout, self.layout_bytes = None, 0
        nbytes = layout[2].nbytes + 100 * len(layout[5]) + 8 * len(layout[1])
        if nbytes <= self.budget // 2:
            self._hold(nbytes)
            self.layout, self.layout_bytes = layout, nbytes


_TEMPLATES = Templates(4 * 1024 * 1024)  # for callers that bring none (a writer brings its own)
_SMALL = 4096  # a smaller tensor's content is joined with the record's other bytes (one write, not three)
_MODE_STEP_KEY = b"".join(_text(1, _MODE_STEP) + [_key(2, 2)])


def _template(tag: str, array: np.ndarray, enum: int, mode: int) -> tuple:
    nbytes = array.size * _DTYPES[enum].itemsize
    dims = []
    for size in array.shape:  # smdebug names every dim "{tag}_{size}"
        dims += _sub(2, _int(1, size) + _text(2, f"{tag}_{size}"))
    proto = _int(1, enum) + _sub(2, dims) + ([_key(4, 2), _varint(nbytes)] if nbytes else [])
    proto_len = sum(len(c) for c in proto) + nbytes
    head = b"".join(_text(1, tag) + [_key(8, 2), _varint(proto_len)] + proto)
    return head, _mode_entry(mode), _DTYPES[enum]


@functools.cache
def _mode_entry(mode: int) -> bytes:
    return b"".join(_sub(1, _text(1, _MODE) + _text(2, str(mode))))


def _plugins_field(mode_entry: bytes, mode_step: int) -> bytes:
    """An event's plugin data (Summary.Value field 9): its mode step, then its mode."""
    ms = str(int(mode_step)).encode()
    ms_entry = _MODE_STEP_KEY + _varint(len(ms)) + ms
    plugins = b"\x0a" + _varint(len(ms_entry)) + ms_entry + mode_entry
    return b"\x4a" + _varint(len(plugins)) + plugins


def tensor_event_chunks(
    tag: str,
    array: np.ndarray,
    step: int,
    wall_time: float,
    mode: int,
    mode_step: int,
    templates: Templates = _TEMPLATES,
) -> list:
    """encode_tensor_event's bytes as a list of chunks whose concatenation is the event: a large numeric
    tensor's content is one chunk, a view of the array itself (never copied when it is contiguous and in
    the file's byte order), so it is framed and written without a copy."""
    if not isinstance(array, np.ndarray):
        array = np.array([array]) if np.isscalar(array) else np.asarray(array)
    mode = int(getattr(mode, "value", mode))
    key = (tag, array.shape, array.dtype, mode)
    template = templates.tensors.get(key)
    if template is None:
        enum = _ENUM_OF.get((array.dtype.kind, array.dtype.itemsize))
        if (
            array.dtype.kind in "USO"
            or enum is None
            or array.dtype.fields is not None
            or type(tag) is not str
        ):
            return [
                encode_tensor_event(tag, array, step, wall_time, mode, mode_step)
            ]  # (raises if unsupported)
        template = _template(tag, array, enum, mode)
        templates.room(tag, template[0])
        templates.tensors[key] = template
    head, mode_entry, dtype = template
    if array.nbytes < _SMALL:
        content = array.astype(dtype, copy=False).tobytes()  # C order
    else:
        content = memoryview(np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8))
    tail = _plugins_field(mode_entry, mode_step)
    value_len = len(head) + len(content) + len(tail)
    value_key = b"\x0a" + _varint(value_len)
    pre = b"".join(
        _double(1, float(wall_time))
        + _int(2, int(step))
        + [b"\x2a", _varint(len(value_key) + value_len), value_key, head]
    )
    if type(content) is bytes:
        return [b"".join((pre, content, tail))]
    return [pre, content, tail]


def frame_chunks(chunks: list, checksum: bool = True) -> tuple[list, int, int]:
    """frame() of an event given as chunks, without joining them: (the record's chunks, the record's size,
    the event's masked CRC32C). The CRC runs over each chunk in turn (crc32c releases the GIL on large
    buffers)."""
    size = 0
    crc = 0
    for chunk in chunks:
        size += len(chunk)
        crc = _crc32c.crc32c(chunk, crc)
    masked = _mask(crc)
    header = _U64.pack(size)
    footer = masked if checksum else _NO_CHECKSUM
    return (
        [header + _U32.pack(masked_crc32c(header)), *chunks, _U32.pack(footer)],
        size + _HEADER + _FOOTER,
        masked,
    )


_RECORD_HEADERS: dict[int, bytes] = {}  # payload size -> the record's header (its length and that CRC)
_NO_CHECKSUM_FOOTER = _U32.pack(_NO_CHECKSUM)


def scalar_records(
    names: list[list[str]],
    values: list,
    step: int,
    wall_time: float,
    mode: int,
    mode_step: int,
    templates: Templates = _TEMPLATES,
) -> tuple[bytes, list[tuple[str, int, int, int]]]:
    """The TFRecords of many 0-d tensor events of one step (a step's reductions: ``values[i]`` is a 1-d
    array whose elements are named ``names[i]``), byte-identical to tensor_event_chunks' with smdebug's
    "no checksum" footer; and (name, offset, length, payload CRC) of each record in the returned bytes."""
    mode = int(getattr(mode, "value", mode))
    when = b"".join(_double(1, float(wall_time)) + _int(2, int(step)))
    tail = _plugins_field(_mode_entry(mode), mode_step)
    parts: list[bytes] = []
    entries: list[tuple[str, int, int, int]] = []
    offset = 0
    crc32c = _crc32c.crc32c
    heads = templates.scalars
    for some, array in zip(names, values):
        array = np.asarray(array).reshape(-1)
        enum = dtype_enum(array)
        content = array.astype(_DTYPES[enum], copy=False).tobytes()
        for i, name in enumerate(some):
            key = (name, enum, mode, len(tail))
            head = heads.get(key)
            if head is None:
                proto_head = _template(name, array[:1].reshape(()), enum, mode)[0]
                size = _DTYPES[enum].itemsize
                value_len = len(proto_head) + size + len(tail)
                value_key = b"\x0a" + _varint(value_len)
                head = (b"\x2a" + _varint(len(value_key) + value_len) + value_key + proto_head, size)
                templates.room(name, head[0])
                heads[key] = head
            middle, size = head
            event = b"".join((when, middle, content[i * size : (i + 1) * size], tail))
            header = _RECORD_HEADERS.get(len(event))
            if header is None:
                length = _U64.pack(len(event))
                header = _RECORD_HEADERS[len(event)] = length + _U32.pack(masked_crc32c(length))
            crc = crc32c(event)
            parts += (header, event, _NO_CHECKSUM_FOOTER)
            record = len(event) + _HEADER + _FOOTER
            entries.append((name, offset, record, _mask(crc)))
            offset += record
    return b"".join(parts), entries


def step_scalar_records(
    names: list[list[str]],
    values,
    step: int,
    wall_time: float,
    mode: int,
    mode_step: int,
    templates: Templates = _TEMPLATES,
) -> tuple[bytes, list[tuple[str, int, int, int]]]:
    """scalar_records (the same bytes) for step after step of the same reductions: the same name lists
    in the same order, of one dtype. The last step's records are kept (in ``templates``, within its
    budget) and a step like it only has its wall time and step, its values and its mode step written
    in, by numpy, and a CRC per record: no Python encoding per record."""
    mode = int(getattr(mode, "value", mode))
    when = b"".join(_double(1, float(wall_time)) + _int(2, int(step)))
    tail = _plugins_field(_mode_entry(mode), mode_step)
    flat = _flat_values(names, values)
    layout = templates.layout
    key = None if flat is None else (flat.dtype, mode, len(when), len(tail), len(names))
    if key is None or layout is None or layout[0] != key or not all(map(operator.is_, names, layout[1])):
        data, entries = scalar_records(names, values, step, wall_time, mode, mode_step, templates)
        if key is not None:
            templates.keep_layout(_layout(key, names, data, entries))
        return data, entries
    _, _, buffer, events, ends, flat_names, offsets, sizes = layout
    buffer[events[:, None] + np.arange(len(when))] = np.frombuffer(when, np.uint8)
    buffer[(ends - len(tail))[:, None] + np.arange(len(tail))] = np.frombuffer(tail, np.uint8)
    itemsize = flat.dtype.itemsize
    buffer[(ends - len(tail) - itemsize)[:, None] + np.arange(itemsize)] = flat.view(np.uint8).reshape(
        len(flat), itemsize
    )
    data = buffer.tobytes()
    view = memoryview(data)
    crc32c = _crc32c.crc32c
    spans = zip(events.tolist(), ends.tolist())
    crcs = np.fromiter((crc32c(view[a:b]) for a, b in spans), np.uint64, len(events))
    masked = (((crcs >> 15) | (crcs << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return data, list(zip(flat_names, offsets, sizes, masked.tolist()))


def _layout(key: tuple, names: list[list[str]], data: bytes, entries: list) -> tuple:
    """A step's reduction records as step_scalar_records keeps them: its bytes, and where each record's
    event starts and ends (the wall time and step first, the value and mode step last)."""
    offsets = [e[1] for e in entries]
    sizes = [e[2] for e in entries]
    events = np.array(offsets, dtype=np.int64) + _HEADER
    ends = events + np.array(sizes, dtype=np.int64) - _HEADER - _FOOTER
    flat_names = [e[0] for e in entries]
    buffer = np.frombuffer(data, np.uint8).copy()
    return (key, list(names), buffer, events, ends, flat_names, offsets, sizes)


def _flat_values(names: list[list[str]], values) -> np.ndarray | None:
    """A step's reduction values in record order, in their event files' dtype; None when they are not
    all of one dtype or their count is not the names' (scalar_records then says what is wrong)."""
    if not names:
        return None
    if isinstance(values, np.ndarray) and values.ndim == 2:
        if values.shape[0] != len(names) or any(len(some) != values.shape[1] for some in names):
            return None
        flat = values.reshape(-1)
    elif values and all(isinstance(v, np.ndarray) and v.dtype == values[0].dtype for v in values):
        flat = np.concatenate([v.reshape(-1) for v in values])
    else:
        return None
    enum = _ENUM_OF.get((flat.dtype.kind, flat.dtype.itemsize))
    if enum is None or flat.dtype.fields is not None or len(flat) != sum(map(len, names)):
        return None
    return np.ascontiguousarray(flat, dtype=_DTYPES[enum])


def _clean_tag(tag: str) -> str:
    # TensorBoard summaries get TensorFlow's tag cleaning, as in smdebug's summary.py.
    return _BAD_TAG_CHARS.sub("_", tag).lstrip("/")


def encode_scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """Serialized Event with a TensorBoard scalar (Summary.Value.simple_value)."""
    value = np.asarray(value)
    if value.squeeze().ndim != 0:
        raise SMDebugValueError(f"Scalar summary {tag!r} needs a single value, got shape {value.shape}")
    x = float(value.reshape(-1)[0])
    if abs(x) > 3.4028234663852886e38:  # protobuf saturates floats out of float32 range to +-inf
        x = math.copysign(math.inf, x)
    # simple_value is a oneof member, so it is written even when 0.
    simple = [_key(2, 5), _F32.pack(x)]
    return _event(wall_time, step, _sub(5, _sub(1, _text(1, _clean_tag(tag)) + simple)))


def encode_summary_event(summary: bytes, step: int, wall_time: float) -> bytes:
    """Serialized Event holding a Summary serialized already (what TensorFlow's summary ops compute)."""
    return _event(wall_time, step, _sub(5, [bytes(summary)]))


def _tf_default_bins() -> np.ndarray:
    # TensorFlow's default histogram edges: 0 and +-1e-12 * 1.1**k up to 1e20, grown by repeated
    # multiplication (not powers) so that every edge has the same bits as smdebug's.
    edges, v = [], 1e-12
    while v < 1e20:
        edges.append(v)
        v *= 1.1
    return np.array([-v for v in reversed(edges)] + [0.0] + edges)


_DEFAULT_BINS = _tf_default_bins()


def encode_histogram_event(tag: str, array: np.ndarray, step: int, wall_time: float, bins="default") -> bytes:
    """Serialized Event with a TensorBoard histogram (HistogramProto) of array's values.

    bins is "default" (TensorFlow's exponential buckets) or anything numpy.histogram accepts.
    Raises SMDebugValueError for an empty array or when no value falls in any bucket.
    """
    values = np.asarray(array).astype(np.float64).reshape(-1)
    if values.size == 0:
        raise SMDebugValueError(f"Histogram {tag!r}: the input has no element")
    if isinstance(bins, str) and bins == "default":
        bins = _DEFAULT_BINS
    counts, limits = np.histogram(values, bins=bins)
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        raise SMDebugValueError(f"Histogram {tag!r}: no value falls in any bucket")
    first, last = int(nonzero[0]), int(nonzero[-1])
    # TensorBoard reads only right edges, so keep one empty bucket left of the first non-empty one:
    # its right edge is the left edge of the data.
    if first > 0:
        counts = counts[first - 1 : last + 1]
    else:
        counts = np.concatenate([[0], counts[: last + 1]])
    limits = limits[first : last + 2]
    histo = (
        _double(1, values.min())
        + _double(2, values.max())
        + _double(3, float(values.size))
        + _double(4, values.sum())
        + _double(5, values.dot(values))
        + _sub(6, [np.asarray(limits, "<f8").tobytes()])  # packed repeated double
        + _sub(7, [np.asarray(counts, "<f8").tobytes()])
    )
    return _event(wall_time, step, _sub(5, _sub(1, _text(1, _clean_tag(tag)) + _sub(5, histo))))


def encode_file_version_event(wall_time: float) -> bytes:
    """The event TensorBoard expects first in a file (smdebug 1.0 itself never writes it)."""
    return _event(wall_time, 0, _sub(3, [b"brain.Event:2"]))


# ---------------------------------------------------------------------------------------------------
# Decoding


@dataclass
class SummaryValue:
    tag: str = ""
    value: Optional[np.ndarray] = None  # the tensor, if the value holds one
    simple_value: Optional[float] = None  # a TensorBoard scalar
    mode: int = 4  # ModeKeys value; GLOBAL when the event does not say
    mode_step: Optional[int] = None  # None when absent: the event's step applies


@dataclass
class Event:
    wall_time: float = 0.0
    step: int = 0
    file_version: str = ""
    values: list[SummaryValue] = field(default_factory=list)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]  # IndexError when truncated
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, object]]:
    """Yield (field number, wire type, value): an int for varints, else a memoryview of the raw bytes."""
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]  # one-byte varints (almost every key and length) without a call
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(buf, pos)
        wire_type = key & 7
        if wire_type == 0:
            value, pos = _read_varint(buf, pos)
        else:
            if wire_type == 2:
                size = buf[pos]
                if size < 0x80:
                    pos += 1
                else:
                    size, pos = _read_varint(buf, pos)
            elif wire_type in (1, 5):
                size = 8 if wire_type == 1 else 4
            else:
                raise ValueError(f"unsupported wire type {wire_type}")
            value = buf[pos : pos + size]
            pos += size
        if pos > end:
            raise ValueError("field runs past the end of its message")
        yield key >> 3, wire_type, value


def _signed64(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def _varints(items: list) -> list:
    """Integers of a repeated varint field, whether written packed (wire type 2) or not."""
    out = []
    for wire_type, value in items:
        if wire_type == 0:
            out.append(value)
        elif wire_type == 2:
            pos = 0
            while pos < len(value):
                n, pos = _read_varint(value, pos)
                out.append(n)
    return out


# TensorProto field holding each dtype's values when tensor_content is absent (TensorFlow writes small
# tensors this way): (field number, little-endian element dtype for fixed-width fields or None for varint).
_VALUE_FIELDS = {
    1: (5, "<f4"),  # float_val
    2: (6, "<f8"),  # double_val
    8: (9, "<f4"),  # scomplex_val: real, imag pairs
    18: (12, "<f8"),  # dcomplex_val
    3: (7, None),  # int_val, also for the narrower integer types
    4: (7, None),
    5: (7, None),
    6: (7, None),
    17: (7, None),
    9: (10, None),  # int64_val
    10: (11, None),  # bool_val
    19: (13, None),  # half_val: float16 bit patterns
    22: (16, None),  # uint32_val
    23: (17, None),  # uint64_val
}


def _typed_values(dtype: int, repeated: dict) -> np.ndarray:
    num, element = _VALUE_FIELDS[dtype]
    items = repeated.get(num, [])
    if element is not None:  # fixed width: packed chunks and single values are all raw bytes
        raw = b"".join(bytes(value) for wire_type, value in items if wire_type != 0)
        return np.frombuffer(raw, element).view(_DTYPES[dtype])
    ints = np.array(_varints(items), dtype=np.uint64)
    if dtype == 19:
        return ints.astype(np.uint16).view(np.float16)
    if dtype == 23:
        return ints
    return ints.view(np.int64).astype(_DTYPES[dtype])  # int32 values are sign-extended to 64 bits


_SHAPES: dict[bytes, list] = {}  # a TensorShapeProto's bytes -> its dims (the same at every step)


def _decode_shape(value: memoryview) -> list:
    key = bytes(value)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = []
        for dim_num, dim_type, dim in _fields(value):
            if dim_num == 2 and dim_type == 2:
                sizes = [_signed64(v) for n, t, v in _fields(dim) if n == 1 and t == 0]
                shape.append(sizes[-1] if sizes else 0)
        if len(_SHAPES) >= 100_000:
            _SHAPES.clear()
        _SHAPES[key] = shape
    return list(shape)


def _decode_tensor(buf: memoryview) -> np.ndarray:
    dtype, shape, content, repeated = 0, [], None, {}
    for num, wire_type, value in _fields(buf):
        if num == 1 and wire_type == 0:
            dtype = value
        elif num == 2 and wire_type == 2:
            shape = _decode_shape(value)
        elif num == 4 and wire_type == 2:
            content = value
        else:
            repeated.setdefault(num, []).append((wire_type, value))
    if dtype in (0, _DT_STRING):  # smdebug writes strings with dtype unset
        strings = [bytes(v) for t, v in repeated.get(8, []) if t == 2]
        try:
            array = np.array([s.decode("utf-8") for s in strings], dtype=str)
        except UnicodeDecodeError:
            array = np.array(strings, dtype=object)
        return array.reshape(shape)
    if dtype not in _DTYPES:
        raise SMDebugTypeError(f"TensorProto dtype {dtype} is not supported")
    if content is not None:
        return np.frombuffer(content, _DTYPES[dtype]).reshape(shape).copy()
    values = _typed_values(dtype, repeated)
    count = math.prod(shape)
    if 0 < values.size < count:  # TensorFlow's convention: the last value repeats to fill the shape
        values = np.concatenate([values, np.repeat(values[-1:], count - values.size)])
    elif values.size == 0:
        values = np.zeros(count, _DTYPES[dtype])
    return values.reshape(shape).astype(_DTYPES[dtype])


def _decode_value(buf: memoryview) -> SummaryValue:
    sv = SummaryValue()
    for num, wire_type, value in _fields(buf):
        if num == 1 and wire_type == 2:
            sv.tag = str(value, "utf-8")
        elif num == 2 and wire_type == 5:
            sv.simple_value = _F32.unpack(value)[0]
        elif num == 8 and wire_type == 2:
            sv.value = _decode_tensor(value)
        elif num == 9 and wire_type == 2:
            for plugin_num, plugin_type, plugin in _fields(value):
                if plugin_num != 1 or plugin_type != 2:
                    continue
                parts = {n: bytes(v) for n, t, v in _fields(plugin) if t == 2}
                name = parts.get(1, b"")
                if name == _MODE_STEP:
                    sv.mode_step = int(parts.get(2, b"0"))
                elif name == _MODE:
                    sv.mode = int(parts.get(2, b"0"))
    return sv


def _find(buf, pos: int, end: int, want: int) -> tuple[int, int] | None:
    """(start, end) of the first length-delimited field number ``want`` in buf[pos:end] (a message)."""
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(buf, pos)
        wire_type = key & 7
        if wire_type == 0:
            while buf[pos] >= 0x80:
                pos += 1
            pos += 1
            continue
        if wire_type == 2:
            size = buf[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = _read_varint(buf, pos)
            if key >> 3 == want:
                if pos + size > end:
                    raise ValueError("field runs past the end of its message")
                return pos, pos + size
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        pos += size
    if pos > end:
        raise ValueError("field runs past the end of its message")
    return None


def _decode_dense(buf, pos: int, end: int) -> np.ndarray | None:
    """A TensorProto written as smdebug writes numeric tensors (dtype, shape, then tensor_content),
    decoded inline; None for any other form (_decode_tensor handles every form)."""
    if buf[pos] != 0x08 or buf[pos + 1] >= 0x80:  # dtype, one byte
        return None
    dtype = _DTYPES.get(buf[pos + 1])
    pos += 2
    if dtype is None or buf[pos] != 0x12:  # shape
        return None
    size = buf[pos + 1]
    if size < 0x80:
        pos += 2
    else:
        size, pos = _read_varint(buf, pos + 1)
    shape = _decode_shape(buf[pos : pos + size])
    pos += size
    if pos == end:  # no content: an empty tensor
        return np.zeros(shape, dtype) if 0 in shape else None
    if buf[pos] != 0x22:  # tensor_content
        return None
    size = buf[pos + 1]
    if size < 0x80:
        pos += 2
    else:
        size, pos = _read_varint(buf, pos + 1)
    if pos + size != end or size != math.prod(shape) * dtype.itemsize:
        return None
    return np.frombuffer(buf, dtype, size // dtype.itemsize, pos).reshape(shape)  # a view: callers copy


def decode_tensor_value(payload: bytes) -> np.ndarray | None:
    """The tensor of an Event (what a Trial reads as a value: Summary.Value.tensor of its first value
    that has one), without decoding the rest of it; None when it holds none. Raises CorruptRunError when
    payload is not a well-formed Event."""
    buf = memoryview(payload)
    try:
        summary = _find(buf, 0, len(buf), 5)
        if summary is None:
            return None
        pos, end = summary
        while True:
            value = _find(buf, pos, end, 1)
            if value is None:
                return None
            tensor = _find(buf, value[0], value[1], 8)
            if tensor is not None:
                dense = _decode_dense(buf, *tensor)
                return dense.copy() if dense is not None else _decode_tensor(buf[tensor[0] : tensor[1]])
            pos = value[1]
    except (IndexError, ValueError, struct.error) as e:
        raise CorruptRunError(f"malformed Event: {e}") from e


_HEADS: dict[int, bytes] = {}  # a record's length -> its header
_NO_CHECKSUM_BYTES = _U32.pack(_NO_CHECKSUM)


def tensor_at(buf: bytes, pos: int, length: int, crc: Optional[int] = None, key=None) -> np.ndarray | None:
    """The tensor of the record at buf[pos:pos + length] (an index entry's), when the record is whole,
    passes every check read_record makes and is laid out as smdebug writes a dense tensor (wall time,
    step, then Summary.Value{tag, tensor{dtype, shape, tensor_content}}); None for anything else, and
    read_record and decode_tensor_value then say what it is. Whatever it returns, they would return
    too. One pass over the file's bytes, one copy: the per-value path of a Trial.

    ``key`` (the tensor's name, say) remembers the bytes between the step and the content of the last
    record read under it: the next record under the same key that starts with the same bytes has its
    content at the same place, as every length, the dtype and the shape in them are the same.
    """
    try:
        # the header of a record this long (its length and that CRC) is known: compare bytes
        head = _HEADS.get(length)
        if head is None:
            if length < _HEADER + _FOOTER:
                return None
            if len(_HEADS) >= 100_000:
                _HEADS.clear()
            size = _U64.pack(length - _HEADER - _FOOTER)
            head = _HEADS[length] = size + _U32.pack(masked_crc32c(size))
        p = pos + _HEADER
        stop = pos + length - _FOOTER
        if pos < 0 or pos + length > len(buf) or not buf.startswith(head, pos):
            return None
        if crc is not None or not buf.startswith(_NO_CHECKSUM_BYTES, stop):
            footer = _U32.unpack_from(buf, stop)[0]
            actual = masked_crc32c(memoryview(buf)[p:stop])
            if (footer != _NO_CHECKSUM and footer != actual) or (crc is not None and crc != actual):
                return None
        # Event: wall_time (1, fixed64), step (2, varint), summary (5)
        if buf[p] == 0x09:
            p += 9
        if buf[p] == 0x10:
            p += 1
            while buf[p] >= 0x80:
                p += 1
            p += 1
        if key is not None:
            known = _LAYOUTS.get(key)
            if known is not None:
                head, content_at, summary_end, shape, dtype = known
                if p + summary_end <= stop and buf.startswith(head, p):
                    return np.ndarray(shape, dtype, buf, p + content_at).copy()
        first = p
        if buf[p] != 0x2A:
            return None
        n = buf[p + 1]
        p, n = (p + 2, n) if n < 0x80 else _read_varint(buf, p + 1)[::-1]
        end = summary_end = p + n
        if end > stop or buf[p] != 0x0A:  # Summary: its first value (1)
            return None
        n = buf[p + 1]
        p, n = (p + 2, n) if n < 0x80 else _read_varint(buf, p + 1)[::-1]
        end, last = p + n, end
        if end > last:
            return None
        if buf[p] == 0x0A:  # Value: tag (1), then tensor (8)
            n = buf[p + 1]
            p, n = (p + 2, n) if n < 0x80 else _read_varint(buf, p + 1)[::-1]
            p += n
        if buf[p] != 0x42:
            return None
        n = buf[p + 1]
        p, n = (p + 2, n) if n < 0x80 else _read_varint(buf, p + 1)[::-1]
        end, last = p + n, end
        if end > last or buf[p] != 0x08 or buf[p + 2] != 0x12:  # TensorProto: dtype (1), shape (2)
            return None
        dtype = _DTYPES.get(buf[p + 1])
        if dtype is None:
            return None
        n = buf[p + 3]
        p, n = (p + 4, n) if n < 0x80 else _read_varint(buf, p + 3)[::-1]
        shape = tuple(_decode_shape(buf[p : p + n]))
        p += n
        count = math.prod(shape)
        if p == end:  # no content: an empty tensor
            return np.zeros(shape, dtype) if count == 0 and 0 in shape else None
        if buf[p] != 0x22:  # tensor_content (4)
            return None
        n = buf[p + 1]
        p, n = (p + 2, n) if n < 0x80 else _read_varint(buf, p + 1)[::-1]
        if p + n != end or n != count * dtype.itemsize:
            return None
        if key is not None and type(buf) is bytes:
            if len(_LAYOUTS) >= 100_000:
                _LAYOUTS.clear()
            _LAYOUTS[key] = (buf[first:p], p - first, summary_end - first, shape, dtype)
        return np.ndarray(shape, dtype, buf, p).copy()
    except (IndexError, ValueError, TypeError, AttributeError, struct.error):
        return None


_LAYOUTS: dict = {}  # tensor_at's key -> (bytes from the summary to the content, content offset in
# them, summary end, shape, dtype) of the last record read under it


def decode_event(payload: bytes) -> Event:
    """Parse a serialized Event (fields this codec does not use are skipped).

    Raises CorruptRunError when payload is not a well-formed Event.
    """
    event = Event()
    try:
        for num, wire_type, value in _fields(memoryview(payload)):
            if num == 1 and wire_type == 1:
                event.wall_time = _F64.unpack(value)[0]
            elif num == 2 and wire_type == 0:
                event.step = _signed64(value)
            elif num == 3 and wire_type == 2:
                event.file_version = str(value, "utf-8")
            elif num == 5 and wire_type == 2:
                event.values += [_decode_value(v) for n, t, v in _fields(value) if n == 1 and t == 2]
    except (IndexError, ValueError, struct.error) as e:
        raise CorruptRunError(f"malformed Event: {e}") from e
    return event
