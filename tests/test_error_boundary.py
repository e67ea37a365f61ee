"""The CLI's error boundary: never a traceback unless --debug, and a distinct exit status."""

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import ckptplan.api
from ckptplan.cli.main import cli
from ckptplan.errors import DEBUG_ENV, CkptplanError, debug_enabled
from tests.conftest import ROOT


def _raise_runtime(*args, **kwargs):
    raise RuntimeError("something broke\nsecond line of detail")


def _divide(*args, **kwargs):
    return 1 / 0


def _raise_in_torch(*args, **kwargs):
    import torch

    return torch.nn.Linear(2, 3)(torch.zeros(4))  # shape mismatch, raised inside torch


def _raise_user_error(*args, **kwargs):
    try:
        {}["budget"]
    except KeyError:
        raise CkptplanError("--budget 7 is below the least feasible peak; try 9GB") from None


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)


@pytest.fixture
def solve_with(monkeypatch, tiny_gpt):
    """Run ``ckptplan [pre...] solve`` with api.solve_with (what the command calls) replaced."""

    def run(fake, *pre: str, env=None):
        monkeypatch.setattr(ckptplan.api, "solve_with", fake)
        args = [*pre, "solve", str(tiny_gpt), "--budget", "60%"]
        return CliRunner().invoke(cli, args, env=env)

    return run


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("fake", "kind", "message"),
    [
        (_raise_runtime, "RuntimeError", "something broke"),
        (_divide, "ZeroDivisionError", "division by zero"),
    ],
)
def test_internal_error_is_one_line_and_exit_3(solve_with, fake, kind, message):
    result = solve_with(fake)
    assert result.exit_code == 3, result.output
    lines = _lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    line = lines[0]
    assert line.startswith(f"internal error: {kind}: {message}")
    assert "second line" not in line
    assert "(in ckptplan/cli/main.py, line " in line  # the deepest ckptplan frame: solve's call
    assert line.endswith("rerun with --debug for the traceback")
    assert result.stdout == ""


def test_internal_error_in_torch_names_torch(solve_with):
    result = solve_with(_raise_in_torch)
    assert result.exit_code == 3, result.output
    (line,) = _lines(result.stderr)
    assert line.startswith("internal error: RuntimeError: ")
    assert "(in torch, called from ckptplan/cli/main.py, line " in line


def test_debug_flag_prints_the_traceback(solve_with):
    result = solve_with(_raise_runtime, "--debug")
    assert result.exit_code == 3, result.output
    assert "Traceback" in result.stderr
    assert "_raise_runtime" in result.stderr
    assert _lines(result.stderr)[-1].startswith("internal error: RuntimeError: something broke")
    assert not debug_enabled()  # --debug sets the variable only while the command runs


def test_debug_env_prints_the_traceback(solve_with):
    result = solve_with(_divide, env={DEBUG_ENV: "1"})
    assert result.exit_code == 3, result.output
    assert "Traceback" in result.stderr and "ZeroDivisionError" in result.stderr


def test_user_error_is_one_line_and_exit_2(solve_with):
    result = solve_with(_raise_user_error)
    assert result.exit_code == 2, result.output
    assert _lines(result.stderr) == ["error: --budget 7 is below the least feasible peak; try 9GB"]
    assert "Traceback" not in result.output


def test_user_error_with_debug_shows_its_hidden_cause(solve_with):
    result = solve_with(_raise_user_error, "--debug")
    assert result.exit_code == 2, result.output
    assert "Traceback" in result.stderr and "KeyError" in result.stderr  # `from None` undone
    assert _lines(result.stderr)[-1].startswith("error: --budget 7")


def test_keyboard_interrupt_exits_130(solve_with):
    result = solve_with(_interrupt)
    assert result.exit_code == 130, result.output
    assert _lines(result.stderr) == ["interrupted"]


def test_click_usage_errors_keep_clicks_behaviour():
    result = CliRunner().invoke(cli, ["solve"])
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr and "internal error" not in result.output
    assert CliRunner().invoke(cli, ["--debug", "--help"]).exit_code == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("yes", True), ("", False), ("0", False), ("false", False)],
)
def test_debug_enabled_reads_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(DEBUG_ENV, value)
    assert debug_enabled() is expected


def test_end_to_end_internal_error_in_a_real_process(tmp_path):
    """A real ``python -m ckptplan``: a malformed plan that trips a bug-like failure."""
    code = (
        "import sys, ckptplan.cli.main as c\n"
        "from ckptplan.values.plan import Plan\n"
        "def load(path): return {}['missing']\n"
        "Plan.load = staticmethod(load)\n"
        "sys.argv = ['ckptplan', 'show', 'plan.json']\n"
        "c.main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 3, done.stderr
    (line,) = _lines(done.stderr)
    assert re.fullmatch(
        r"internal error: KeyError: 'missing' \(in ckptplan/cli/main\.py, line \d+\); "
        r"rerun with --debug for the traceback",
        line,
    ), done.stderr


def test_the_library_names_arguments_where_the_cli_names_flags() -> None:
    """One error, two voices: the fix a Python caller can type, and the flag on the CLI."""
    model = ROOT / "tests" / "models" / "tiny_gpt.py"
    with pytest.raises(CkptplanError, match=r"^margin=80 is not a percentage.*e\.g\. margin=2$"):
        ckptplan.api.solve(model, budget="1.0", margin=80, batch_size=2)
    result = CliRunner().invoke(
        cli, ["solve", str(model), "--budget", "1.0", "--margin", "80", "--batch-size", "2"]
    )
    assert result.exit_code == 2
    assert "error: --margin 80 is not a percentage" in result.output
    assert "e.g. --margin 2" in result.output
