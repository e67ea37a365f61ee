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


def test_a_factory_takes_its_modules_example_inputs() -> None:
    workload = load_model_file("tests.factories:build_mlp")
    assert workload.name == "tests.factories:build_mlp"
    assert len(workload.build().layers) == 8
    assert workload.inputs(3)[0].shape == (3, 32)
    assert workload.default_batch_size == 512


def test_an_object_with_a_model_files_functions() -> None:
    workload = load_model_file("tests.factories:Wide")
    assert len(workload.build()) == 3
    assert workload.inputs()["input"].shape == (2, 8)


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("tests.no_such_module:build", ("no module named tests.no_such_module",)),
        ("no_such_package.models:build", ("no module named no_such_package",)),
        ("tests.factories:build_nothing", ("tests.factories defines no build_nothing",)),
        ("tests.factories:WIDTH", ("tests.factories:WIDTH is a int",)),
        ("json:dumps", ("module json defines no example_inputs()", "def example_inputs(")),
    ],
)
def test_a_factory_that_is_not_there(spec: str, fragments: tuple[str, ...]) -> None:
    message = one_line_error(lambda: load_model_file(spec))
    for fragment in fragments:
        assert fragment in message


def test_a_factorys_own_failures_name_it() -> None:
    returned = one_line_error(load_model_file("tests.factories:build_list").build)
    assert "build_list() in tests.factories:build_list returned list" in returned
    raised = one_line_error(load_model_file("tests.factories:broken").build)
    assert "broken() in tests.factories:broken raised ValueError: no such width" in raised
    assert "factories.py, line" in raised


def test_an_existing_file_wins_over_a_factory_spec(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "odd:name").write_text("")
    assert "odd:name is not a Python file" in one_line_error(lambda: load_model_file("odd:name"))
