"""The documentation stays true: the docs' runnable examples run, the README keeps to its
limits and to CI's test command, and the design document indexes every Note in the code.

A page marks an example to run with an HTML comment on the line before its fenced block:
``<!-- runnable -->`` runs the block, ``<!-- runnable: model.py -->`` writes it to that file
first. A page's blocks run in order, in one fresh interpreter, in a folder of their own. The
site itself is built with warnings as errors by ``.ci/docs``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCS = ROOT / "docs"
RUNNABLE = re.compile(
    r"<!-- runnable(?:: (?P<file>[\w./-]+))? -->\n```python\n(?P<code>.*?)```", re.S
)
NOTE = re.compile(r"^\s*(?:# ?)?Note \[(?P<name>[^\]]+)\](?::|\s*$)", re.M)

README_WORDS = 1200
PARAGRAPH_WORDS = 120


def runnable_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if RUNNABLE.search(p.read_text()))


def script_of(page: Path) -> str:
    """The page's runnable blocks as one script: files written, code run, in page order."""
    parts = []
    for block in RUNNABLE.finditer(page.read_text()):
        if block["file"]:
            parts.append(f"open({block['file']!r}, 'w').write({block['code']!r})")
        else:
            parts.append(block["code"])
    return "\n".join(parts)


def test_some_page_has_runnable_examples() -> None:
    assert runnable_pages(), "no docs page marks an example <!-- runnable -->"


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_runnable_examples_run(page: Path, tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(script_of(page))
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{page.relative_to(ROOT)}:\n{done.stderr[-3000:]}"


def prose(markdown: str) -> list[str]:
    """The paragraphs of a Markdown text outside its fenced code blocks."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def test_prose_skips_code_blocks() -> None:
    assert prose("one two\n\n```bash\nthree four\n```\n\nfive\n") == ["one two", "five"]


def test_readme_is_short() -> None:
    paragraphs = prose((ROOT / "README.md").read_text())
    words = [len(p.split()) for p in paragraphs]
    assert sum(words) <= README_WORDS
    longest = max(zip(words, paragraphs, strict=True))
    assert longest[0] <= PARAGRAPH_WORDS, longest[1]


def test_readme_runs_the_tests_as_ci_does() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    first = next(line for line in ci if line.startswith("pip install"))
    assert f"```bash\n{first}\n```" in (ROOT / "README.md").read_text()


def test_design_indexes_every_note() -> None:
    index = (DOCS / "design.md").read_text()
    missing = []
    for folder in ("ckptplan", "solvers", "benchmarks"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            for note in NOTE.finditer(source.read_text()):
                row = f"| [{note['name']}] | `{source.relative_to(ROOT)}` |"
                if row not in index:
                    missing.append(row)
    assert not missing, "docs/design.md's index of Notes lacks:\n" + "\n".join(missing)


def test_cli_reference_lists_every_command_in_workflow_order() -> None:
    """mkdocs-click sorts a group's commands by name, so the page renders each on its own, in
    the order ``ckptplan --help`` lists them."""
    import click

    from ckptplan.cli.main import cli

    page = (DOCS / "reference" / "cli.md").read_text()
    rendered = re.findall(r":prog_name: ckptplan (\w+)", page)
    assert rendered == cli.list_commands(click.Context(cli))
