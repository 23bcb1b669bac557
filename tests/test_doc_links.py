"""Every path README.md and docs/*.md point a reader at resolves inside the repository, so a fresh
clone (nothing beside it) follows them: Markdown links and images, and paths in backticks that
leave the file's folder (``../...``) or name a file of the repository from its root
(``docs/planner.md``, ``frontier_llm/planner/data/calibration_runs.csv``). Paths a command
writes (``flm-quickstart/reports/...``) are neither and are not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE = re.compile(r"`([^`\s]+)`")
# The repository's own top-level folders: a backticked path starting with one names its file.
_TOP = tuple(p.name + "/" for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))
_FILE = re.compile(r"\.(md|py|csv|yaml|yml|json|sh|j2|ipynb|png|pdf|toml|cfg|ini)$")


def _outside(target: Path) -> bool:
    try:
        target.resolve().relative_to(ROOT)
    except ValueError:
        return True
    return False


def references(page: Path) -> list[tuple[str, Path]]:
    """(the text as written, the path it resolves to) for every checked reference of ``page``."""
    text = page.read_text()
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor of the page itself
        out.append((target, page.parent / target.split("#", 1)[0]))
    for word in _CODE.findall(text):
        word = word.split("#", 1)[0].split("::", 1)[0].rstrip(".,:;")
        if any(ch in word for ch in "*?{}<>$=") or not word or any(
                s.split(".")[0].isupper() and s.split(".")[0] != "README" for s in word.split("/")):
            continue  # a pattern or a placeholder (sweeps/NAME.yaml), not a path
        if word.startswith("../"):
            out.append((word, page.parent / word))
        elif word.startswith(_TOP) and _FILE.search(word):
            out.append((word, ROOT / word))
    return out


def test_the_pages_hold_references():
    """The checks below look at something: the README links its figure and its pages."""
    refs = [w for w, _ in references(ROOT / "README.md")]
    assert "docs/img/quickstart-errors.png" in refs and "docs/quickstart.md" in refs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_reference_resolves_inside_the_repository(page):
    bad = [f"{written} -> {'outside the repository' if _outside(path) else 'missing'}"
           for written, path in references(page) if _outside(path) or not path.exists()]
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_published_runs_ship_with_the_package():
    """The runs the accuracy claim is measured on are package data, with a README that cites
    their sources."""
    data = ROOT / "frontier_llm" / "planner" / "data"
    for name in ("calibration_runs.csv", "calibration_runs_sharded.csv",
                 "calibration_runs_published.csv"):
        assert (data / name).stat().st_size > 1000, name
    readme = (data / "README.md").read_text()
    assert "Korthikanti" in readme and "arXiv 2205.05198" in readme
    assert "frontier_llm/planner/data/calibration_runs*.csv" in (ROOT / "README.md").read_text()
    assert "published_runs_a.csv" in readme and "calibration_runs_published.csv" in readme


def test_doc_examples_reruns_every_plan_transcript_in_the_form_the_doc_gives(tmp_path,
                                                                            monkeypatch):
    """analysis/doc_examples.py reran only the transcripts whose stderr lines sit in the
    command's block: one whose stderr is a separate ``stderr (exit N):`` block kept its old
    interval line. Every form is now rerun (the command's run is stubbed here): combined
    (stderr first), split (stdout above, stderr in its block, the exit status rewritten) and
    stdout alone; a line that moved only in its timing stays as it was."""
    import importlib
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "analysis"))
    try:
        doc_examples = importlib.import_module("doc_examples")
    finally:
        sys.path.remove(str(ROOT / "analysis"))

    def fake_run(argv, **_):
        words = " ".join(argv)
        return subprocess.CompletedProcess(
            argv, 1 if "--deadline" in words else 0, stdout=f"table for {argv[-1]}\n",
            stderr="# plan: 10 layouts evaluated in 0.99 s\n# intervals at 80%: new\n")

    monkeypatch.setattr(doc_examples.subprocess, "run", fake_run)
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```", "$ flm plan --top 1",
        "# plan: 10 layouts evaluated in 0.04 s", "# intervals at 80%: old", "table old", "```",
        "", "```", "$ flm plan --deadline 9d --top 2", "table old", "```", "",
        "stderr (exit 0):", "", "```", "# plan: 10 layouts evaluated in 0.04 s",
        "# intervals at 80%: old", "```", "",
        "```", "$ flm plan --top 3", "table old", "```", "",
        "```", "$ flm export --top 4", "untouched", "```", ""]))
    assert doc_examples.rerun(page) == 3
    assert page.read_text().split("\n") == [
        "```", "$ flm plan --top 1",
        "# plan: 10 layouts evaluated in 0.04 s", "# intervals at 80%: new", "table for 1", "```",
        "", "```", "$ flm plan --deadline 9d --top 2", "table for 2", "```", "",
        "stderr (exit 1):", "", "```", "# plan: 10 layouts evaluated in 0.04 s",
        "# intervals at 80%: new", "```", "",
        "```", "$ flm plan --top 3", "table for 3", "```", "",
        "```", "$ flm export --top 4", "untouched", "```", ""]
