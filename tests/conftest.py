from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "models"


@pytest.fixture
def tiny_gpt() -> Path:
    return MODELS / "tiny_gpt.py"


@pytest.fixture
def write_model(tmp_path: Path):
    """Write a model file with the given source and return its path."""

    def write(source: str, name: str = "model.py") -> Path:
        path = tmp_path / name
        path.write_text(source)
        return path

    return write
