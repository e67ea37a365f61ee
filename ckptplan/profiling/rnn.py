"""The memory of recurrent layers' kernels, which their fake kernels do not show.

``nn.LSTM`` on the CPU runs one oneDNN kernel per layer and direction
(``aten.mkldnn_rnn_layer``). Besides its output it returns a workspace that autograd saves for
backward, and its fake kernel returns that workspace empty: 2 MiB on torch 2.13 for 32 steps
of 8 sequences and 128 hidden units (about 15 floats per step, sequence and unit, in whole
pages), so a 4-layer stack of LSTMs was predicted at 21.8 MiB and measured at 65.0 MiB. Here
each signature's kernel is run once for real, on zeros of the same shapes, and the workspace
is counted at the size it had (``workspace_bytes``). Forward and backward also allocate
scratch inside the kernel (6.4 and 8.7 MiB at 128 steps, 8 sequences, 256 units), which
``ckptplan.profiling.workspace`` measures with the real arguments given here
(``real_arguments``: the backward needs a real workspace, made by a real forward).

``nn.GRU`` and ``nn.RNN`` on the CPU run as ordinary aten ops per time step, which fake tensors
size exactly: nothing to correct.

On a CUDA GPU all three run cuDNN (``aten._cudnn_rnn``), whose reserve space (what forward
leaves for backward) its fake kernel also returns empty. Its size comes from
``cudnnGetRNNTempSpaceSizes`` on the device, which cannot be called here and has no published
formula; ``cudnn_reserve_bytes`` is a conservative estimate instead (see there), used for
``_cudnn_rnn`` on fake CUDA tensors and for the CPU kernel of a plan profiled for a GPU. It is
not measured: no GPU was at hand when it was written. The scratch cuDNN allocates inside its
kernels is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ckptplan.applying.gpukernels import emulated
from ckptplan.applying.layered_rnn import splits

aten = torch.ops.aten
FORWARD = aten.mkldnn_rnn_layer.default
BACKWARD = aten.mkldnn_rnn_layer_backward.default
CUDNN = aten._cudnn_rnn.default
CPU_KERNELS = frozenset({FORWARD, BACKWARD})
"""The CPU's recurrent kernels: their outputs and scratch are measured on real tensors."""
CALIBRATION_LIMIT = 1 << 30
"""Bytes of a layer's inputs above which its kernel is not run; its workspace is then bounded
(``_cpu_bound``)."""
_GATES = {0: 1, 1: 1, 2: 4, 3: 4}
"""cuDNN's modes (RNN_RELU, RNN_TANH, LSTM, GRU) -> gate pre-activations kept per unit. GRU
has three gates but keeps its hidden projection apart for the reset gate: four."""


@dataclass(frozen=True)
class _Layer:
    """One recurrent call's sizes, as a reserve bound needs them."""

    mode: int
    steps: int
    batch: int
    hidden: int
    output: int
    layers: int
    directions: int
    element: int
    dropout: float = 0.0


_workspaces: dict[Any, int] = {}
"""Forward signature -> the real kernel's workspace bytes, measured once per process."""


def workspace_bytes(func: Any, args: Any, tensor: torch.Tensor) -> int:
    """Bytes the real kernel gives ``tensor`` when it is a recurrent kernel's workspace (or
    cuDNN's reserve) returned empty by a fake kernel; 0 for anything else."""
    if tensor.dtype != torch.uint8 or tensor.untyped_storage().nbytes():
        return 0
    if func is CUDNN:
        return cudnn_reserve_bytes(_cudnn_layer(args))
    if func is not FORWARD or not (args[-1] and torch.is_grad_enabled()):
        return 0  # the kernel keeps nothing in eval mode or without autograd
    if emulated():
        return cudnn_reserve_bytes(_mkldnn_layer(args))
    key = _signature(args)
    if key not in _workspaces:
        _workspaces[key] = _measured_workspace(args)
    return _workspaces[key]


def stacked_layers_advice(modules: dict[str, torch.nn.Module]) -> str:
    """The end of the error for a model with no blocks to find, where its layers are one
    multi-layer recurrent module that ``layer_by_layer`` leaves whole (dropout between its layers,
    or a subclass): checkpointed whole, it recomputes every layer at once in backward, where an
    unchecked step peaks too, so its layers should be modules of their own."""
    for path, module in modules.items():
        if isinstance(module, torch.nn.RNNBase) and module.num_layers > 1 and not splits(module):
            kind = type(module).__name__
            why = f"dropout={module.dropout} between layers" if module.dropout else "a subclass"
            return (
                f"; {path} (an nn.{kind} of {module.num_layers} layers, {why}) is one block, "
                "and checkpointed whole it recomputes all its layers at once in backward: to "
                f"plan them one by one, build them as an nn.ModuleList of one-layer nn.{kind}s (as "
                "sample_models/zoo/lstm_stack.py does)"
            )
    return ""


def cudnn_reserve_bytes(layer: _Layer) -> int:
    """A conservative estimate of cuDNN's training reserve for ``layer``, not measured.

    Backward needs, per layer, direction, step and sequence, the gates and the states: this
    counts every gate twice (before and after its activation), the cell and hidden states and
    the output, at the layer's precision, and with dropout between layers each layer's dropped
    output: 11 values per unit and step for an LSTM, where the minimum is 6.
    """
    per_step = (2 * _GATES[layer.mode] + 2) * layer.hidden + layer.output
    dropped = layer.output if layer.dropout else 0
    cells = layer.layers * layer.directions * (layer.steps + 1) * layer.batch
    return cells * (per_step + dropped) * layer.element


def real_arguments(func: Any, args: Any) -> Any:
    """Real zeros in place of ``args``' fake tensors, for measuring the kernel's scratch; a
    backward's workspace is the one a real forward over the same zeros returns."""
    real = _zeros(args)
    if func is BACKWARD:
        forward = (*real[:7], real[13], real[20], *real[14:18], real[19], real[21], real[18])
        with _disable_current_modes(), torch.enable_grad():
            real = (*real[:-1], FORWARD(*forward)[3])
    return real


def _measured_workspace(args: Any) -> int:
    tensors = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
    if sum(t.numel() * t.element_size() for t in tensors) > CALIBRATION_LIMIT:
        return _cpu_bound(args)
    real = _zeros(args)
    with _disable_current_modes(), torch.enable_grad():
        return int(FORWARD(*real)[3].untyped_storage().nbytes())


def _cpu_bound(args: Any) -> int:
    """An upper bound of the oneDNN workspace: 16 floats per step (and one more), sequence and
    unit of the wider of input and hidden size padded to 16, and 64 KiB; it held every size
    tried on torch 2.13 (up to 2.8 times the real one, at most 0.96 of the bound)."""
    layer = _mkldnn_layer(args)
    width = -(-max(args[0].shape[-1], layer.hidden) // 16) * 16
    return 64 * (layer.steps + 1) * layer.batch * width + (64 << 10)


def _zeros(args: Any) -> Any:
    with _disable_current_modes():
        return pytree.tree_map_only(torch.Tensor, _zeros_like, args)


def _zeros_like(t: torch.Tensor) -> torch.Tensor:
    real = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cpu")
    return real.zero_()


def _mkldnn_layer(args: Any) -> _Layer:
    """``mkldnn_rnn_layer(input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode,
    hidden_size, num_layers, has_biases, bidirectional, batch_first, train)``: one layer and
    one direction per call, its input time-major whatever ``batch_first`` says (torch's LSTM
    transposes it first)."""
    x, hidden = args[0], args[10]
    return _Layer(args[9], x.shape[0], x.shape[1], hidden, hidden, 1, 1, x.element_size())


def _cudnn_layer(args: Any) -> _Layer:
    """``_cudnn_rnn(input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size,
    proj_size, num_layers, batch_first, dropout, train, bidirectional, batch_sizes, ...)``."""
    x, mode, hidden, proj, layers, batch_first = args[0], *args[6:11]
    dropout, train, bidirectional, batch_sizes = args[11:15]
    if not train:
        return _Layer(mode, 0, 0, hidden, hidden, 0, 1, x.element_size())
    if batch_sizes:  # packed: the steps are batch_sizes, the sequences at most its first
        steps, batch = len(batch_sizes), int(batch_sizes[0])
    else:
        steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    directions = 2 if bidirectional else 1
    output = proj or hidden
    dropped = dropout if layers > 1 else 0.0
    return _Layer(mode, steps, batch, hidden, output, layers, directions, x.element_size(), dropped)


def _signature(args: Any) -> Any:
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
        for a in pytree.tree_leaves(args)
    )
