"""Model files: what they must define, and the one-line errors when they do not."""

from pathlib import Path

import pytest
import torch

from ckptplan.errors import CkptplanError
from ckptplan.loading import default_loss, load_model_file

GOOD_INPUTS = "def example_inputs(batch_size=2):\n    return (torch.randn(batch_size, 4),)\n"


def one_line_error(call) -> str:
    with pytest.raises(CkptplanError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    message = one_line_error(lambda: load_model_file(tmp_path / "nope.py"))
    assert "nope.py not found" in message


def test_import_error_names_file_and_line(write_model) -> None:
    path = write_model("import torch\n\nx = 1\ny = undefined_name + 1\n")
    message = one_line_error(lambda: load_model_file(path))
    assert "NameError" in message and "model.py, line 4" in message


def test_syntax_error_names_the_line(write_model) -> None:
    path = write_model("def build_model(:\n    pass\n")
    message = one_line_error(lambda: load_model_file(path))
    assert "SyntaxError" in message and "line 1" in message


def test_missing_build_model_shows_the_signature(write_model) -> None:
    path = write_model("import torch\n" + GOOD_INPUTS)
    message = one_line_error(lambda: load_model_file(path))
    assert "defines no build_model()" in message and "def build_model() ->" in message


def test_missing_example_inputs(write_model) -> None:
    path = write_model("import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n")
    assert "example_inputs" in one_line_error(lambda: load_model_file(path))


def test_wrong_return_types(write_model) -> None:
    path = write_model(
        "import torch\ndef build_model():\n    return [1]\n"
        "def example_inputs(batch_size=2):\n    return 3\n"
    )
    model_file = load_model_file(path)
    assert "returned list" in one_line_error(model_file.build)
    assert "returned int" in one_line_error(model_file.inputs)


def test_an_exception_inside_build_model(write_model) -> None:
    path = write_model(
        "import torch\ndef build_model():\n    raise ValueError('bad width')\n" + GOOD_INPUTS
    )
    message = one_line_error(load_model_file(path).build)
    assert "ValueError: bad width" in message and "line 3" in message


def test_a_good_file(write_model) -> None:
    path = write_model(
        "import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n" + GOOD_INPUTS
    )
    model_file = load_model_file(path)
    assert isinstance(model_file.build(), torch.nn.Linear)
    assert model_file.inputs(3)[0].shape == (3, 4)
    assert model_file.default_batch_size == 2


def test_default_loss() -> None:
    x = torch.ones(3, requires_grad=True)
    assert default_loss((x * 2, torch.arange(3))).item() == 6.0

    class Output:
        loss = x.sum()

    assert default_loss(Output()).item() == 3.0
    assert "loss_fn" in one_line_error(lambda: default_loss(torch.arange(3)))
