"""``hf:DIR``: a Hugging Face model planned from its config folder alone, task and batch
synthesised from the config, through the CLI as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)

transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

import ckptplan  # noqa: E402
from ckptplan.cli.main import cli  # noqa: E402
from ckptplan.errors import CkptplanError  # noqa: E402
from ckptplan.hub import HubModel  # noqa: E402
from tests.test_cli import assert_one_line_error  # noqa: E402

SMALL = {"num_hidden_layers": 4, "num_attention_heads": 2}
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=256,
        architectures=["GPT2LMHeadModel"],
    ),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_key_value_heads=2,
        max_position_embeddings=256,
        architectures=["LlamaForCausalLM"],
        **SMALL,
    ),
    "bert": lambda: transformers.BertConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=256,
        architectures=["BertForMaskedLM"],
        **SMALL,
    ),
    "vit": lambda: transformers.ViTConfig(
        hidden_size=32,
        intermediate_size=64,
        image_size=128,
        patch_size=8,
        num_labels=10,
        architectures=["ViTForImageClassification"],
        **SMALL,
    ),
    "t5": lambda: transformers.T5Config(
        vocab_size=128,
        d_model=32,
        d_ff=64,
        d_kv=16,
        num_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        architectures=["T5ForConditionalGeneration"],
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, make in CONFIGS.items():
        folder = tmp_path_factory.mktemp(name)
        make().save_pretrained(folder)
        out[name] = folder
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_solve_plans_a_config_folder(folders, name: str, tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    args = ["solve", f"hf:{folders[name]}", "--budget", "60%", "--batch-size", "2"]
    args += ["-o", str(plan_path)] + ([] if name == "vit" else ["--seq-len", "256"])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    plan = ckptplan.Plan.load(plan_path)
    assert plan.regions, "the layers are found and planned"
    assert plan.predicted.fake_run_peak_bytes <= plan.budget.bytes


def test_the_task_comes_from_the_architectures(folders) -> None:
    tasks = {n: HubModel(str(folders[n])).resolved_task for n in CONFIGS}
    assert tasks == {
        "gpt2": "causal-lm",
        "llama": "causal-lm",
        "bert": "masked-lm",
        "vit": "image-classification",
        "t5": "seq2seq-lm",
    }
    model = HubModel(str(folders["bert"]), task="sequence-classification").build()
    assert type(model).__name__ == "BertForSequenceClassification"


def test_hub_flags_with_a_model_file_are_refused(tiny_gpt) -> None:
    result = CliRunner().invoke(cli, ["solve", str(tiny_gpt), "--budget", "1GB", "--seq-len", "8"])
    assert_one_line_error(result, "--seq-len", "hf:")


def test_a_sequence_longer_than_the_model_takes_is_refused(folders) -> None:
    with pytest.raises(CkptplanError, match="longer than"):
        HubModel(str(folders["gpt2"]), seq_len=4096).inputs(1)


def test_verify_measures_the_sequence_length_the_plan_was_made_for(folders, tmp_path) -> None:
    """``verify hf:DIR plan.json`` without ``--seq-len`` measures the plan's sequences (it
    measured 512 tokens against a plan for 128, 66.7% off, and exited 1)."""
    plan_path = tmp_path / "plan.json"
    model = f"hf:{folders['gpt2']}"
    args = ["solve", model, "--budget", "95%", "--seq-len", "128", "--batch-size", "2"]
    assert CliRunner().invoke(cli, [*args, "-o", str(plan_path)]).exit_code == 0
    result = CliRunner().invoke(cli, ["verify", model, str(plan_path), "--json", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)
    off = abs(measured["measured_peak_bytes"] - measured["predicted_peak_bytes"])
    assert off <= 0.05 * measured["measured_peak_bytes"]


def test_sizes_not_given_are_the_plans() -> None:
    recorded = {"input_ids": [[2, 128], "torch.int64"], "labels": [[2, 128], "torch.int64"]}
    assert HubModel("x").sized_as(recorded).seq_len == 128
    assert HubModel("x", seq_len=64).sized_as(recorded).seq_len == 64
    pixels = {"pixel_values": [[2, 3, 96, 96], "torch.float32"]}
    assert HubModel("x").sized_as(pixels).image_size == 96


def test_fit_finds_the_longest_sequence_that_fits(folders) -> None:
    model = HubModel(str(folders["gpt2"]))
    answer = ckptplan.fit(model, budget="3MB", vary="seq-len")
    sizes = {p.size: p for p in answer.points}
    assert sizes[answer.largest].fits and not sizes[answer.largest + 1].fits
    assert answer.largest < 256  # below the config's positions, so the budget decides
