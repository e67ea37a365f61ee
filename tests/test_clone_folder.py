"""Bug 6 of issue 41: a clone of this repository named ``ckptplan/`` shadowed the installed
package for a script run from the clone's parent folder.

That folder is on ``sys.path`` (the script's own) and the repository's root has no
``__init__.py``, so ``import ckptplan`` finds the clone as a namespace portion. A meta-path
finder, which setuptools used for the editable install while ``solvers/`` was mapped onto
``ckptplan.solvers``, is asked only after the path search has settled for that namespace. The
src layout of links (docs/development.md, "The layout") makes the editable install a path
entry instead, and a regular package found on any path entry wins over a namespace portion.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

WHERE = "import importlib.util\nprint(importlib.util.find_spec('ckptplan').origin)\n"
"""Where a script finds ckptplan, without importing it (torch takes seconds)."""
SCRIPT = "import ckptplan\nprint(ckptplan.apply.__module__, ckptplan.__file__)\n"


def _run(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``python train.py`` in ``folder``, as a user runs a training script there."""
    (folder / "train.py").write_text(script)
    return subprocess.run(
        [sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=60
    )


def _from_this_repository(file: str) -> bool:
    return Path(file).resolve().parent.parent == ROOT


def test_a_script_beside_a_clone_named_ckptplan_imports_the_package(tmp_path: Path) -> None:
    if not _from_this_repository(_run(tmp_path, WHERE).stdout.strip()):
        pytest.skip("ckptplan is not installed from this repository")
    (tmp_path / "ckptplan").symlink_to(ROOT, target_is_directory=True)  # the clone folder
    done = _run(tmp_path, SCRIPT)
    assert done.returncode == 0, done.stderr
    module, file = done.stdout.split()
    assert module.startswith("ckptplan.")
    assert _from_this_repository(file)
