"""MkDocs hooks: the benchmark plots and the public API's reference, both taken from the
repository at build time so that the pages never hold a stale copy.

- ``benchmarks/results/*.png`` are served as ``benchmarks/results/NAME.png`` (``benchmarks.md``
  links them by that path).
- A line ``<!-- public-api -->`` in a page becomes one mkdocstrings block per name that
  ``import ckptplan`` exports (``ckptplan._API``, then the modules of ``_MODULES``), at the
  module that defines it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
API_MARK = "<!-- public-api -->"


def on_files(files: Files, config: Any) -> Files:
    for plot in sorted(RESULTS.glob("*.png")):
        uri = f"benchmarks/results/{plot.name}"
        files.append(File.generated(config, uri, abs_src_path=str(plot)))
    return files


def public_api() -> str:
    """The mkdocstrings blocks of ``ckptplan``'s exported names, in ``_API``'s order."""
    import ckptplan

    blocks = [f"::: {module}.{name}" for name, module in ckptplan._API.items()]
    blocks += [f"::: {module}" for module in ckptplan._MODULES.values()]
    return "\n\n".join(blocks)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return markdown.replace(API_MARK, public_api()) if API_MARK in markdown else markdown
