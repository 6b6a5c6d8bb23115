"""A bounded reader for pickles of plain values (Flight Recorder dumps), never `pickle.load`.

A pickle is a program for a small stack machine. `load` runs the subset of it that builds plain
values only (dict, list, tuple, set, str, bytes, int, float, bool, None), in Python, and refuses
every opcode that imports, calls or builds an object (globals, REDUCE, BUILD, persistent ids,
extension codes, out-of-band buffers). It also bounds what the program may build, as it builds it,
because a few bytes of pickle can ask for gigabytes: the memo is a dict (CPython's unpickler sizes
an array by the largest memo index a pickle names), the objects pushed and the opcodes run are
counted, and every container carries the size and depth it has *expanded*, counting a shared
reference at the full size of what it points to, so a value that would print or traverse as
gigabytes is refused while it is being put together. A container may not change once it is inside
another one (no pickler of plain values does that; it is how a shared reference would grow after
being counted), and it may not contain itself.

The bounds are a `Bounds` value; `PickleRefused` says which one was passed or which opcode was met.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from hypocenter.errors import InputError

_CONTAINERS = (list, dict, set, tuple, frozenset)
_MISSING = object()
_NEW = 1 << 8 | 1 << 1  # a new container's entry: expanded size 1, depth 1, not sealed
_CONTAINER_TYPES = frozenset(_CONTAINERS)


class PickleRefused(InputError, ValueError):
    """A pickle that is not plain values within the bounds; the message says why."""


@dataclass(frozen=True)
class Bounds:
    """What one pickle may build. `expanded` counts a str/bytes by its length, an int by its bytes,
    anything else as 1, and a container as 1 + its members' expanded sizes."""

    objects: int
    opcodes: int
    expanded: int
    depth: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.depth < 0x7F:
            raise ValueError("depth is kept in 7 bits: 1 to 126")


_REFUSED = {
    b"c": "global",
    b"\x93": "global",
    b"i": "instance",
    b"o": "object",
    b"\x81": "object",
    b"\x92": "object",
    b"R": "call (REDUCE)",
    b"b": "state (BUILD)",
    b"P": "persistent id",
    b"Q": "persistent id",
    b"\x82": "extension code",
    b"\x83": "extension code",
    b"\x84": "extension code",
    b"\x97": "out-of-band buffer",
    b"\x98": "out-of-band buffer",
}


class _Machine:
    """One run of a pickle program within `Bounds` (see the module docstring)."""

    def __init__(self, raw: bytes, bounds: Bounds) -> None:
        self.raw = raw
        self.pos = 0
        self.bounds = bounds
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.objects = 0
        # id(container) -> expanded size << 8 | depth << 1 | sealed, one int (a pickle may build
        # millions of containers); every container is entered when it is made, so an id that a
        # freed container leaves to a new one is entered again.
        self.sizes: dict[int, int] = {}

    # ---------------------------------------------------------------- reading the program
    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.raw):
            raise PickleRefused("truncated pickle (an opcode's argument runs past the end)")
        out = self.raw[self.pos : end]
        self.pos = end
        return out

    def line(self) -> bytes:
        end = self.raw.find(b"\n", self.pos)
        if end < 0 or end - self.pos > 4096:
            raise PickleRefused("truncated pickle (a text argument has no end of line)")
        out = self.raw[self.pos : end]
        self.pos = end + 1
        return out

    def u(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    # ---------------------------------------------------------------- accounting
    def push(self, value: Any) -> None:
        self.objects += 1
        if self.objects > self.bounds.objects:
            raise PickleRefused(f"builds more than {self.bounds.objects:,} values")
        self.stack.append(value)

    def new(self, container: Any) -> None:
        self.sizes[id(container)] = _NEW
        self.push(container)

    def grow(self, container: Any, members: list[Any] | tuple[Any, ...]) -> None:
        """Account for `members` going into `container`; they are sealed from now on."""
        sizes = self.sizes
        info = sizes.get(id(container))
        if info is None:
            raise PickleRefused("adds members to something that is not a container")
        if info & 1:
            raise PickleRefused("changes a container after it was put into another one")
        size, depth = info >> 8, info >> 1 & 0x7F
        for m in members:
            kind = type(m)
            if kind is str or kind is bytes:
                size += len(m) + 1
            elif kind is int:
                size += m.bit_length() // 8 + 1
            elif kind in _CONTAINER_TYPES:
                if m is container:
                    raise PickleRefused("a container that contains itself")
                inner = sizes[id(m)]
                size += inner >> 8
                if inner >> 1 & 0x7F >= depth:
                    depth = (inner >> 1 & 0x7F) + 1
                sizes[id(m)] = inner | 1
            else:
                size += 1
        if size > self.bounds.expanded:
            raise PickleRefused(
                f"expands to more than {self.bounds.expanded:,} values and bytes (shared references "
                "counted at their full size)"
            )
        if depth > self.bounds.depth:
            raise PickleRefused(f"nests deeper than {self.bounds.depth} levels")
        sizes[id(container)] = size << 8 | depth << 1

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise PickleRefused("damaged pickle (no MARK on the stack)")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def top(self) -> Any:
        if not self.stack:
            raise PickleRefused("damaged pickle (the stack is empty)")
        return self.stack[-1]

    def pop(self) -> Any:
        if not self.stack:
            raise PickleRefused("damaged pickle (the stack is empty)")
        return self.stack.pop()

    def sealed_tuple(self, items: list[Any]) -> None:
        t = tuple(items)
        self.sizes[id(t)] = _NEW
        self.grow(t, items)
        self.push(t)

    def text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise PickleRefused("a string that is not UTF-8") from None

    def put(self, index: int) -> None:
        if index not in self.memo and len(self.memo) >= self.bounds.objects:
            raise PickleRefused(f"memoises more than {self.bounds.objects:,} values")
        self.memo[index] = self.top()

    def get(self, index: int) -> None:
        try:
            value = self.memo[index]
        except KeyError:
            raise PickleRefused(f"damaged pickle (memo entry {index} was never stored)") from None
        self.push(value)

    # ---------------------------------------------------------------- running it
    def run(self) -> Any:
        """The pickle's value. The opcodes a dump is made of run inline, with the machine's state in
        locals (a dump is mostly these); the rest go through `step`."""
        raw, end = self.raw, len(self.raw)
        stack, memo = self.stack, self.memo
        push = stack.append
        max_objects, max_opcodes = self.bounds.objects, self.bounds.opcodes
        pos = self.pos
        opcodes = 0
        while True:
            opcodes += 1
            if opcodes > max_opcodes:
                raise PickleRefused(f"runs more than {max_opcodes:,} opcodes")
            if pos >= end:
                raise PickleRefused("truncated pickle (no STOP)")
            op = raw[pos]
            if op == 0x68 and pos + 1 < end:  # BINGET
                value = memo.get(raw[pos + 1], _MISSING)
                if value is _MISSING:
                    raise PickleRefused(f"damaged pickle (memo entry {raw[pos + 1]} was never stored)")
                push(value)
                self.objects += 1
                pos += 2
            elif op == 0x71 and pos + 1 < end and stack:  # BINPUT
                if raw[pos + 1] not in memo and len(memo) >= max_objects:
                    raise PickleRefused(f"memoises more than {max_objects:,} values")
                memo[raw[pos + 1]] = stack[-1]
                pos += 2
            elif op == 0x58 and pos + 5 <= end:  # BINUNICODE
                stop = pos + 5 + int.from_bytes(raw[pos + 1 : pos + 5], "little")
                if stop > end:
                    raise PickleRefused("truncated pickle (an opcode's argument runs past the end)")
                push(raw[pos + 5 : stop].decode("utf-8", "surrogatepass"))
                self.objects += 1
                pos = stop
            elif op == 0x28:  # MARK
                self.marks.append(len(stack))
                pos += 1
            elif op == 0x4B and pos + 1 < end:  # BININT1
                push(raw[pos + 1])
                self.objects += 1
                pos += 2
            elif op == 0x4E:  # NONE
                push(None)
                self.objects += 1
                pos += 1
            elif op == 0x8C and pos + 1 < end:  # SHORT_BINUNICODE
                stop = pos + 2 + raw[pos + 1]
                if stop > end:
                    raise PickleRefused("truncated pickle (an opcode's argument runs past the end)")
                push(raw[pos + 2 : stop].decode("utf-8", "surrogatepass"))
                self.objects += 1
                pos = stop
            elif op == 0x6A and pos + 5 <= end:  # LONG_BINGET
                index = int.from_bytes(raw[pos + 1 : pos + 5], "little")
                value = memo.get(index, _MISSING)
                if value is _MISSING:
                    raise PickleRefused(f"damaged pickle (memo entry {index} was never stored)")
                push(value)
                self.objects += 1
                pos += 5
            elif op == 0x72 and pos + 5 <= end and stack:  # LONG_BINPUT
                index = int.from_bytes(raw[pos + 1 : pos + 5], "little")
                if index not in memo and len(memo) >= max_objects:
                    raise PickleRefused(f"memoises more than {max_objects:,} values")
                memo[index] = stack[-1]
                pos += 5
            elif op == 0x5D or op == 0x7D:  # EMPTY_LIST, EMPTY_DICT
                container: Any = [] if op == 0x5D else {}
                self.sizes[id(container)] = _NEW
                push(container)
                self.objects += 1
                pos += 1
            elif op == 0x4D and pos + 2 < end:  # BININT2
                push(raw[pos + 1] | raw[pos + 2] << 8)
                self.objects += 1
                pos += 3
            else:
                self.pos = pos
                done, value = self.step()
                if done:
                    return value
                pos = self.pos
            if self.objects > max_objects:
                raise PickleRefused(f"builds more than {max_objects:,} values")

    def step(self) -> tuple[bool, Any]:
        """Run the opcode at `pos`: (True, the value) at STOP, else (False, None)."""
        raw = self.raw
        op = raw[self.pos : self.pos + 1]
        self.pos += 1
        if op == b"h":  # BINGET
            self.get(self.u(1))
        elif op == b"q":  # BINPUT
            self.put(self.u(1))
        elif op == b"X":  # BINUNICODE
            self.push(self.text(self.take(self.u(4))))
        elif op == b"\x8c":  # SHORT_BINUNICODE
            self.push(self.text(self.take(self.u(1))))
        elif op == b"(":  # MARK
            self.marks.append(len(self.stack))
        elif op == b"K":  # BININT1
            self.push(self.u(1))
        elif op == b"M":  # BININT2
            self.push(self.u(2))
        elif op == b"J":  # BININT
            self.push(int.from_bytes(self.take(4), "little", signed=True))
        elif op == b"]":  # EMPTY_LIST
            self.new([])
        elif op == b"}":  # EMPTY_DICT
            self.new({})
        elif op == b"e":  # APPENDS
            items = self.pop_mark()
            target = self.top()
            if not isinstance(target, list):
                raise PickleRefused("APPENDS to something that is not a list")
            self.grow(target, items)
            target.extend(items)
        elif op == b"a":  # APPEND
            item = self.pop()
            target = self.top()
            if not isinstance(target, list):
                raise PickleRefused("APPEND to something that is not a list")
            self.grow(target, (item,))
            target.append(item)
        elif op in (b"u", b"s"):  # SETITEMS, SETITEM
            items = self.pop_mark() if op == b"u" else [self.pop(), self.pop()][::-1]
            target = self.top()
            if not isinstance(target, dict) or len(items) % 2:
                raise PickleRefused("SETITEMS to something that is not a dict")
            self.grow(target, items)
            for k in range(0, len(items), 2):
                target[items[k]] = items[k + 1]
        elif op == b"N":
            self.push(None)
        elif op == b"\x88":
            self.push(True)
        elif op == b"\x89":
            self.push(False)
        elif op == b")":  # EMPTY_TUPLE
            self.sealed_tuple([])
        elif op in (b"\x85", b"\x86", b"\x87"):  # TUPLE1..3
            n = op[0] - 0x84
            if len(self.stack) - (self.marks[-1] if self.marks else 0) < n:
                raise PickleRefused("damaged pickle (the stack is short)")
            items = self.stack[-n:]
            del self.stack[-n:]
            self.sealed_tuple(items)
        elif op == b"t":  # TUPLE
            items = self.pop_mark()
            self.sealed_tuple(items)
        elif op == b"l" or op == b"d":  # LIST, DICT
            items = self.pop_mark()
            if op == b"d" and len(items) % 2:
                raise PickleRefused("damaged pickle (DICT with an odd number of items)")
            c: Any = [] if op == b"l" else {}
            self.new(c)
            self.grow(c, items)
            if op == b"l":
                c.extend(items)
            else:
                for k in range(0, len(items), 2):
                    c[items[k]] = items[k + 1]
        elif op == b"\x8f":  # EMPTY_SET
            self.new(set())
        elif op == b"\x90":  # ADDITEMS
            items = self.pop_mark()
            target = self.top()
            if not isinstance(target, set):
                raise PickleRefused("ADDITEMS to something that is not a set")
            self.grow(target, items)
            target.update(items)
        elif op == b"\x91":  # FROZENSET
            items = self.pop_mark()
            fs = frozenset(items)
            self.sizes[id(fs)] = _NEW
            self.grow(fs, items)
            self.push(fs)
        elif op == b"r":  # LONG_BINPUT
            self.put(self.u(4))
        elif op == b"j":  # LONG_BINGET
            self.get(self.u(4))
        elif op == b"\x94":  # MEMOIZE
            self.put(len(self.memo))
        elif op == b"p":  # PUT
            self.put(self.decimal(self.line()))
        elif op == b"g":  # GET
            self.get(self.decimal(self.line()))
        elif op == b"\x8a":  # LONG1
            self.push(int.from_bytes(self.take(self.u(1)), "little", signed=True))
        elif op == b"\x8b":  # LONG4
            self.push(int.from_bytes(self.take(self.u(4)), "little", signed=True))
        elif op == b"I" or op == b"L":  # INT, LONG (text)
            arg = self.line().rstrip(b"L")
            self.push(True if arg == b"01" else False if arg == b"00" else self.decimal(arg, signed=True))
        elif op == b"G":  # BINFLOAT
            self.push(struct.unpack(">d", self.take(8))[0])
        elif op == b"F":  # FLOAT (text)
            try:
                self.push(float(self.line()))
            except ValueError:
                raise PickleRefused("damaged pickle (FLOAT that is not a number)") from None
        elif op == b"\x8d":  # BINUNICODE8
            self.push(self.text(self.take(self.u(8))))
        elif op == b"V":  # UNICODE (protocol 0)
            try:
                self.push(self.line().decode("raw-unicode-escape"))
            except UnicodeDecodeError:
                raise PickleRefused("damaged pickle (UNICODE that does not decode)") from None
        elif op == b"C":  # SHORT_BINBYTES
            self.push(self.take(self.u(1)))
        elif op == b"B":  # BINBYTES
            self.push(self.take(self.u(4)))
        elif op in (b"\x8e", b"\x96"):  # BINBYTES8, BYTEARRAY8 (read as bytes)
            self.push(self.take(self.u(8)))
        elif op == b"0":  # POP
            if self.marks and self.marks[-1] == len(self.stack):
                self.marks.pop()
            else:
                self.pop()
        elif op == b"1":  # POP_MARK
            self.pop_mark()
        elif op == b"2":  # DUP
            self.push(self.top())
        elif op == b"\x80":  # PROTO
            if self.u(1) > 5:
                raise PickleRefused("pickle protocol above 5")
        elif op == b"\x95":  # FRAME (a hint for buffered readers)
            self.take(8)
        elif op == b".":  # STOP
            if len(self.stack) != 1 or self.marks:
                raise PickleRefused("damaged pickle (STOP with more than one value left)")
            return True, self.stack[0]
        elif op in _REFUSED:
            what = _REFUSED[op]
            if op == b"c":
                module, name = self.line(), self.line()
                what = f"global {module.decode('ascii', 'replace')}.{name.decode('ascii', 'replace')}"
            raise PickleRefused(f"refused {what}: a Flight Recorder dump holds plain values only")
        else:
            raise PickleRefused(f"refused opcode {op!r} at byte {self.pos - 1}")
        return False, None

    @staticmethod
    def decimal(arg: bytes, *, signed: bool = False) -> int:
        text = arg.strip()
        if not 0 < len(text) <= 20 or not (text.lstrip(b"-") if signed else text).isdigit():
            raise PickleRefused(f"damaged pickle (not a number: {arg[:40]!r})")
        return int(text)


def load(raw: bytes, bounds: Bounds) -> Any:
    """The value a pickle of plain values builds; PickleRefused when it is not one, or is over `bounds`."""
    try:
        return _Machine(raw, bounds).run()
    except TypeError as exc:  # a list or dict as a dict key or set member
        raise PickleRefused(f"damaged pickle ({exc})") from None
    except UnicodeDecodeError:
        raise PickleRefused("a string that is not UTF-8") from None
