"""The command line: reports, JSON, and one-line errors with exit status 2."""

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ckptplan.cli.main import cli
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)


@pytest.fixture
def run():
    def invoke(*args: str):
        return CliRunner().invoke(cli, [str(a) for a in args])

    return invoke


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_solve_show_verify(run, tiny_gpt, tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    solved = run("solve", tiny_gpt, "--budget", "70%", "--batch-size", "2", "-o", plan_path)
    assert solved.exit_code == 0, solved.output
    assert "auto (this plan)" in solved.output
    budget_line = next(line for line in solved.output.splitlines() if line.startswith("budget"))
    assert budget_line.count("MiB") == 2 and "GiB" not in budget_line, "one unit per line"
    assert "made for: target cpu · fp32 · batch 2 · optimizer adamw · one device" in solved.output
    plan = json.loads(plan_path.read_text())
    assert plan["schema"] == "ckptplan.plan/1" and plan["regions"]

    shown = run("show", plan_path)
    assert shown.exit_code == 0 and "checkpointed regions" in shown.output

    verified = run("verify", tiny_gpt, plan_path, "--json", "--repeats", "1")
    assert verified.exit_code == 0, verified.output
    result = json.loads(verified.output)
    for key in (
        "budget_bytes",
        "predicted_peak_bytes",
        "measured_peak_bytes",
        "baseline_peak_bytes",
        "step_time_ratio",
        "max_grad_abs_diff",
    ):
        assert key in result
    assert result["measured_peak_bytes"] <= result["budget_bytes"]
    assert result["max_grad_abs_diff"] <= 1e-6


def test_solve_json(run, tiny_gpt) -> None:
    result = run("solve", tiny_gpt, "--budget", "0.8", "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "ckptplan.solve/1"
    assert data["predicted_peak_bytes"] <= data["budget_bytes"]
    assert data["plan"]["budget"]["bytes"] == data["budget_bytes"]


def test_budget_below_least_feasible_peak(run, tiny_gpt) -> None:
    result = run("solve", tiny_gpt, "--budget", "1MB", "--batch-size", "2")
    assert_one_line_error(result, "below the least feasible peak", "--budget")


def test_unparsable_budget(run, tiny_gpt) -> None:
    assert_one_line_error(run("solve", tiny_gpt, "--budget", "12XB"), "12XB")


def test_missing_model_file(run, tmp_path) -> None:
    assert_one_line_error(run("solve", tmp_path / "nope.py", "--budget", "1GB"), "not found")


def test_model_file_without_build_model(run, write_model) -> None:
    path = write_model("import torch\n")
    assert_one_line_error(run("solve", path, "--budget", "1GB"), "build_model")


def test_plan_for_another_model(run, tiny_gpt, write_model, tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    assert (
        run(
            "solve",
            tiny_gpt,
            "--budget",
            "1.0",
            "--solver",
            "none",
            "--batch-size",
            "2",
            "-o",
            plan_path,
        ).exit_code
        == 0
    )
    other = write_model(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n"
        "def example_inputs(batch_size=2):\n    return (torch.randn(batch_size, 4),)\n"
    )
    assert_one_line_error(run("verify", other, plan_path), "made for another model")


def test_a_file_that_is_not_a_plan(run, tmp_path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("[]")
    assert_one_line_error(run("show", path), "not a ckptplan plan")


def test_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ckptplan", "--help"], capture_output=True, text=True, check=True
    )
    assert "solve" in result.stdout and "verify" in result.stdout


def test_profile_command(run, tiny_gpt) -> None:
    result = run("profile", tiny_gpt, "--batch-size", "2", "--depth", "1")
    assert result.exit_code == 0, result.output
    assert "by module (depth 1)" in result.output and "layers" in result.output
    assert "largest tensors saved for backward" in result.output
    lines = result.output.splitlines()
    # Into a pipe, nothing wraps: the header is one line, and every table has a legend.
    assert lines[0].startswith("ckptplan profile") and lines[0].endswith("times estimated for cpu")
    assert "a selective policy adds 45 µs per op call" in lines[1]
    assert any(line.startswith("saved for bwd: bytes autograd keeps") for line in lines)
    assert any(line.startswith("saved: bytes the block keeps") for line in lines)


def test_profile_json(run, tiny_gpt) -> None:
    result = run("profile", tiny_gpt, "--batch-size", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert len(data["blocks"]) == 6
    ops = data["ops"]
    assert any(op["random"] for op in ops) and any(op["backward"] for op in ops)
    saved = sum(op["saved_bytes"] for op in ops)
    assert saved >= sum(b["saved_bytes"] for b in data["blocks"])
    modules = {row["module"] for row in data["by_module"]}
    assert {"layers.0", "(optimizer step)"} <= {
        m.split(".")[0] + "." + m.split(".")[1] if m.count(".") else m for m in modules
    } | modules


def test_sweep_command(run, tiny_gpt, tmp_path) -> None:
    png, svg = tmp_path / "f.png", tmp_path / "f.svg"
    result = run(
        "sweep", tiny_gpt, "--batch-size", "2", "--points", "4", "--plot", png, "--plot", svg
    )
    assert result.exit_code == 0, result.output
    for strategy in ("none", "full", "sqrt", "every-2", "dp", "auto"):
        assert strategy in result.output
    assert png.read_bytes()[:4] == b"\x89PNG" and b"<svg" in svg.read_bytes()[:500]


def test_sweep_json_frontiers_are_monotone(run, tiny_gpt) -> None:
    result = run("sweep", tiny_gpt, "--batch-size", "2", "--points", "5", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert data["schema"] == "ckptplan.sweep/1"
    points = data["points"]
    for strategy in ("dp", "auto"):
        frontier = sorted(
            (p for p in points if p["strategy"] == strategy),
            key=lambda p: p["predicted_peak_bytes"],
        )
        overheads = [p["predicted_overhead"] for p in frontier]
        assert overheads == sorted(overheads, reverse=True)
    auto = [p for p in points if p["strategy"] == "auto"]
    for fixed in (p for p in points if p["strategy"] in ("sqrt", "full", "every-2", "every-3")):
        fits = [a for a in auto if a["predicted_peak_bytes"] <= fixed["predicted_peak_bytes"]]
        assert fits and min(a["predicted_overhead"] for a in fits) <= fixed["predicted_overhead"]


def test_gap_command_puts_auto_beside_the_exact_optimum(run) -> None:
    result = run(
        "gap",
        ROOT / "sample_models" / "mlp.py",
        "--budget",
        "0.7",
        "--time-limit",
        "20",
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["ilp_cost"] <= report["auto_cost"], "the optimum is never worse than auto"
    assert report["ilp_peak"] <= report["budget"] == report["auto_peak"]
    bad = run("gap", ROOT / "sample_models" / "mlp.py", "--budget", "1KiB")
    assert bad.exit_code == 2 and "least feasible" in bad.output


UNITS = re.compile(r"\d (GiB|MiB|KiB|B)\b")


def test_a_factory_through_every_command(run, tmp_path) -> None:
    spec = "tests.factories:build_mlp"
    plan_path = tmp_path / "plan.json"
    solved = run("solve", spec, "--budget", "80%", "-o", plan_path, "--json")
    assert solved.exit_code == 0, solved.output
    assert json.loads(solved.output)["plan"]["model"] == spec
    profiled = run("profile", spec, "--json")
    assert profiled.exit_code == 0 and len(json.loads(profiled.output)["blocks"]) == 8
    verified = run("verify", spec, plan_path, "--repeats", "1", "--on", "cpu", "--json")
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.output)["max_grad_abs_diff"] <= 1e-6
    swept = run("sweep", spec, "--points", "2", "--json")
    assert swept.exit_code == 0 and json.loads(swept.output)["points"]
    rewritten = run("rewrite", spec, plan_path, "-o", tmp_path / "planned.py")
    assert rewritten.exit_code == 0, rewritten.output
    assert (tmp_path / "planned.py").is_file()


def test_target_is_the_plans_device_and_device_its_old_spelling(run, tiny_gpt) -> None:
    new = run("profile", tiny_gpt, "--batch-size", "2", "--target", "h100", "--json")
    assert new.exit_code == 0, new.output
    assert json.loads(new.output)["settings"]["device"] == "h100"
    old = run("profile", tiny_gpt, "--batch-size", "2", "--device", "h100", "--json")
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(new.output)
    assert "--device is now --target" in old.stderr
    for command in ("solve", "profile", "sweep", "gap"):
        shown = run(command, "-h").output
        assert "--target" in shown and "--device" not in shown
    assert "--on" in run("verify", "-h").output and "--on" in run("sweep", "-h").output


def test_the_python_api_takes_the_same_words(tiny_gpt) -> None:
    import ckptplan

    plan = ckptplan.solve(tiny_gpt, budget="100%", solver="none", batch_size=2, target="cpu")
    assert plan.settings.device == "cpu"
    with pytest.warns(DeprecationWarning, match=r"use profile\(target=\.\.\.\)"):
        old = ckptplan.profile(tiny_gpt, batch_size=2, device="h100")
    assert old.settings.device == "h100"
    result = ckptplan.verify(tiny_gpt, plan, run_on="cpu", repeats=1)
    assert result.device == "cpu"


def test_mixed_precision_keeps_fp32_state_and_bf16_activations(run, tiny_gpt) -> None:
    def predicted(*flags: str) -> dict:
        args = ["--budget", "100%", "--solver", "none", "--batch-size", "4", "--json", *flags]
        result = run("solve", tiny_gpt, *args)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["plan"]

    fp32, mixed, bf16 = (
        predicted(),
        predicted("--dtype", "bf16-mixed"),
        predicted("--dtype", "bf16"),
    )
    assert (mixed["settings"]["dtype"], mixed["settings"]["autocast"]) == ("fp32", "bf16")
    assert mixed["predicted"] == predicted("--autocast", "bf16")["predicted"]
    for held in ("parameters", "optimizer"):  # fp32 master weights and optimizer state
        assert mixed["predicted"][held] == fp32["predicted"][held] > bf16["predicted"][held]
    # Autocast runs matmuls in bf16 and keeps norms and softmax in fp32: between the two.
    activations = [p["predicted"]["activations"] for p in (bf16, mixed, fp32)]
    assert activations == sorted(activations) and len(set(activations)) == 3


def test_progress_names_each_phase_and_stays_off_pipes(tiny_gpt, monkeypatch) -> None:
    import ckptplan
    from ckptplan.cli.output import Spinner, progress_display
    from ckptplan.progress import QUIET

    class Recorder:
        def __init__(self) -> None:
            self.phases: list[str] = []

        def phase(self, what: str) -> None:
            self.phases.append(what)

    recorder = Recorder()
    ckptplan.solve(tiny_gpt, budget="70%", batch_size=2, progress=recorder)
    assert recorder.phases[:3] == [
        "profiling one training step on fake tensors",
        "solving (auto)",
        "confirming the plan's peak on fake tensors",
    ]
    with progress_display(as_json=False) as shown:  # pytest's streams are no terminals
        assert shown is QUIET
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress_display(as_json=False) as shown:
        assert isinstance(shown, Spinner)
    with progress_display(as_json=True) as shown:
        assert shown is QUIET


def test_one_unit_per_report_and_no_line_twice(run, tiny_gpt, tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    solved = run("solve", tiny_gpt, "--budget", "70%", "--batch-size", "2", "-o", plan_path)
    assert solved.exit_code == 0, solved.output
    outputs = [
        solved.output,
        run("show", plan_path).output,
        run("profile", tiny_gpt, "--batch-size", "2").output,
        run("verify", tiny_gpt, plan_path, "--repeats", "1").output,
        run("sweep", tiny_gpt, "--batch-size", "2", "--points", "2", "--budget", "80%").output,
    ]
    for output in outputs:
        assert len(set(UNITS.findall(output))) == 1, f"two units in one report: {output}"
        assert "Traceback" not in output
        lines = [line for line in output.splitlines() if any(c.isalnum() for c in line)]
        assert len(lines) == len(set(lines)), f"a line said twice: {output}"
    assert "checkpointed regions (4): layers 0-3, a region each" in solved.output


def test_show_prints_the_settings_a_plan_assumed(run, tiny_gpt, tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    args = ["--budget", "100%", "--solver", "none", "--world-size", "4", "--fsdp"]
    solved = run(
        "solve", tiny_gpt, *args, "--dtype", "bf16-mixed", "--target", "h100", "-o", plan_path
    )
    assert solved.exit_code == 0, solved.output
    line = next(x for x in run("show", plan_path).output.splitlines() if x.startswith("made for"))
    assert line == (
        "made for: target h100 · fp32 weights, forward under autocast bf16 · batch 8 (the "
        "model's) · optimizer adamw · fsdp over 4 ranks (figures per rank) · scope step · op "
        "times from the h100 roofline"
    )


def test_sweep_figures_say_what_they_show_and_every_point_is_a_plan(run, tiny_gpt, tmp_path):
    from ckptplan.values.plan import Plan

    svg, plans = tmp_path / "frontier.svg", tmp_path / "plans"
    args = ["--batch-size", "2", "--points", "3", "--budget", "80%"]
    result = run("sweep", tiny_gpt, *args, "--plot", svg, "--save-plans", plans, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    written = sorted(plans.iterdir())
    assert len(written) == len(data["points"]) == len(data["plans"])
    assert {p.name.split("-")[0] for p in written} >= {
        "none",
        "full",
        "sqrt",
        "every",
        "dp",
        "auto",
    }
    for path in written:
        plan = Plan.load(path)
        assert plan.budget.bytes == plan.predicted.peak_bytes
    text = svg.read_text()
    budget = data["budget_bytes"] / 2**20
    for words in (
        "overhead against peak memory, predicted",
        "auto, predicted",
        "budget",
        f"{budget:.2f} MiB",
        "plans for cpu · fp32 · batch 2 · optimizer adamw",
    ):
        assert words in text


def test_a_fallback_to_a_real_step_prints_no_traceback() -> None:
    """DeepSeek-V3's experts run ``aten._grouped_mm``, whose fake kernel refuses float32:
    the profile and the fake run fall back to a real step and say so in one line, and torch's
    fake-tensor logger, which prints the refusal's traceback, stays quiet."""
    pytest.importorskip("transformers")
    model = ROOT / "sample_models" / "zoo" / "hf_deepseek_v3.py"
    done = subprocess.run(
        [sys.executable, "-m", "ckptplan", "solve", str(model), "--budget", "1GiB"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "real step" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_sweep_verify_measures_torch_compiles_budget_beside_the_plans(tiny_gpt) -> None:
    """``sweep --verify`` measured none of compile's budgets ('dict' object has no attribute
    'dtype', logged and skipped)."""
    from ckptplan.api import load_workload
    from ckptplan.values.profile_types import Settings
    from ckptplan.verifying.sweep import SweepOptions, sweep

    options = SweepOptions(points=2, every=(), verify=True, repeats=1, compile_budgets=(0.5,))
    result = sweep(load_workload(tiny_gpt), Settings(batch_size=2), options)
    compiled = [p for p in result.points if p.strategy == "compile-0.5"]
    assert len(compiled) == 1 and compiled[0].measured_peak_bytes is not None
    # Its gradients are measured too (off here: compile's budget redraws dropout masks).
    assert compiled[0].max_grad_abs_diff is not None
