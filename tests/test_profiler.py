"""The fake-tensor profiler: blocks found, costs measured, nothing allocated."""

import re
import resource

import pytest
import torch

from ckptplan.devices import get_device
from ckptplan.errors import CkptplanError
from ckptplan.loading import call_model, load_model_file
from ckptplan.profiling.profiler import Settings, profile_model
from ckptplan.profiling.steptiming import checkpointed
from ckptplan.profiling.units import find_units
from tests.conftest import MODELS, ROOT

pytestmark = pytest.mark.slow  # the default tier keeps one case of each behaviour (README)


def test_finds_the_layers_and_measures_them(tiny_gpt) -> None:
    profile = profile_model(load_model_file(tiny_gpt), Settings(batch_size=4))
    assert [b.path for b in profile.blocks] == [f"layers.{i}" for i in range(6)]
    first, *rest = profile.blocks
    assert not first.joins_previous and all(b.joins_previous for b in rest)
    for block in profile.blocks:
        assert block.saved_bytes > 0 and block.input_kept
        assert block.fwd_peak >= block.fwd_start > profile.persistent_bytes
        assert block.bwd_peak >= block.bwd_start
        assert block.flops_fwd > 0 and block.flops_bwd > block.flops_fwd
    # Forward accumulates what backward releases: live bytes grow block by block.
    starts = [b.fwd_start for b in profile.blocks]
    assert starts == sorted(starts)
    assert profile.peak_bytes == max(p for _, _, p in profile.phases)


def test_batch_size_scales_activations(tiny_gpt) -> None:
    small = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2))
    large = profile_model(load_model_file(tiny_gpt), Settings(batch_size=8))
    assert large.blocks[0].saved_bytes == pytest.approx(4 * small.blocks[0].saved_bytes, rel=0.05)
    assert large.parameter_bytes == small.parameter_bytes


def test_optimizer_state_is_counted(tiny_gpt) -> None:
    adamw = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2, optimizer="adamw"))
    sgd = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2, optimizer="sgd"))
    none = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2, optimizer="none"))
    assert none.optimizer_bytes == 0
    assert sgd.optimizer_bytes == pytest.approx(sgd.parameter_bytes, rel=0.01)
    assert adamw.optimizer_bytes >= 2 * adamw.parameter_bytes


def test_a_40gb_model_is_profiled_without_allocating_it() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    profile = profile_model(load_model_file(MODELS / "huge_mlp.py"), Settings())
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert profile.parameter_bytes > 40e9
    assert len(profile.blocks) == 4
    assert grown_kib < 1_000_000


def test_blocks_pattern_overrides(tiny_gpt) -> None:
    file = load_model_file(tiny_gpt)
    model, inputs = file.build(), file.inputs(2)

    def units(pattern: str) -> list[str]:
        return [p for p, _ in find_units(model, lambda: call_model(model, inputs), pattern)]

    assert units("layers.3,layers.1") == ["layers.1", "layers.3"]
    assert units("layers.*")[:2] == ["layers.0", "layers.1"]
    with pytest.raises(CkptplanError, match="matches no module"):
        units("decoder.*")


def test_blocks_that_do_not_chain_are_not_joined() -> None:
    unet = profile_model(
        load_model_file(ROOT / "sample_models" / "unet.py"), Settings(batch_size=1)
    )
    assert unet.blocks
    assert all(b.input_bytes > 0 for b in unet.blocks)


def test_a_model_without_repeated_blocks(write_model) -> None:
    path = write_model(
        "import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n"
        "def example_inputs(batch_size=2):\n    return (torch.randn(batch_size, 4),)\n"
    )
    with pytest.raises(CkptplanError, match=r"name the blocks with blocks; no submodule here"):
        profile_model(load_model_file(path), Settings())


_NAMED_LAYERS = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.drop = nn.Dropout(0.1)
        self.mixer = MIXER
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        hidden = self.mixer(self.drop(self.embed(ids)))
        return self.head(hidden[0] if isinstance(hidden, tuple) else hidden)

def build_model():
    return Net()

def example_inputs(batch_size=2):
    return (torch.randint(0, 64, (batch_size, 16)),)

def loss_fn(logits):
    return logits.square().mean()
"""


@pytest.mark.parametrize(
    "mixer",
    [
        "nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.LayerNorm(32))",  # one of each class
        "nn.LSTM(32, 32, num_layers=2, batch_first=True, dropout=0.2)",  # kept whole (layered_rnn)
    ],
)
def test_the_blocks_an_error_suggests_are_accepted(write_model, mixer: str) -> None:
    """A model of named layers (no repeated blocks) is refused with a --blocks value that
    profiles: siblings of the model that are called once and hold weights, not the first
    module paths (``drop``, nested in nothing, and a container's first child)."""
    path = write_model(_NAMED_LAYERS.replace("MIXER", mixer))
    with pytest.raises(CkptplanError) as refused:
        profile_model(load_model_file(path), Settings())
    suggested = re.search(r"e\.g\. blocks='([^']+)'", str(refused.value))
    assert suggested, str(refused.value)
    assert suggested.group(1) == "embed,mixer,head"
    profile = profile_model(load_model_file(path), Settings(blocks=suggested.group(1)))
    assert [b.path for b in profile.blocks] == ["embed", "mixer", "head"]


def test_ops_carry_module_paths_and_flags(tiny_gpt) -> None:
    profile = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2))
    modules = {op.module for op in profile.ops}
    assert "layers.0.attn" in modules and "layers.5.mlp.0" in modules
    dropout = [op for op in profile.ops if op.random]
    assert dropout and all(op.module.startswith(("layers.", "")) for op in dropout)
    matmuls = [op for op in profile.ops if "addmm" in op.op or "mm" in op.op]
    assert sum(op.flops for op in matmuls) == pytest.approx(profile.flops, rel=0.2)
    # Block costs are sums over the block's ops.
    fwd0 = sum(op.time for op in profile.ops if op.phase == "fwd:0")
    assert profile.blocks[0].time_fwd == pytest.approx(fwd0)
    assert all(b.random for b in profile.blocks)


def test_batchnorm_blocks_are_flagged() -> None:
    resnet = profile_model(
        load_model_file(ROOT / "sample_models" / "resnet.py"), Settings(batch_size=1)
    )
    assert all(b.stateful for b in resnet.blocks)


def test_bf16_halves_activations(tiny_gpt) -> None:
    fp32 = profile_model(load_model_file(tiny_gpt), Settings(batch_size=4))
    bf16 = profile_model(load_model_file(tiny_gpt), Settings(batch_size=4, dtype="bf16"))
    assert bf16.parameter_bytes == fp32.parameter_bytes // 2
    assert bf16.blocks[0].input_bytes == fp32.blocks[0].input_bytes // 2
    # Masks (bool) and normalisation statistics (fp32) do not halve.
    assert bf16.blocks[0].saved_bytes < 0.8 * fp32.blocks[0].saved_bytes


def test_autocast_changes_what_is_saved(tiny_gpt) -> None:
    plain = profile_model(load_model_file(tiny_gpt), Settings(batch_size=4))
    mixed = profile_model(load_model_file(tiny_gpt), Settings(batch_size=4, autocast="bf16"))
    assert mixed.parameter_bytes == plain.parameter_bytes
    assert mixed.blocks[0].saved_bytes != plain.blocks[0].saved_bytes


def test_measured_times_replace_the_roofline(tiny_gpt) -> None:
    measured = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2, measure=True))
    estimated = profile_model(load_model_file(tiny_gpt), Settings(batch_size=2))
    assert measured.step_time > 0 and measured.step_time != estimated.step_time
    assert all(b.time_fwd > 0 for b in measured.blocks)
    assert measured.peak_bytes == estimated.peak_bytes
    assert measured.policy_op_time >= 0.0
    assert estimated.policy_op_time == get_device("cpu").policy_op_time


class _CountingLinear(torch.nn.Linear):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


def test_timing_a_policy_checkpoints_blocks_only_for_the_while() -> None:
    plain, own = _CountingLinear(4, 4), torch.nn.Linear(4, 4)
    own.forward = lambda x: x + 1  # a forward set on the instance, which must come back
    x = torch.randn(2, 4, requires_grad=True)
    with checkpointed([("plain", plain), ("own", own)], None):
        plain(x).sum().backward()
    assert plain.calls == 2, "checkpointed: the backward ran the forward again"
    plain(x).sum().backward()
    assert plain.calls == 3, "plain again once the timing is done"
    assert "forward" not in plain.__dict__ and own(x).equal(x + 1)
