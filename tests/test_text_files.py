"""A file that is not text, passed where a YAML model, system or sweep is expected, ends in one
line naming the file and exit code 2, never a traceback."""

from __future__ import annotations

import os

import pytest

from frontier_llm.cli import main

CONTENTS = {
    "binary": os.urandom(4096),  # what a wrong path to a checkpoint looks like
    "latin1": "name: caf\xe9\nlayers: 2\n".encode("latin-1"),  # invalid UTF-8
    "nul": b"name: x\n\x00\x01\x02",  # valid UTF-8, but characters YAML refuses
}
COMMANDS = {
    "model": ["plan", "--gpus", "8", "--model"],
    "system": ["plan", "--gpus", "8", "--system"],
    "sweep": ["sweep", "render", "--out", "OUT"],
}


@pytest.mark.parametrize("kind", sorted(CONTENTS))
@pytest.mark.parametrize("where", sorted(COMMANDS))
def test_a_non_text_file_is_one_line_and_exit_2(tmp_path, capsys, kind, where):
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(b"\xe0\x80" + CONTENTS[kind] if kind == "binary" else CONTENTS[kind])
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in COMMANDS[where]]
    argv = [*argv, str(path)] if where != "sweep" else [*argv[:2], str(path), *argv[2:]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "Traceback" not in err[0]
    assert "not a text file" in err[0] or "not YAML text" in err[0]
    assert not (tmp_path / "out").exists()
