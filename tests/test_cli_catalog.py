"""The flm entry point: help, catalog listings, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from frontier_llm.cli import main


def test_models_table_lists_catalog(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gpt-1t" in out and "llama3-405b" in out and "1.01T" in out


def test_systems_json(capsys):
    assert main(["systems", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    frontier = next(r for r in rows if r["name"] == "frontier")
    assert frontier["gpus_per_node"] == 8
    assert frontier["memory_gb"] == pytest.approx(64 * 2**30 / 1e9)  # a GCD's 64 GiB


def test_every_command_help_has_an_example():
    from frontier_llm.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"models", "systems"} <= set(sub.choices)
    for name, command in sub.choices.items():
        text = command.format_help()
        assert "examples:" in text and "flm " in text, f"flm {name} --help has no example"


def test_console_script_runs_and_user_error_exits_2():
    proc = subprocess.run(
        [sys.executable, "-m", "frontier_llm.cli", "models"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "gpt-175b" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "frontier_llm.cli", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "frontier_llm" in proc.stdout
