"""Hostile custom templates (issue 31): rendering a colleague's sweep must run nothing, read
nothing outside the sweep's folder, and a template that extends itself is one line, not a
traceback. All through ``flm sweep render`` / ``submit --dry-run``, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import one_line_refusal as _one_line_refusal
from sweep_texts import local_sweep

from frontier_llm.cli import main


def _sweep(folder: Path, template: str, *, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    path = folder / "sweep.yaml"
    path.write_text(
        local_sweep("tpl", ["{dp: 1, micro_batch: 2, name: one}"], f"template: {template}\n")
    )
    return path



@pytest.mark.parametrize("command", [["render", "--out"], ["submit", "--dry-run", "--out"]])
def test_the_globals_escape_is_refused_and_runs_nothing(tmp_path, capsys, command):
    marker = tmp_path / "pwned"
    evil = (
        '{% extends "local.sh.j2" %}\n{% block system_env %}'
        f"{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}"
        "{% endblock %}\n"
    )
    path = _sweep(tmp_path / "s", "evil.sh.j2", files={"evil.sh.j2": evil})
    out = tmp_path / "run"
    _one_line_refusal(
        capsys,
        ["sweep", command[0], str(path), *command[1:], str(out)],
        "refused by the template sandbox",
    )
    assert not marker.exists()
    assert not out.exists()  # rendered before anything is written


def test_a_parent_outside_the_folder_is_refused(tmp_path, capsys):
    (tmp_path / "parent.sh.j2").write_text("#!/bin/bash\n# the parent's secret\n")
    path = _sweep(
        tmp_path / "s", "child.sh.j2", files={"child.sh.j2": '{% extends "../parent.sh.j2" %}\n'}
    )
    _one_line_refusal(
        capsys,
        ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
        "nor a file in its own folder",
    )


def test_a_template_outside_the_sweeps_folder_is_refused(tmp_path, capsys):
    (tmp_path / "other.sh.j2").write_text('{% extends "local.sh.j2" %}\n')
    path = _sweep(tmp_path / "s", "../other.sh.j2", files={})
    _one_line_refusal(
        capsys,
        ["sweep", "render", str(path), "--out", str(tmp_path / "run")],
        "lies outside the sweep file's folder",
    )


@pytest.mark.parametrize(
    "files,words",
    [
        ({"self.sh.j2": '{% extends "self.sh.j2" %}\n'}, "self.sh.j2 -> self.sh.j2): a cycle"),
        (
            {"self.sh.j2": '{% extends "b.sh.j2" %}\n', "b.sh.j2": '{% extends "self.sh.j2" %}\n'},
            "self.sh.j2 -> b.sh.j2 -> self.sh.j2): a cycle",
        ),
        (
            {
                "self.sh.j2": '{% extends "local.sh.j2" %}{% block system_env %}'
                '{% include "inc.sh.j2" %}{% endblock %}\n',
                "inc.sh.j2": '{% include "inc.sh.j2" %}\n',
            },
            "includes or calls itself without end",
        ),
    ],
)
def test_cyclic_templates_are_one_line(tmp_path, capsys, files, words):
    path = _sweep(tmp_path / "s", "self.sh.j2", files=files)
    _one_line_refusal(capsys, ["sweep", "render", str(path), "--out", str(tmp_path / "run")], words)


def test_a_custom_template_still_renders(tmp_path, capsys):
    path = _sweep(
        tmp_path / "s",
        "tpl/mine.sh.j2",
        files={
            "tpl/mine.sh.j2": '{% extends "local.sh.j2" %}{% block system_env %}{{ super() }}'
            "export MINE={{ job.sweep | q }}\n{% endblock %}\n"
        },
    )
    assert main(["sweep", "render", str(path), "--out", str(tmp_path / "run")]) == 0
    [script] = (tmp_path / "run" / "scripts").iterdir()
    assert "export MINE=tpl\n" in script.read_text()
