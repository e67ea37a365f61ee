"""Every bad input the CLI can be given ends in one line naming the problem, exit status 2,
and no traceback; help is ``-h`` or ``--help`` or the bare command, and exits 0."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ckptplan
from ckptplan.cli.main import cli
from ckptplan.errors import CkptplanError
from tests.conftest import ROOT
from tests.test_cli import assert_one_line_error


@pytest.fixture
def run():
    def invoke(*args: object):
        return CliRunner().invoke(cli, [str(a) for a in args])

    return invoke


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, tiny_gpt) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    args = ["solve", tiny_gpt, "--budget", "1.0", "--solver", "none", "--batch-size", "2"]
    result = CliRunner().invoke(cli, [str(a) for a in [*args, "-o", path]])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="module")
def tiny_gpt() -> Path:
    from tests.conftest import MODELS

    return MODELS / "tiny_gpt.py"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--every", "0"], "--every"),
        (["--max-segment", "0"], "--max-segment"),
        (["--world-size", "0"], "--world-size"),
        (["--batch-size", "-1"], "--batch-size"),
        (["--margin", "80"], "--margin"),
        (["--solver", "best"], "--solver"),
        (["--budget", "twelve"], "twelve"),
    ],
)
def test_a_bad_solve_flag(run, tiny_gpt, args: list[str], fragment: str) -> None:
    flags = ["--budget", "1GB", *args] if "--budget" not in args else args
    assert_one_line_error(run("solve", tiny_gpt, *flags), fragment)


def test_an_output_into_a_missing_folder_is_refused_before_solving(run, tiny_gpt, tmp_path):
    missing = tmp_path / "nope" / "plan.json"
    assert_one_line_error(
        run("solve", tiny_gpt, "--budget", "1GB", "-o", missing), "does not exist"
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--repeats", "0"], "--repeats"),
        (["--on", "tpu"], "tpu"),
        (["--on", "not a device"], "not a device"),
    ],
)
def test_a_bad_verify_flag(run, tiny_gpt, plan_file, args: list[str], fragment: str) -> None:
    assert_one_line_error(run("verify", tiny_gpt, plan_file, *args), fragment)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("budget", "lots", "PlanBudget is a str"),
        ("predicted", [1, 2], "Prediction is a list"),
        ("settings", {"world_size": "two"}, "world_size is 'two', not int"),
        ("regions", [{"modules": 5}], "damaged plan"),
        ("model", None, "missing field 'model'"),
    ],
)
def test_a_damaged_plan_file(run, tiny_gpt, plan_file, tmp_path, field, value, fragment) -> None:
    data = json.loads(plan_file.read_text())
    if value is None:
        del data[field]
    elif isinstance(value, dict):
        data[field] = {**data[field], **value}
    else:
        data[field] = value
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(data))
    for command in (("show", damaged), ("verify", tiny_gpt, damaged)):
        assert_one_line_error(run(*command), fragment)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_verify_on_cuda_without_one(run, tiny_gpt, plan_file) -> None:
    assert_one_line_error(run("verify", tiny_gpt, plan_file, "--on", "cuda"), "measure on cpu")


def test_a_syntax_error_names_its_place_once(run, write_model) -> None:
    path = write_model("def build_model(:\n    pass\n")
    result = run("profile", path)
    assert_one_line_error(result, "SyntaxError", "line 1")
    assert result.output.count("line 1") == 1


@pytest.mark.parametrize(
    "args",
    [["solve"], ["plan-it"], ["profile", "--depth", "-1", "model.py"], ["sweep", "--points", "0"]],
)
def test_what_click_refuses_is_one_line_too(run, args: list[str]) -> None:
    assert_one_line_error(run(*args))


@pytest.mark.parametrize("args", [[], ["-h"], ["--help"], ["solve", "-h"], ["remat", "-h"]])
def test_help_exits_zero(run, args: list[str]) -> None:
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_help_lists_the_commands_in_workflow_order_each_in_full(run) -> None:
    """``ckptplan --help`` reads as the job's steps, and no description is cut off with '...'."""
    result = run("--help")
    assert result.exit_code == 0, result.output
    listing = result.output.partition("Commands:")[2]
    names = re.findall(r"^  (\S+)", listing, re.MULTILINE)
    workflow = ["profile", "solve", "fit", "verify", "show", "sweep", "rewrite", "gap", "remat"]
    assert names == workflow
    assert "..." not in listing
    assert "fits BUDGET." in listing


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dtype", "bf16-mixed", "--autocast", "fp16"], "bf16-mixed"),
        (["--device", "cpu", "--target", "h100"], "--target alone"),
        (["--target", "tpu9"], "--target"),
    ],
)
def test_a_bad_step_flag(run, tiny_gpt, args: list[str], fragment: str) -> None:
    assert_one_line_error(run("profile", tiny_gpt, *args), fragment)


@pytest.mark.parametrize("command", ["solve", "profile", "sweep", "verify", "rewrite"])
@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("tests.no_such_module:build", "no module named tests.no_such_module"),
        ("tests.factories:build_nothing", "defines no build_nothing"),
    ],
)
def test_a_factory_that_is_not_there(run, plan_file, tmp_path, command, spec, fragment) -> None:
    args = {
        "solve": ["--budget", "1GB"],
        "profile": [],
        "sweep": [],
        "verify": [plan_file],
        "rewrite": [plan_file, "-o", tmp_path / "out.py"],
    }[command]
    assert_one_line_error(run(command, spec, *args), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--budget", "twelve"], "twelve"),
        (["--plot", "/no/such/folder/f.png"], "--plot"),
    ],
)
def test_a_bad_sweep_flag(run, tiny_gpt, args: list[str], fragment: str) -> None:
    assert_one_line_error(run("sweep", tiny_gpt, *args), fragment)


@pytest.mark.parametrize("flag", ["-o", "--weights"])
def test_rewrite_into_a_missing_folder_is_refused_before_the_work(
    run, tiny_gpt, plan_file, tmp_path, flag: str
) -> None:
    """It did the work, then exited 3 with an internal FileNotFoundError."""
    missing = tmp_path / "no" / "such" / "out.py"
    output = missing if flag == "-o" else tmp_path / "out.py"
    extra = ["--weights", missing.with_suffix(".pt")] if flag == "--weights" else []
    result = run("rewrite", tiny_gpt, plan_file, "-o", output, *extra)
    assert_one_line_error(result, flag, "does not exist")


def test_rewrite_takes_an_hf_model(run, plan_file, tmp_path) -> None:
    """``rewrite hf:DIR`` said 'model file hf:DIR not found; pass ... or hf:NAME_OR_DIR'."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=128, n_embd=32, n_layer=2, n_head=2, architectures=["GPT2LMHeadModel"]
    )
    config.save_pretrained(tmp_path)
    result = run("rewrite", f"hf:{tmp_path}", plan_file, "-o", tmp_path / "out.py")
    assert "not found" not in result.output
    # The plan is tiny_gpt's: the hf: model is built and found not to be the plan's model.
    assert_one_line_error(result, "GPT2LMHeadModel")


@pytest.fixture
def no_profiling(monkeypatch):
    """Profiling that fails the test, to show an input was refused before any of it."""

    def profiled(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was profiled")

    monkeypatch.setattr("ckptplan.api.profile_model", profiled)


@pytest.mark.parametrize("command", ["solve", "fit", "gap", "sweep"])
def test_a_budget_in_bytes_too_small_for_any_step_is_refused_before_profiling(
    run, no_profiling, command: str
) -> None:
    """``--budget 60`` means 60% or 60GB: said in a moment, not after minutes of profiling."""
    result = run(command, ROOT / "sample_models" / "gpt.py", "--budget", "60")
    assert_one_line_error(result, "budget '60' is 60 bytes: did you mean 60% or 60GB?")


def test_a_budget_in_bits_is_refused(run, no_profiling, tiny_gpt) -> None:
    result = run("solve", tiny_gpt, "--budget", "12Gb")
    assert_one_line_error(result, "is gigabits; write 12GB for gigabytes")


def test_the_api_refuses_a_bare_byte_count_before_profiling(no_profiling) -> None:
    with pytest.raises(CkptplanError, match="did you mean 60% or 60GB"):
        ckptplan.solve(ROOT / "sample_models" / "gpt.py", budget=60)
