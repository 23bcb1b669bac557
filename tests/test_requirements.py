"""Every import the project makes is declared in setup.cfg, so a user's clean virtualenv
(``pip install -e .`` or ``.[dev]``) has it.

The scan reads the code, not this environment: an import that works here only because some
other package pulled it in, or because the machine's Python already had it, fails here. Import
names are mapped to distributions with this environment's metadata (``yaml`` is PyYAML), which
holds every declared requirement since the test command installs ``.[dev]``.

Where an import sits decides where it must be declared: one at a module's top level inside the
package runs for every ``flm`` command, so it belongs in ``install_requires``; one inside a
function (DeepSpeed for ``--engine deepspeed``, mpi4py for MPI launches) may live in an extra.
"""

from __future__ import annotations

import ast
import configparser
import json
import re
import sys
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("frontier_llm", "analysis", "benchmarks", "scripts", "tests")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(_norm(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]))
    return names


def declared() -> tuple[set[str], set[str]]:
    """(install_requires, every extra together), as normalised distribution names."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    runtime = _requirements(cfg.get("options", "install_requires"))
    extras: set[str] = set()
    for _, text in cfg.items("options.extras_require"):
        extras |= _requirements(text)
    return runtime, extras


def _sources() -> Iterator[tuple[Path, str]]:
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path, path.read_text()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        # IPython's magics and shell escapes are not Python.
        lines = [ln for ln in "\n".join(code).splitlines()
                 if not ln.lstrip().startswith(("%", "!"))]
        yield path, "\n".join(lines)


def _own_modules() -> set[str]:
    """Names that are this repository's own: the package and the scripts' sibling modules
    (tests/store_fixtures.py, imported by a benchmark, say)."""
    own = set(SCANNED)
    for folder in SCANNED:
        own |= {p.stem for p in (REPO / folder).glob("*.py")}
    return own


def imports(source: str) -> Iterator[tuple[str, bool]]:
    """(top-level module, imported at module level?) for each absolute import in ``source``."""
    tree = ast.parse(source)
    top_level = {id(n) for n in tree.body}
    for guard in (n for n in tree.body if isinstance(n, ast.If | ast.Try)):
        top_level |= {id(n) for n in ast.walk(guard)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            yield name.split(".")[0], id(node) in top_level


def undeclared(sources: list[tuple[Path, str]] | None = None) -> list[str]:
    """What the ``sources`` (default: the repository's) import without declaring it."""
    runtime, extras = declared()
    dists = packages_distributions()
    own = _own_modules()
    problems = []
    for path, source in (list(_sources()) if sources is None else sources):
        where = path.relative_to(REPO)
        for module, at_top in imports(source):
            if module in sys.stdlib_module_names or module in own or module == "__future__":
                continue
            names = {_norm(d) for d in dists.get(module, [module])}
            in_package = where.parts[0] == "frontier_llm"
            if in_package and at_top and not names & runtime:
                problems.append(f"{where}: {module} (imported for every flm command) is not in "
                                "install_requires")
            elif not names & (runtime | extras):
                problems.append(f"{where}: {module} is not declared in setup.cfg")
    return sorted(set(problems))


def test_every_import_is_declared_in_setup_cfg():
    assert undeclared() == []


def test_the_scan_names_an_undeclared_import_and_an_extra_imported_at_the_top():
    """The scan itself can fail: a made-up module anywhere, and an extra's package (DeepSpeed)
    imported at the top of a package module, are both named; the same imports inside a
    function of the package, or in a benchmark, are fine when declared somewhere."""
    runtime, extras = declared()
    assert "deepspeed" in extras and "deepspeed" not in runtime
    package = REPO / "frontier_llm" / "made_up.py"
    bench = REPO / "benchmarks" / "made_up.py"
    top = "import yaml\nimport deepspeed\nimport no_such_module_anywhere\n"
    lazy = "def f():\n    import deepspeed\n    import yaml\n"
    assert undeclared([(package, top), (package, lazy), (bench, top)]) == [
        "benchmarks/made_up.py: no_such_module_anywhere is not declared in setup.cfg",
        "frontier_llm/made_up.py: deepspeed (imported for every flm command) is not in "
        "install_requires",
        "frontier_llm/made_up.py: no_such_module_anywhere (imported for every flm command) "
        "is not in install_requires",
    ]


@pytest.mark.parametrize("module", ["scipy", "matplotlib", "optuna", "psycopg", "yaml"])
def test_what_flm_needs_at_run_time_is_in_install_requires(module):
    runtime, _ = declared()
    assert {_norm(d) for d in packages_distributions()[module]} & runtime
