"""The writer process's wire format: what the training process sends its child, and how the child reads it.

A step's items (RunWriter's batch items: tensors, reductions, shapes, its end, files) go down a pipe as one
message: a frame (header and payload lengths), a JSON header describing the items, then the payload, the
arrays' bytes in order. Arrays may instead be in memory shared with the child (``Ring``): the header then
says where. Lists of reduction names, the same objects step after step, are sent once, then by number, and a
step's whole list of them, when it is the last step's, not at all.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct

import numpy as np

from smdebug.modes import ModeKeys
from smdebug.writing.protocol import Writer

logger = logging.getLogger("smdebug")

FRAME = struct.Struct("<II")  # header length, payload length
RING_READ = struct.Struct("<Q")  # at the ring's start: how many bytes the child has read (it writes it)
_RING_START = 64  # where the arrays' bytes begin
_IOV_MAX = 512  # buffers per writev call (Linux allows 1024)
# a compact header (its first byte; a JSON header's is "["): the ring's part, then its items
_COMPACT = b"C"
_C_RING = struct.Struct("<BQQQ")  # whether the payload is in the ring, its position and size; ring.used
_C_TENSOR = struct.Struct("<qBqdQHBB")  # step, mode, mode step, wall time, position, name, dtype, ndim
_C_SCALARS = struct.Struct("<qBqdIB")  # step, mode, mode step, wall time, reductions, dtype (its length)
_C_END = struct.Struct("<q")
_IN_PAYLOAD = 2**64 - 1  # a compact tensor's position when its bytes are in the payload, not in the ring
# what changes from step to step in an item's part (the start of it): step, mode, mode step, wall time, position
_C_TENSOR_NUMBERS, _C_SCALARS_NUMBERS = struct.Struct("<qBqdQ"), struct.Struct("<qBqd")
_EMPTY_HEAD = bytes(FRAME.size) + _COMPACT + bytes(_C_RING.size)  # a compact message's frame and ring part


class Gone(Exception):
    """The child process cannot take more: it exited."""


class Ring:
    """Memory shared with the child, used in a circle: arrays go in one after another, and the child
    copies them out when it reads the message that describes them from the pipe, then notes at the start
    of the ring how far it has read. Nothing waits for room: an array that does not fit goes down the pipe."""

    def __init__(self, size: int):
        self.fd = os.memfd_create("smdebug-writer")  # no name in any file system; gone with its last user
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.bytes = np.frombuffer(self.map, np.uint8)  # for arrays with strides
        self.size = size - _RING_START
        self.used = 0  # bytes handed out so far (where the next array goes, modulo the size)

    def take(self, nbytes: int) -> int | None:
        """Where ``nbytes`` go (in one piece, 64-byte aligned), or None when the child has not read enough
        of the ring yet."""
        used, size = self.used, self.size
        at = used % size
        if at + nbytes > size:  # never split: start again at the beginning
            used += size - at
            at = 0
        end = used + -(-nbytes // 64) * 64
        if end - RING_READ.unpack_from(self.map)[0] > size:
            return None
        self.used = end
        return _RING_START + at

    def put(self, buffers: list, nbytes: int) -> list | None:
        """Copy the buffers in, one after another: [offset, bytes] for the child, or None."""
        position = self.take(nbytes)
        if position is None:
            return None
        start = position
        for view in map(memoryview, buffers):
            if view.nbytes:  # (an empty array's view cannot be cast)
                self.map[position : position + view.nbytes] = view.cast("B")
                position += view.nbytes
        return [start, nbytes]

    def copy_in(self, array: np.ndarray) -> InRing | None:
        """Copy one array in, or None when there is no room for it."""
        nbytes = array.nbytes
        position = self.take(nbytes)
        if position is None:
            return None
        if nbytes and array.flags.c_contiguous:
            self.map[position : position + nbytes] = memoryview(array).cast("B")
        elif nbytes:  # strided
            place = self.bytes[position : position + nbytes].view(array.dtype).reshape(array.shape)
            np.copyto(place, array)
        return InRing(position, array.dtype, array.shape, nbytes)


class Mailboxes:
    """Two boxes in memory shared with the child where finished steps' messages wait, whole, to be announced
    down the pipe a few steps at a time (one write and one wake of the child for them, not one each). The
    training process fills one box while the child may still be taking the other; a box the child has not
    taken is not filled again. A box counts whole messages only, so when training dies the child still
    writes the steps in the box being filled (``left``)."""

    HEAD = struct.Struct("<QQQ")  # a box's generation, bytes of whole messages in it, generation taken

    def __init__(self, size: int, fd: int | None = None):
        """``size`` bytes a box; the child maps the training process's ``fd``."""
        self.fd = os.memfd_create("smdebug-mail") if fd is None else fd
        try:
            if fd is None:
                os.ftruncate(self.fd, 2 * size)
            self.map = mmap.mmap(self.fd, 2 * size)
        except OSError:
            os.close(self.fd)
            raise
        self.size = size
        self.box: int | None = None  # the box being filled
        self.generation = 0  # the last box's (boxes are told apart from their earlier fillings by it)

    def put(self, parts: list, nbytes: int) -> bool:
        """Add one message's parts to the box being filled (a free one if none is): False when there is
        no room, or no free box."""
        box, head = self.box, self.HEAD
        if box is None:
            for box in (0, 1):
                generation, _, taken = head.unpack_from(self.map, box * self.size)
                if generation == taken:
                    break
            else:
                return False
            self.generation += 1
            head.pack_into(self.map, box * self.size, self.generation, 0, generation)
            self.box = box
        start = box * self.size
        used = head.unpack_from(self.map, start)[1]
        at = start + head.size + used
        if at + nbytes > start + self.size:
            return False
        for view in map(memoryview, parts):
            if view.nbytes:
                self.map[at : at + view.nbytes] = view.cast("B")
                at += view.nbytes
        struct.pack_into("<Q", self.map, start + 8, used + nbytes)  # after the bytes: whole messages only
        return True

    def announce(self) -> list | None:
        """The message that gives the child the box being filled (None when it holds nothing)."""
        box = self.box
        if box is None:
            return None
        generation, used, _ = self.HEAD.unpack_from(self.map, box * self.size)
        if not used:
            return None
        self.box = None
        return ["mail", box, generation, used]

    def drop(self) -> None:
        """Empty the box being filled: its steps are written in this process (a child that is stopping
        must not write them too from its end of file)."""
        if self.box is not None:
            start = self.box * self.size
            struct.pack_into("<Q", self.map, start + 16, self.HEAD.unpack_from(self.map, start)[0])
            self.box = None

    # -- the child's side --
    def take(self, box: int, generation: int, used: int) -> bytes:
        """The messages of an announced box, copied out; the box is free again."""
        start = box * self.size + self.HEAD.size
        data = self.map[start : start + used]
        struct.pack_into("<Q", self.map, box * self.size + 16, generation)
        return data

    def left(self) -> bytes:
        """The whole messages of a box training was filling when it died (it announced the others)."""
        for box in (0, 1):
            generation, used, taken = self.HEAD.unpack_from(self.map, box * self.size)
            if generation != taken and used:
                return self.take(box, generation, used)
        return b""


def messages(data: bytes):
    """The messages (header, payload) one after another in ``data``."""
    at, view = 0, memoryview(data)
    while at < len(data):
        head_len, size = FRAME.unpack_from(data, at)
        head = data[at + FRAME.size : at + FRAME.size + head_len]
        at += FRAME.size + head_len
        yield (json.loads(head) if head[:1] == b"[" else expand(head)), view[at : at + size]
        at += size


class InRing:
    """An array copied into the ring, in a step's batch: where it is, its dtype and shape."""

    __slots__ = ("position", "dtype", "shape", "nbytes")

    def __init__(self, position: int, dtype: np.dtype, shape: tuple, nbytes: int):
        self.position, self.dtype, self.shape, self.nbytes = position, dtype, shape, nbytes

    def copy(self, ring: Ring) -> np.ndarray:
        data = ring.bytes[self.position : self.position + self.nbytes]
        return data.view(self.dtype).reshape(self.shape).copy()


def message(header: list, buffers: list = ()) -> list:
    head = json.dumps(header, separators=(",", ":")).encode()
    size = sum(b.nbytes if isinstance(b, np.ndarray) else len(b) for b in buffers)
    return [FRAME.pack(len(head), size), head, *buffers]


def owned(item: tuple, ring: Ring | None) -> tuple:
    """A batch item with its array out of the ring, for a writer in this process."""
    if item[0] == "tensor" and isinstance(item[5], InRing):
        return (*item[:5], item[5].copy(ring), *item[6:])
    return item


def steps_of(items: list) -> set[int]:
    return {item[1] for item in items if item[0] != "file"}


class Names:
    """Numbers for a tensor's lists of reduction names (the same list objects step after step): each is
    sent once, then by its number. Holding the lists keeps their ids from being reused. The child keeps
    a copy of each list it was sent: past ``budget`` bytes of them (an estimate, names included) both
    sides start over (``ids`` says so, and the child is told before the lists that follow)."""

    LIST_BYTES, NAME_BYTES = 160, 80  # a list and a name in it besides its characters, both sides' tables

    def __init__(self, budget: int):
        self.budget = budget
        self.held = 0
        self.numbers: dict[int, tuple[list, int]] = {}
        self.last: tuple[list, list[int]] | None = None  # the last list of lists and its numbers

    def ids(self, names: list[list[str]]) -> tuple[list[int] | None, list, bool]:
        """The numbers of these lists (None: the same list of lists as the last time, which a hook gives
        at every step: the child knows it), [number, list] of those the child has not seen yet, and
        whether the child must forget the lists it has first."""
        last = self.last
        if last is not None and last[0] is names:
            return None, [], False
        numbers = self.numbers
        cost = sum(self._bytes(some) for some in names if id(some) not in numbers)
        reset = bool(numbers) and self.held + cost > self.budget
        if reset:
            numbers.clear()
            self.held = 0
        ids, new = [], []
        for some in names:
            known = numbers.get(id(some))
            if known is None:
                known = numbers[id(some)] = (some, len(numbers))
                new.append([known[1], some])
                self.held += self._bytes(some)
            ids.append(known[1])
        self.last = (names, ids)
        return ids, new, reset

    def _bytes(self, some: list[str]) -> int:
        return self.LIST_BYTES + sum(self.NAME_BYTES + len(name) for name in some)


def encode(items: list, names_table: Names) -> tuple[list, list]:
    """RunWriter batch items as JSON-able descriptions and the buffers of their payload, in order."""
    header, buffers = [], []
    for item in items:
        kind = item[0]
        if kind == "tensor":
            _, step, mode, mode_step, name, array, wall_time = item
            if isinstance(array, InRing):  # its bytes are in the ring already
                where = [array.dtype.str, array.shape, wall_time, array.position]
                header.append(["t", step, mode.value, mode_step, name, *where])
                continue
            if array.dtype.kind == "O":
                described = strings(array)
                if described is None:  # what RunWriter says of an element it cannot encode
                    logger.warning("smdebug: could not encode %s at step %d: not text", name, step)
                    continue
                kinds, chunks = described
                header.append(["o", step, mode.value, mode_step, name, array.shape, kinds, wall_time])
                buffers.extend(chunks)
                continue
            if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
                array = array.copy(order="C")
            header.append(["t", step, mode.value, mode_step, name, array.dtype.str, array.shape, wall_time])
            buffers.append(array)
        elif kind == "scalars":
            _, step, mode, mode_step, names, values, wall_time = item
            ids, new, reset = names_table.ids(names)
            if reset:
                header.append(["r"])
            if isinstance(values, np.ndarray) and values.ndim == 2 and values.dtype.kind in "fiub":
                # a [results, reductions] matrix (smdebug_to_host's bulk answer): already one buffer
                sizes, dtypes, values = values.shape[1], values.dtype.str, [values]
            elif (
                values
                and values[0].dtype.kind in "fiub"
                and all(v.dtype == values[0].dtype and v.ndim == 1 for v in values)
            ):
                sizes = [v.size for v in values]
                dtypes, values = values[0].dtype.str, [np.concatenate(values)]  # rows of a result matrix
            else:  # results of different dtypes each keep theirs
                sizes = [v.size for v in values]
                dtypes = [v.dtype.str for v in values]
                values = [np.ascontiguousarray(v) for v in values]
            header.append(["s", step, mode.value, mode_step, ids, new, dtypes, sizes, wall_time])
            buffers.extend(values)
        elif kind == "shape":
            header.append(["h", item[1], item[2].value, item[3], item[4], item[5]])
        elif kind == "end":
            header.append(["e", item[1]])
        else:  # file
            header.append(["f", item[1], len(item[2])])
            buffers.append(item[2])
    return header, buffers


class Compact:
    """A common step's items as a compact message: numeric arrays (in the ring or not), reductions as one
    matrix named by the last step's lists, the step's end; None for anything else (``encode`` describes
    it; nothing here changes the names table). The last step's header is kept: a step of the same names,
    dtypes and shapes (a hook's every step) has only its numbers written into a copy of it."""

    def __init__(self, names_table: Names):
        self.names_table = names_table
        self.key: list | None = None  # the header's items as they shape it: names, dtypes, shapes
        self.head = b""  # the message's head: frame, mark, ring part, items
        self.slots: list[tuple[int, struct.Struct]] = []  # where each item's numbers go in it

    def __call__(self, items: list) -> tuple[bytearray, list, int, set[int]] | None:
        """The message's head (its frame and ring part filled in by ``message``), the payload's buffers,
        their size and the items' steps."""
        key, numbers, buffers, nbytes, steps = [], [], [], 0, set()
        last = self.names_table.last
        for item in items:
            kind = item[0]
            if kind == "tensor":
                _, step, mode, mode_step, name, array, wall_time = item
                if type(wall_time) is not float:
                    return None
                if type(array) is InRing:
                    where, dtype = array.position, array.dtype
                elif type(array) is np.ndarray and (dtype := array.dtype).kind in "biufc":
                    where = _IN_PAYLOAD
                    if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
                        array = array.copy(order="C")
                    buffers.append(array)
                    nbytes += array.nbytes
                else:
                    return None
                key.append((name, dtype, array.shape))
                numbers.append((step, mode.value, mode_step, wall_time, where))
            elif kind == "scalars":
                _, step, mode, mode_step, names, values, wall_time = item
                shape = values.shape if type(values) is np.ndarray else ()
                if (
                    len(shape) != 2
                    or last is None
                    or last[0] is not names
                    or (dtype := values.dtype).kind not in "fiub"
                    or not values.flags.c_contiguous
                    or type(wall_time) is not float
                ):
                    return None
                buffers.append(values)
                nbytes += values.nbytes
                key.append((dtype, shape[1]))
                numbers.append((step, mode.value, mode_step, wall_time))
            elif kind == "end":
                step = item[1]
                key.append(None)
                numbers.append((step,))
            else:
                return None
            steps.add(step)
        if key != self.key and not self._shape(items, key):
            return None
        head = bytearray(self.head)
        for (at, fields), some in zip(self.slots, numbers):
            fields.pack_into(head, at, *some)
        return head, buffers, nbytes, steps

    def _shape(self, items: list, key: list) -> bool:
        """Make the header of these items (their numbers left to fill in); False when it cannot be."""
        parts, slots = [_EMPTY_HEAD], []
        at = len(_EMPTY_HEAD)
        for item, shaped in zip(items, key):
            if item[0] == "tensor":
                name, (dtype, shape) = item[4].encode("utf-8", "surrogatepass"), shaped[1:]
                if len(name) > 0xFFFF or len(shape) > 0xFF:
                    return False
                dtype = dtype.str.encode()
                part = [b"t", _C_TENSOR.pack(0, 0, 0, 0.0, 0, len(name), len(dtype), len(shape))]
                part += (name, dtype, struct.pack(f"<{len(shape)}q", *shape))
                slots.append((at + 1, _C_TENSOR_NUMBERS))
            elif item[0] == "scalars":
                dtype = shaped[0].str.encode()
                part = [b"s", _C_SCALARS.pack(0, 0, 0, 0.0, shaped[1], len(dtype)), dtype]
                slots.append((at + 1, _C_SCALARS_NUMBERS))
            else:
                part = [b"e", _C_END.pack(0)]
                slots.append((at + 1, _C_END))
            parts += part
            at += sum(map(len, part))
        self.key, self.head, self.slots = key, b"".join(parts), slots
        return True

    @staticmethod
    def message(head: bytearray, buffers: list, nbytes: int, shared: list | None, used: int) -> list:
        """The message of a compact head: its payload in the ring (``shared``) or after the head."""
        FRAME.pack_into(head, 0, len(head) - FRAME.size, 0 if shared else nbytes)
        if shared:
            _C_RING.pack_into(head, FRAME.size + 1, 1, *shared, used)
            return [head]
        _C_RING.pack_into(head, FRAME.size + 1, 0, 0, 0, used)
        return [head, *buffers]


def expand(head: bytes) -> list:
    """A compact header as the JSON header of the same items would read."""
    in_ring, position, nbytes, used = _C_RING.unpack_from(head, 1)
    at, header = 1 + _C_RING.size, []
    while at < len(head):
        kind = head[at : at + 1].decode()
        at += 1
        if kind == "t":
            step, mode, mode_step, wall_time, where, n_name, n_dtype, ndim = _C_TENSOR.unpack_from(head, at)
            at += _C_TENSOR.size
            name = head[at : at + n_name].decode("utf-8", "surrogatepass")
            dtype = head[at + n_name : at + n_name + n_dtype].decode()
            at += n_name + n_dtype
            shape = list(struct.unpack_from(f"<{ndim}q", head, at))
            at += 8 * ndim
            header.append(["t", step, mode, mode_step, name, dtype, shape, wall_time])
            if where != _IN_PAYLOAD:
                header[-1].append(where)
        elif kind == "s":
            step, mode, mode_step, wall_time, size, n_dtype = _C_SCALARS.unpack_from(head, at)
            at += _C_SCALARS.size
            dtype = head[at : at + n_dtype].decode()
            at += n_dtype
            header.append(["s", step, mode, mode_step, None, [], dtype, size, wall_time])
        else:
            header.append(["e", _C_END.unpack_from(head, at)[0]])
            at += _C_END.size
    return ["items", header, [position, nbytes] if in_ring else None, used]


def strings(array: np.ndarray) -> tuple[list, list] | None:
    """An object array of str and bytes elements: their kinds and lengths, and their bytes."""
    kinds, chunks = [], []
    for s in array.reshape(-1):
        if isinstance(s, str):
            chunk = s.encode("utf-8", "surrogatepass")
            kinds.append(["s", len(chunk)])
        elif isinstance(s, bytes):
            chunk = s
            kinds.append(["b", len(chunk)])
        else:
            return None
        chunks.append(chunk)
    return kinds, chunks


def feed(writer: Writer, items: list) -> None:
    for item in items:
        kind = item[0]
        if kind == "tensor":
            writer.write_tensor(*item[1:])
        elif kind == "scalars":
            writer.write_scalars(*item[1:])
        elif kind == "shape":
            writer.write_shape(*item[1:])
        elif kind == "end":
            writer.end_step(item[1])
        else:
            writer.write_file(item[1], item[2])


def read_exact(fd: int, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = os.readv(fd, [view[got:]])
        if chunk == 0:
            return None
        got += chunk
    return buf


def read_message(fd: int) -> tuple[list, bytearray] | None:
    frame = read_exact(fd, FRAME.size)
    if frame is None:
        return None
    head_len, size = FRAME.unpack(frame)
    head = read_exact(fd, head_len)
    payload = read_exact(fd, size) if size else bytearray()
    if head is None or payload is None:
        return None
    return (json.loads(head) if head[:1] == b"[" else expand(head)), payload


_LAST = -1  # give's key, in its table of name lists, of the last item's lists


def give(writer: Writer, header: list, payload: bytearray, names: dict, ring: mmap.mmap | None) -> None:
    offset = 0
    for item in header:
        kind = item[0]
        if kind == "t":
            _, step, mode, mode_step, name, dtype, shape, wall_time, *in_ring = item
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if in_ring:  # copied out: the training process reuses that room once this message is read
                array = np.frombuffer(ring, dtype, count, in_ring[0]).reshape(shape).copy()
            else:
                array = np.frombuffer(payload, dtype, count, offset).reshape(shape)
                offset += count * dtype.itemsize
            writer.write_tensor(step, ModeKeys(mode), mode_step, name, array, wall_time)
        elif kind == "o":
            _, step, mode, mode_step, name, shape, kinds, wall_time = item
            elements = []
            for which, size in kinds:
                chunk = bytes(payload[offset : offset + size])
                offset += size
                elements.append(chunk.decode("utf-8", "surrogatepass") if which == "s" else chunk)
            array = np.empty(len(elements), dtype=object)
            array[:] = elements
            writer.write_tensor(step, ModeKeys(mode), mode_step, name, array.reshape(shape), wall_time)
        elif kind == "s":
            _, step, mode, mode_step, ids, new, dtypes, sizes, wall_time = item
            names.update(new)
            if ids is not None:  # (None: the lists of the last item, the same objects again)
                names[_LAST] = [names[i] for i in ids]
            rows = names[_LAST]
            if isinstance(sizes, int):  # a [results, reductions] matrix
                values = np.frombuffer(payload, np.dtype(dtypes), len(rows) * sizes, offset)
                values = values.reshape(len(rows), sizes)
                offset += values.nbytes
            else:
                values = []
                for dtype, size in zip([dtypes] * len(sizes) if isinstance(dtypes, str) else dtypes, sizes):
                    dtype = np.dtype(dtype)
                    values.append(np.frombuffer(payload, dtype, size, offset))
                    offset += size * dtype.itemsize
            writer.write_scalars(step, ModeKeys(mode), mode_step, rows, values, wall_time)
        elif kind == "r":  # the training process's table started over
            names.clear()
        elif kind == "h":
            writer.write_shape(item[1], ModeKeys(item[2]), item[3], item[4], item[5])
        elif kind == "e":
            writer.end_step(item[1])
        elif kind == "f":
            writer.write_file(item[1], bytes(payload[offset : offset + item[2]]))
            offset += item[2]


def write_all(fd: int, parts: list, nbytes: int = -1) -> None:
    """Write every part to the child's pipe; Gone when the child exited. While the child's queue is full
    the pipe takes nothing and training waits, as for the thread writer: nothing is dropped. ``nbytes``,
    the parts' size when the caller knows it: a write that takes them all at once is the whole call."""
    written = _writev(fd, parts) if 0 <= nbytes and len(parts) <= _IOV_MAX else 0
    if written == nbytes:
        return
    views = [view.cast("B") for view in map(memoryview, parts) if view.nbytes]
    while True:
        while written:  # a signal may end a write part way
            if written >= views[0].nbytes:
                written -= views.pop(0).nbytes
            else:
                views[0] = views[0][written:]
                written = 0
        if not views:
            return
        written = _writev(fd, views[:_IOV_MAX])


def _writev(fd: int, parts: list) -> int:
    try:
        return os.writev(fd, parts)
    except OSError as exc:  # BrokenPipeError: the child exited
        raise Gone(f"it stopped reading ({type(exc).__name__})") from None
