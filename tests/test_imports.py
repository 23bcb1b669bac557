"""What each entry point imports: a ``flm bench`` rank (hundreds per job) must not pay for pandas
or SQLAlchemy, and the jobs package must not reach up into the CLI. Fresh interpreters, so that
no other test's imports count."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_a_bench_rank_imports_neither_pandas_nor_sqlalchemy():
    mods = _modules(
        "from frontier_llm.cli import build_parser\n"
        "from frontier_llm.bench.config import build_config\n"
        "args = build_parser('bench').parse_args(['bench', '--model', 'tiny-gpt', '--tp', '2',"
        " '--system', 'cpu-local'])\n"
        "cfg = build_config(args)\n"
        "import frontier_llm.bench.start, frontier_llm.bench.run\n")
    assert "frontier_llm.bench.run" in mods  # the rank's code was imported
    heavy = {m.split(".")[0] for m in mods} & {"pandas", "sqlalchemy", "jinja2", "optuna"}
    assert not heavy


def test_dispatching_a_command_imports_only_its_module():
    mods = _modules("from frontier_llm.cli import build_parser\nbuild_parser('bench')")
    assert "frontier_llm.cli.bench" in mods
    assert not {"frontier_llm.cli.sweep", "frontier_llm.cli.store", "frontier_llm.cli.plan"} & mods


def test_jobs_never_import_the_cli():
    mods = _modules("import frontier_llm.jobs.sweepspec, frontier_llm.jobs.sweepdir, "
                    "frontier_llm.jobs.runner, frontier_llm.jobs.executors")
    assert not any(m.startswith("frontier_llm.cli") for m in mods)


def test_the_dispatch_table_names_every_command_of_flm_help():
    import argparse

    from frontier_llm.cli import COMMAND_MODULE, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMAND_MODULE)
    for command in COMMAND_MODULE:  # each module registers the commands the table gives it
        one = next(a for a in build_parser(command)._actions
                   if isinstance(a, argparse._SubParsersAction))
        assert command in one.choices
