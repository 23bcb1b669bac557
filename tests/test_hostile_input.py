"""Careless and hostile input that used to hang or end in a traceback (issue 31): a YAML alias
bomb, deep nesting, odd digits, and OS and database errors, each one line with exit 2."""

from __future__ import annotations

import time

from sweep_texts import local_sweep

from frontier_llm.cli import main


def _one_line(capsys, argv: list[str], words: str) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert words in err, err
    return err


def _bomb(levels: int = 9) -> str:
    """About 1 KB of YAML that stands for 9**levels values once its aliases are expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_in_time(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(local_sweep("bomb", ["{dp: 1, micro_batch: 2, name: one}"],
                                f"labels:\n  {_bomb().replace(chr(10), chr(10) + '  ')}\n"))
    assert len(path.read_bytes()) < 2000
    started = time.monotonic()
    _one_line(capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
              "once its aliases are expanded")
    assert time.monotonic() - started < 5


def test_deep_nesting_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\nlabels: " + "[" * 100_000 + "]" * 100_000 + "\n")
    _one_line(capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
              "nested too deeply")


def test_a_superscript_port_is_refused(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("port", ["{dp: 1, micro_batch: 2, name: one}"],
                                'template_options: {master_port: "²"}\n'))
    _one_line(capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
              "master_port must be a port number")
