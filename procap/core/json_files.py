"""The one reader of the JSON (and YAML) the package reads: files, metadata strings, log lines.

Python's ``json`` keeps the last of two values given under one key, and PyYAML does the same, so a config naming
``steps`` twice, a caption file naming an image twice or checkpoint metadata naming ``stage`` twice would be read
with one of the values silently dropped. Every reader here refuses such an object with one sentence naming the
source and the key; a malformed text is one sentence too. Writes go through :mod:`procap.core.files`.

Sizes are bounded before memory is taken: a file over :data:`MAX_TEXT_BYTES` is refused from its size, before a
byte is read (Python's parser takes several times a file's size in objects), and nesting deeper than the parser's
recursion allows is one sentence, not a ``RecursionError``. :func:`read_bytes` is the bounded read for every JSON,
JSON-lines and YAML file the package reads (data files, config files, logs, pair lists, caption files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable
from types import ModuleType
from typing import Any

from procap.core.errors import ProCapError, shown
from procap.core.validate import input_file

# The largest JSON / YAML / JSON-lines file the package reads: well above the largest real one (the authors' score
# files and the datasets' caption files are tens of MB), and far below what parsing it would take (about ten times
# its size in Python objects).
MAX_TEXT_BYTES = 1 << 30


class DuplicateKeyError(ProCapError):
    """A JSON object or YAML mapping names ``key`` twice; the message names the source and the key."""

    def __init__(self, source: str, key: object) -> None:
        super().__init__(f"{source} names the key {shown(key)} twice; each key may appear once.")
        self.key = key


class _RepeatedKey(ValueError):
    """Raised inside the parser, where the source is not known; turned into a :class:`DuplicateKeyError`."""

    def __init__(self, key: object) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing an object that names a key twice."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen[key] = value
    return seen


def decode_text(data: bytes, source: str) -> str:
    """``data`` read as UTF-8 (a byte-order mark dropped), or refused: never altered.

    Decoding with ``errors="replace"`` turned a config's byte that is no UTF-8 into U+FFFD without a word, so the
    run used a value the file does not hold.

    Raises:
        ProCapError: naming ``source`` and the first byte that is not UTF-8, with its position.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProCapError(
            f"{source} is not UTF-8 text (byte 0x{data[exc.start]:02x} at position {exc.start:,}); save it as UTF-8."
        ) from None


def parse_json(text: str | bytes, source: str) -> Any:
    """Parse JSON ``text``; ``source`` says in messages where it came from (``"checkpoint file x.safetensors"``).

    Bytes are read as UTF-8 (:func:`decode_text`), or as UTF-16 / UTF-32 where their first bytes say so, as JSON
    allows.

    Raises:
        DuplicateKeyError: an object names a key twice.
        ProCapError: the text is not JSON, not UTF-8 (or nests too deeply to parse).
    """
    if isinstance(text, (bytes, bytearray)) and json.detect_encoding(text).startswith("utf-8"):
        text = decode_text(bytes(text), source)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _RepeatedKey as exc:
        raise DuplicateKeyError(source, exc.key) from None
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise ProCapError(f"{source} is not valid JSON ({exc}).") from None
    except RecursionError:
        raise ProCapError(f"{source} is nested too deeply to be read as JSON.") from None


def read_bytes(path: str | os.PathLike, what: str, limit: int | None = None) -> bytes:
    """The bytes of the text file ``path``, refused from its size when over ``limit`` (:data:`MAX_TEXT_BYTES`).

    The size is checked before anything is read, and the read stops one byte past the limit (a file that grows
    meanwhile is refused too). Messages name the file as ``f"{what} {path}"``.

    Raises:
        ProCapError: the file is missing, a folder, unreadable or larger than the limit.
    """
    limit = MAX_TEXT_BYTES if limit is None else limit
    path = input_file(path, what)
    try:
        size = path.stat().st_size
        if size <= limit:
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
            size = max(size, len(data))
    except OSError as exc:
        raise ProCapError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None
    if size > limit:
        raise ProCapError(
            f"{what} {path} holds {size:,} bytes, more than the {limit:,} a file read as JSON or YAML may have; "
            "is it the right file?"
        )
    return data


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Parse the JSON file ``path``; messages name it as ``f"{what} {path}"``.

    Raises:
        ProCapError: the file is missing, a folder, unreadable, larger than :data:`MAX_TEXT_BYTES`, not JSON, or
            an object in it names a key twice.
    """
    path = input_file(path, what)
    return parse_json(read_bytes(path, what), f"{what} {path}")


def json_lines(text: str, source: str, skip_unparsed: bool = False) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of JSON Lines ``text``, numbered from 1; messages name a line
    as ``f"{source} line {number}"``. The one JSON Lines parser: pair lists, caption files and training logs.

    Args:
        skip_unparsed: drop the lines that are not JSON instead of refusing them (a log another process is
            appending to, or one a stopped run left, may end in a cut line).

    Raises:
        ProCapError: a line that is not JSON (without ``skip_unparsed``), or an object naming a key twice.
    """
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append((number, parse_json(line, f"{source} line {number}")))
        except ProCapError:
            if not skip_unparsed:
                raise
    return values


def read_json_lines(path: str | os.PathLike, what: str, partial: bool = False) -> list[Any]:
    """The values of the JSON Lines file ``path``, one a line; a file not yet written holds none. Training's
    ``log.jsonl`` is read here alone: by the run that resumes it, the demo's report and its progress line.

    Args:
        what: how messages name the file (``f"{what} {path}"``).
        partial: the file may be being written or may have been cut: lines that are not JSON (or not UTF-8)
            are skipped rather than refused.

    Raises:
        ProCapError: without ``partial``, a line that is not JSON or text that is not UTF-8; a file that cannot be
            read or is larger than :data:`MAX_TEXT_BYTES`.
    """
    if not os.path.isfile(path):
        return []
    data = read_bytes(path, what)
    try:
        text = data.decode("utf-8", errors="replace" if partial else "strict")
    except UnicodeDecodeError as exc:
        raise ProCapError(f"{what} {path} is not UTF-8 text ({exc}).") from None
    return [value for _, value in json_lines(text, f"{what} {path}", skip_unparsed=partial)]


# The values YAML aliases may add to a document: far above a config's merges (`<<: *base` of a few keys), far below
# what a few bytes of nested aliases stand for (a 1 KB "billion laughs" file: 10**9 values).
MAX_ALIAS_VALUES = 10_000


def _refuse_alias_bombs(root: Any, source: str) -> None:
    """Count the values of a composed YAML document as its aliases expand it, without expanding it (each node's
    count is kept), and refuse one that aliases add more than :data:`MAX_ALIAS_VALUES` to, or that contains itself.

    PyYAML builds an aliased value once and shares it, but anything that walks the value (a message formatting it,
    a copy) walks every alias: a 1 KB file grew without end in a message naming its value.
    """
    counts: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(node: Any) -> int:
        key = id(node)
        if key in counts:
            return counts[key]
        if key in open_nodes:
            raise ProCapError(f"{source} holds a YAML alias inside the value it names; write the value out.")
        open_nodes.add(key)
        children = node.value if isinstance(node.value, list) else []  # scalars hold text
        # a mapping's entries are (key, value) pairs of nodes
        total = 1 + sum(count(n) for child in children for n in (child if isinstance(child, tuple) else (child,)))
        open_nodes.discard(key)
        counts[key] = total
        return total

    if count(root) - len(counts) > MAX_ALIAS_VALUES:
        raise ProCapError(
            f"{source} uses YAML aliases that add more than {MAX_ALIAS_VALUES:,} values to it (a small file standing "
            "for a huge one); write the values out instead."
        )


def parse_yaml(text: str | bytes, source: str) -> Any:
    """Parse YAML ``text`` (safe types only) under the same rule: a mapping naming a key twice is refused.

    Bytes are read as UTF-8 (:func:`decode_text`).

    Raises:
        DuplicateKeyError: a mapping names a key twice.
        ProCapError: PyYAML is missing (the ``[train]`` extra names it), the text is not UTF-8 or not YAML, or its
            aliases expand it beyond :data:`MAX_ALIAS_VALUES` (:func:`_refuse_alias_bombs`).
    """
    from procap.core.extras import require

    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), source)

    yaml = require("yaml", f"reading {source}")
    try:
        return yaml.load(text, Loader=_unique_key_loader(yaml, source))  # a SafeLoader subclass: safe types only
    except yaml.YAMLError as exc:
        raise ProCapError(f"{source} is not readable YAML ({' '.join(str(exc).split())}).") from None
    except RecursionError:
        raise ProCapError(f"{source} is nested too deeply to be read as YAML.") from None


def _unique_key_loader(yaml: ModuleType, source: str) -> type:
    """PyYAML's SafeLoader refusing what :func:`parse_yaml` refuses, naming ``source`` in its errors."""
    safe_loader: Any = yaml.SafeLoader  # PyYAML ships no type information: to mypy its classes are Any

    class UniqueKeyLoader(safe_loader):
        """SafeLoader whose mappings refuse a repeated key (PyYAML has no such option)."""

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden, as YAML means
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if isinstance(key, Hashable) and key in seen:
                        raise DuplicateKeyError(source, key)
                    if isinstance(key, Hashable):
                        seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_document(self, node):
            _refuse_alias_bombs(node, source)  # before a value is built
            return super().construct_document(node)

    return UniqueKeyLoader
