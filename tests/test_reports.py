"""What the reports show a person: one memory unit per report, measured times with their
spread, no "≠" beside two identical figures, regions in words; the sweep's plot (the chosen
plan marked, overlapping strategies told apart, the measured spread drawn); and libraries'
noise about ckptplan's own steps dropped during its runs, and only there."""

from __future__ import annotations

import functools
import io
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
from rich.console import Console

import ckptplan
from ckptplan.cli.regions import regions_words
from ckptplan.cli.report import show_plan, show_sweep, show_verification
from ckptplan.quietlogs import fake_run_logs_quieted, library_noise_quieted
from ckptplan.values.plan import Region
from ckptplan.values.policy_types import OpCall, Policy
from ckptplan.values.profile_types import Settings
from ckptplan.verifying.sweep import Sweep, SweepPoint
from ckptplan.verifying.verification import Verification
from ckptplan.wording import ByteUnit

MODELS = Path(__file__).resolve().parent / "models"
MiB = 2**20
UNITS = re.compile(r"\d (GiB|MiB|KiB|B)\b")


def rendered(show, *args) -> str:
    out = io.StringIO()
    show(*args, Console(file=out, width=10_000))
    return out.getvalue()


def test_a_report_reads_in_the_unit_of_its_largest_figure() -> None:
    size = ByteUnit.of(3 * 2**30, 832 * 2**10)
    assert [size(n) for n in (3 * 2**30, 812 * 2**20, 832 * 2**10, 0)] == [
        "3.00 GiB",
        "0.79 GiB",
        "<0.01 GiB",
        "0.00 GiB",
    ]
    assert ByteUnit.of(1536)(1536) == "1.50 KiB" and ByteUnit.of(None, 100)(100) == "100 B"


def test_solve_report_one_unit_and_regions_in_words() -> None:
    plan = ckptplan.solve(MODELS / "tiny_gpt.py", budget="70%", batch_size=2)
    text = rendered(show_plan, plan)
    assert len(set(UNITS.findall(text))) == 1, text
    assert not re.search(r"\d\.0\d\d", text), "no figure written to four decimals"
    regions = next(line for line in text.splitlines() if line.startswith("checkpointed"))
    assert "#" not in regions and " x" not in regions, regions
    assert "batch 2 ·" in text


def test_regions_are_listed_as_a_person_reads_them() -> None:
    ops = ["aten.addmm.default#0", "aten.addmm.default#1", "aten.mm.default#0", "aten.bmm.out#0"]
    keeps = Policy(tuple(map(OpCall.parse, ops)), (OpCall.parse("aten.mean.dim#0"),))
    regions = [
        Region(("blocks.0", "blocks.1", "blocks.2")),
        *(Region((f"blocks.{i}",), policy=keeps) for i in range(3, 11)),
        *(Region((f"head.{i}", f"head.{i + 1}")) for i in (0, 2)),
        Region(("stage",), children=(Region(("stage.0",)), Region(("stage.1",)))),
        *(Region((f"blocks.{i}",), calls=(1,)) for i in range(3, 13)),
    ]
    assert regions_words(regions) == (
        "blocks 0-2 as one region; blocks 3-10, a region each (keeps 4 matmul outputs; "
        "offloads 1 norm statistic); head 0-3 in 2 regions of 2; stage whole, with stage "
        "0-1, a region each inside it; blocks 3-12 (second call), a region each"
    )


def verification(**changes) -> Verification:
    figures = dict(
        device="cpu",
        budget_bytes=300 * MiB,
        predicted_peak_bytes=271 * MiB,
        measured_peak_bytes=271 * MiB + 4,
        baseline_peak_bytes=456 * MiB,
        step_time_ratio=1.18,
        step_time_s=0.118,
        baseline_step_time_s=0.1,
        max_grad_abs_diff=0.0,
        grad_tolerance=1e-6,
        regions=6,
        step_time_ratio_range=(1.15, 1.21),
        tracked_peak_bytes=271 * MiB,
        predicted_overhead=0.2,
    )
    return Verification(**{**figures, **changes})


def test_verify_shows_the_spread_and_no_unequal_sign_beside_equal_figures() -> None:
    text = rendered(show_verification, verification())
    assert "1.18x ± 0.03x" in text and "+18.0% ± 3.0%" in text, text
    assert "≠" not in text and "≈" in text, "271.00 MiB twice, four bytes apart"
    assert len(set(UNITS.findall(text))) == 1
    once = rendered(show_verification, verification(step_time_ratio_range=(1.18, 1.18)))
    assert "1.18x (1 run, no spread)" in once
    apart = rendered(show_verification, verification(tracked_peak_bytes=200 * MiB))
    assert "≠" in apart


def frontier(measured: bool = True) -> Sweep:
    """none and dp's first point on auto's own points, as a real sweep has them."""

    def point(strategy, peak, overhead, spread=0.02):
        return SweepPoint(
            strategy,
            peak,
            overhead,
            regions=int(10 * overhead),
            measured_peak_bytes=peak + MiB if measured else None,
            measured_overhead=overhead + 0.01 if measured else None,
            measured_overhead_range=(overhead - spread, overhead + spread) if measured else None,
        )

    points = [point("none", 400 * MiB, 0.0), point("full", 120 * MiB, 0.5)]
    points += [point("dp", 400 * MiB, 0.0), point("dp", 200 * MiB, 0.3)]
    points += [point("auto", 400 * MiB, 0.0), point("auto", 250 * MiB, 0.1)]
    points += [point("auto", 150 * MiB, 0.25)]
    return Sweep("m.py", Settings(batch_size=2), points, 400 * MiB, "cpu" if measured else None, 3)


def test_the_sweep_plot_marks_the_chosen_plan_and_draws_the_spread(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from ckptplan.verifying.sweep_plot import CHOSEN_LABEL, save_plot, sweep_figure

    result = frontier()
    figure = sweep_figure(result, budget=300 * MiB)
    (axes,) = figure.axes
    lines = {line.get_label(): line for line in axes.get_lines()}
    star = lines[CHOSEN_LABEL]
    assert star.get_marker() == "*"
    assert list(star.get_xdata()) == [250, 251]
    assert list(star.get_ydata()) == pytest.approx([10, 11])
    drawn = [lines[f"{s}, predicted"] for s in ("none", "dp", "auto")]
    assert len({line.get_marker() for line in drawn}) == 3, "each strategy its own marker"
    assert [line.get_zorder() for line in drawn] == sorted(
        (line.get_zorder() for line in drawn), reverse=True
    ), "none over dp over auto, where they coincide"
    assert lines["dp, predicted"].get_linestyle() != lines["auto, predicted"].get_linestyle()
    bars = {c.get_label(): c for c in axes.containers if isinstance(c, ErrorbarContainer)}
    assert len(bars) == 4, "one per measured strategy"
    (auto_bars,) = bars["_auto, measured spread"].lines[2]
    ends = sorted(float(y) for segment in auto_bars.get_segments() for y in segment[:, 1])
    assert ends == pytest.approx([-2, 2, 8, 12, 23, 27]), "from least to greatest of the runs"
    plt.close(figure)
    unmarked = sweep_figure(result)
    assert CHOSEN_LABEL not in [line.get_label() for line in unmarked.axes[0].get_lines()]
    plt.close(unmarked)
    png = tmp_path / "frontier.png"
    save_plot(result, str(png), budget=300 * MiB)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sweep_table_shows_the_spread_in_one_unit() -> None:
    from ckptplan.verifying.sweep_plot import CHOSEN_LABEL, terminal_plot

    text = rendered(lambda result, console: show_sweep(result, console, 300 * MiB), frontier())
    assert "+11.0% ± 2.0%" in text and "timed runs per point" in text, text
    assert len(set(UNITS.findall(text))) == 1
    plot = terminal_plot(frontier(measured=False), 300 * MiB)
    assert "*" in plot and CHOSEN_LABEL in plot


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_torchs_advice_on_compiled_regions_is_not_said_during_fake_runs() -> None:
    """Compiling a selective region makes torch advise against in-place ops in it: said of
    the regions a compiled fake run applies during ``solve``, it reads as a warning about the
    user's model; the user's own compiled step still says it."""
    log = logging.getLogger("torch._higher_order_ops.wrap")
    said = Said()

    def advice_said() -> bool:
        torch._logging.warning_once.cache_clear()  # torch says it once per process
        said.messages.clear()
        contexts = functools.partial(
            torch.utils.checkpoint.create_selective_checkpoint_contexts, _recompute_all
        )
        scope: dict[str, object] = {"torch": torch, "contexts": contexts}
        # A fresh code object each time, so dynamo compiles again rather than reusing its cache.
        exec(
            "def region(x):\n"
            "    return torch.utils.checkpoint.checkpoint(\n"
            "        torch.sin, x, use_reentrant=False, context_fn=contexts)",
            scope,
        )
        torch.compile(scope["region"], backend="aot_eager")(torch.ones(2, requires_grad=True))
        return any("context_fn" in message for message in said.messages)

    log.addHandler(said)
    try:
        assert advice_said(), "the advice this test keeps quiet, said by a compiled region"
        with fake_run_logs_quieted():
            assert not advice_said()
        assert advice_said(), "the caller's own compiled step says it after, as before"
    finally:
        log.removeHandler(said)


def _recompute_all(ctx: object, op: object, *args: object, **kwargs: object) -> object:
    return torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def test_library_noise_is_dropped_inside_ckptplans_runs_and_only_there() -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (1, 8))
    log = logging.getLogger("transformers.modeling_utils")
    said = Said()

    def loss_said() -> bool:
        logging.Logger.warning_once.cache_clear()  # transformers says it once per process
        said.messages.clear()
        model(input_ids=ids, labels=ids)
        return any("`loss_type=None`" in message for message in said.messages)

    log.addHandler(said)
    try:
        before = (list(log.filters), log.level, list(warnings.filters))
        assert loss_said(), "the message this test drops, said by the step"
        with library_noise_quieted():
            assert not loss_said()
            log.warning("a message of the user's own")
            assert said.messages == ["a message of the user's own"], "others still said"
        with fake_run_logs_quieted((DeprecationWarning,)):
            assert not loss_said()
        assert loss_said(), "the caller's own step says it after, as before"
        assert (list(log.filters), log.level, list(warnings.filters)) == before
    finally:
        log.removeHandler(said)
