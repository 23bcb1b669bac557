"""How a test says that a command refused bad input the way flm promises: exit 2, nothing on
stdout, one line on stderr, no traceback, naming what was wrong."""

from __future__ import annotations

from frontier_llm.cli import main


def one_line_refusal(capsys, argv: list[str], words: str) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert words in err, err
    return err
