"""YAML loading that remembers where each key stands, so errors can name file, line, field."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from frontier_llm.errors import SpecError

# The most nodes a YAML file may hold once its aliases are expanded. An alias names a node
# again without copying it, so a 1 KB file of aliases of aliases stands for billions of values,
# and anything that walks the data (the secret check, a sweep's expansion) would run for
# ever. A sweep of thousands of layouts holds tens of thousands of nodes.
MAX_NODES = 200_000
# The largest YAML file read (a sweep, a study, a system): far above any real one.
MAX_FILE_BYTES = 16 * 2**20


class LineMap(dict):
    """A mapping from a YAML file that knows the line of each of its keys (1-based)."""

    source: str = "<string>"
    start_line: int = 0
    key_lines: dict[str, int]

    def copy(self) -> LineMap:
        out = LineMap(self)
        out.source, out.start_line = self.source, self.start_line
        out.key_lines = dict(self.key_lines)
        return out

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.start_line)

    def where(self, key: str | None = None) -> str:
        line = self.line_of(key) if key is not None else self.start_line
        return f"{self.source}:{line}"


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    out = LineMap()
    out.key_lines = {}
    out.source = loader.name
    out.start_line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise SpecError(f"{loader.name}:{key_node.start_mark.line + 1}: duplicate key '{key}'")
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[str(key)] = key_node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file; mappings come back as :class:`LineMap`; errors name file and line."""
    path = Path(path)
    return loads_yaml(read_text_file(path), source=str(path))


def read_text_file(path: Path) -> str:
    """The file's UTF-8 text; a missing, unreadable or non-text file is one SpecError line."""
    try:
        data = _read_regular(path)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not a text file (invalid UTF-8 at byte {exc.start}); "
                        "expected YAML") from None


def _read_regular(path: Path) -> bytes:
    """A regular file's bytes, at most :data:`MAX_FILE_BYTES`: ``/dev/zero`` or a FIFO given
    as a sweep file would otherwise be read until memory runs out, or forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpecError(f"cannot read {path}: not a regular file")
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"cannot read {path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
    return data


def loads_yaml(text: str, source: str = "<string>") -> Any:
    try:
        # The reader checks the characters as it is built: a NUL byte fails here already.
        loader = _LineLoader(text)
    except yaml.reader.ReaderError as exc:
        raise SpecError(f"{source}: not YAML text: {exc.reason} (character "
                        f"#x{exc.character:04x} at position {exc.position})") from None
    loader.name = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, source)
        return loader.construct_document(node)
    except RecursionError:
        # Nesting thousands deep ([[[[...]]]]): the composer recurses per level.
        raise SpecError(f"{source}: invalid YAML: nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.context_mark and exc.problem:
            # An unclosed bracket is detected at the end of the file; say where it opened.
            problem += f" ({exc.context} started at line {exc.context_mark.line + 1})"
        raise SpecError(f"{source}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a document whose nodes, aliases expanded, exceed :data:`MAX_NODES`, or whose
    aliases make a cycle (``x: &r {self: *r}``, which expands without end): counted without
    expanding them (each node's size once, from its children's), in time linear in the file."""
    size: dict[int, int] = {}
    # Nodes whose children are being counted: meeting one of them again below itself is a
    # cycle, which the count would otherwise chase for ever, its stack growing.
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            size[id(node)] = 1
            continue
        if children_done:
            open_nodes.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
            if size[id(node)] > MAX_NODES:
                raise SpecError(f"{source}: more than {MAX_NODES} YAML values once its aliases "
                                "are expanded (an alias bomb?); refused before reading it")
            continue
        if id(node) in size:
            continue
        if id(node) in open_nodes:
            raise SpecError(f"{source}:{node.start_mark.line + 1}: a YAML alias refers to a "
                            "node that holds it (a cycle, which never ends once expanded); "
                            "refused before reading it")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
