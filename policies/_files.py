"""Reading files a user hands us (policy files, plugin configs, space files) without trusting their contents.

Every reader here fails with a one-line message instead of a traceback, a MemoryError or a hang:

- `read_bytes` / `read_text`: a regular file of bounded size, opened without blocking; else one line naming the file.
- `load_yaml_text`: ``yaml.safe_load`` with bounds (an integer of more than 4,300 digits is a located error too).
  YAML aliases (``*name``) repeat an anchored value without
  copying it, so a 445-byte file of nine nested aliases stands for 9^9 = 387 million strings: loading is instant,
  but the first ``repr``, ``json.dumps`` or deep copy of it needed 2 GB and 29 s before a MemoryError. We count the
  size the document has once every alias is written out (nodes plus scalar characters) and refuse it beyond
  `YAML_MAX_EXPANDED`; nesting deeper than `YAML_MAX_DEPTH` is refused before Python's recursion limit is reached.
- `load_json_text` / `decode_json_at`: ``json.loads`` / ``JSONDecoder.raw_decode`` whose two unguarded failures, a
  number of more than 4,300 digits (CPython's int limit, a bare ValueError) and nesting deeper than the recursion
  limit (a RecursionError), become ``json.JSONDecodeError``s located at the offending character.

Every other module that reads YAML or JSON from a user goes through these (autotune imports them from
``policies``), so the bounds hold for every reader.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "JSON_MAX_INT_DIGITS",
    "YAML_MAX_DEPTH",
    "YAML_MAX_EXPANDED",
    "YAMLDocumentError",
    "decode_json_at",
    "load_json_text",
    "load_yaml_text",
    "read_bytes",
    "read_text",
]

#: Largest policy, space, plugin-config or `--config` file read: the biggest real one is a few kB.
MAX_TEXT_BYTES = 8 * 1024 * 1024

#: Largest size a YAML document may have with its aliases written out: nodes + characters of scalar values. The
#: biggest file we ship (the drafter catalog, 19 KB) expands to about 20,000; policy and space files to a few hundred.
#: 1,000,000 keeps any ``repr`` of a loaded value to a few MB while allowing files 50x the catalog.
YAML_MAX_EXPANDED = 1_000_000
#: Deepest nesting of YAML collections. Our formats nest 4 levels; 100 stays far below Python's recursion limit
#: (1,000 frames; the composer uses about 3 per level).
YAML_MAX_DEPTH = 100
#: CPython refuses to convert longer decimal integers (``sys.get_int_max_str_digits()``, 4,300 by default).
JSON_MAX_INT_DIGITS = sys.get_int_max_str_digits() or 4300


def read_bytes(path: str | Path, error: type[Exception], what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most `limit` of them; anything else raises ``error`` with one line
    naming the file: "<path>: cannot read the <what> (<reason>)", not a regular file, or too big.

    The file is opened non-blocking, so a FIFO nobody writes to does not hang us, and checked with ``fstat`` on the
    open descriptor (no race with a swapped path); at most ``limit + 1`` bytes are read, so a file that grows while
    being read (or a device) cannot exhaust memory. `error` is the caller's exception type (`PolicyFileError`,
    `PluginConfigError`, autotune's `ConfigError`, `WorkloadError`): it takes one message.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise error(f"{p}: cannot read the {what} ({exc.strerror or exc}).") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            mode = info.st_mode
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file")
            raise error(f"{p}: the {what} is {kind}, not a regular file; give a file.")
        too_big = f"{p}: the {what} has more than {limit:,} bytes, more than any {what} needs; check the path."
        if info.st_size > limit:
            raise error(too_big)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{p}: cannot read the {what} ({exc.strerror or exc}).") from exc
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(too_big)
    return data


def read_text(path: str | Path, error: type[Exception], what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of ``path`` (`read_bytes`: a regular file of at most `limit` bytes, else ``error``).

    A file that is not UTF-8 raises ``error`` naming the line and column of the first bad byte.
    """
    p = Path(path)
    data = read_bytes(p, error, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{p}:{line}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}: "
            f"{exc.reason}); save it as UTF-8."
        ) from None


# ------------------------------------------------------------------------------------------------------ YAML
class YAMLDocumentError(yaml.YAMLError):
    """A YAML text that is malformed or too big to load safely; the message is one line, with its location."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses collections nested deeper than `YAML_MAX_DEPTH` while composing, and integers
    too long to print."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YAMLDocumentError(
                    f"{_where(mark)}: collections are nested more than {YAML_MAX_DEPTH} levels deep; flatten the file."
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer scalar, refused (located) when Python could not print it: more than `JSON_MAX_INT_DIGITS`
        digits (``int()`` of the text fails), or a hex/octal/binary value as large (it reads, but its first
        ``str()`` in a message fails)."""
        digits = len(node.value.lstrip("+-").replace("_", ""))
        value = super().construct_yaml_int(node) if digits <= JSON_MAX_INT_DIGITS else None
        if value is None or abs(value) >= _INT_LIMIT:
            raise YAMLDocumentError(
                f"{_where(node.start_mark)}: an integer of {digits:,} characters is beyond the "
                f"{JSON_MAX_INT_DIGITS:,} decimal digits Python reads; write a smaller number."
            )
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
#: `_BoundedLoader` reads integers below this (at most `JSON_MAX_INT_DIGITS` decimal digits), so they can be printed.
_INT_LIMIT = 10**JSON_MAX_INT_DIGITS


def _where(mark: Any) -> str:
    return "line ?" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"


def _one_line(exc: yaml.YAMLError) -> str:
    """A PyYAML error as one line, without the source snippet PyYAML appends (it may be a very long line)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        return f"{_where(mark)}: {problem or 'invalid YAML'}"
    return " ".join(str(exc).split())


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """(size of `root` with every alias written out: nodes + scalar characters, number of shared nodes).

    An alias is the same node object appearing again, so sizes are memoised per node; a node that contains itself
    (``&a [*a]``) would expand forever and is refused. Stops counting once past `YAML_MAX_EXPANDED`.
    """
    sizes: dict[int, int] = {}
    shared = 0
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        nonlocal shared
        key = id(node)
        if key in sizes:
            shared += 1
            return sizes[key]
        if key in in_progress:
            raise YAMLDocumentError(
                f"{_where(node.start_mark)}: an alias refers to a collection that contains it, which would expand "
                "forever; write the value out instead."
            )
        if isinstance(node, yaml.ScalarNode):
            total = 1 + len(node.value)
        else:
            in_progress.add(key)
            total = 1
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
            for child in children:
                total += size(child)
                if total > YAML_MAX_EXPANDED:
                    break
            in_progress.discard(key)
        sizes[key] = total
        return total

    return size(root), shared


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load(text)`` within `YAML_MAX_EXPANDED` and `YAML_MAX_DEPTH`.

    Raises `YAMLDocumentError` (a ``yaml.YAMLError``, one line, with the location) for malformed YAML, for a document
    whose aliases expand past the bound (an "alias bomb"), for self-referencing aliases and for deep nesting.
    """
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded, shared = _expanded_size(node)
        if expanded > YAML_MAX_EXPANDED:
            cause = (
                "its aliases (*name) repeat anchored values (an alias bomb?); write the values out or use fewer "
                "aliases"
                if shared
                else "it is too large for a configuration file; split it"
            )
            raise YAMLDocumentError(
                f"line 1, column 1: the document expands to more than {YAML_MAX_EXPANDED:,} values and characters "
                f"from {len(text):,} characters of text: {cause}."
            )
        return loader.construct_document(node)
    except YAMLDocumentError:
        raise
    except yaml.YAMLError as exc:
        raise YAMLDocumentError(_one_line(exc)) from None
    except RecursionError:
        raise YAMLDocumentError(
            "line 1, column 1: the document is nested too deeply to load; flatten the file."
        ) from None
    finally:
        loader.dispose()


# ------------------------------------------------------------------------------------------------------ JSON
def load_json_text(text: str) -> Any:
    """``json.loads(text)``; every failure is a ``json.JSONDecodeError`` located in `text` (see the module doc)."""
    value, end = decode_json_at(text, _skip_whitespace(text, 0))
    end = _skip_whitespace(text, end)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def decode_json_at(text: str, index: int = 0) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode(text, index)``: (value, end index); failures as in `load_json_text`."""
    try:
        return json.JSONDecoder().raw_decode(text, index)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        depth, pos = _deepest(text, index)
        raise json.JSONDecodeError(
            f"Nesting too deep ({depth:,} levels; Python's JSON reader stops near {sys.getrecursionlimit():,})",
            text,
            pos,
        ) from None
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        if "digits" not in str(exc):
            raise json.JSONDecodeError(f"Invalid value ({exc})", text, index) from None
        pos, digits = _longest_number(text, index)
        raise json.JSONDecodeError(
            f"A number has {digits:,} digits (at most {JSON_MAX_INT_DIGITS:,} can be read)", text, pos
        ) from None


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def _outside_strings(text: str, index: int) -> Iterator[tuple[int, str]]:
    """(position, character) of every character of `text` from `index` that is not inside a JSON string."""
    in_string = escaped = False
    for pos in range(index, len(text)):
        ch = text[pos]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        else:
            yield pos, ch


def _deepest(text: str, index: int) -> tuple[int, int]:
    """(deepest nesting reached, position of the bracket that reached it) of the JSON value at `index`."""
    depth = best = 0
    best_pos = index
    for pos, ch in _outside_strings(text, index):
        if ch in "[{":
            depth += 1
            if depth > best:
                best, best_pos = depth, pos
        elif ch in "]}":
            depth -= 1
            if depth <= 0:
                break
    return best, best_pos


def _longest_number(text: str, index: int) -> tuple[int, int]:
    """(position, digit count) of the first run of more than `JSON_MAX_INT_DIGITS` digits outside strings."""
    start = run = 0
    for pos, ch in _outside_strings(text, index):
        if ch.isdigit():
            if run == 0:
                start = pos
            run += 1
        else:
            if run > JSON_MAX_INT_DIGITS:
                return start, run
            run = 0
    return (start, run) if run > JSON_MAX_INT_DIGITS else (index, 0)
