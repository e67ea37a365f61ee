"""The functions a rewritten model's code calls besides torch's.

``ckptplan.rewrite``'s module calls them from here; a file ``ckptplan rewrite`` writes holds a
copy of the source of each it calls (``inspect.getsource``), so that it needs only torch. The
selective policy such code runs is ``ckptplan.applying.policy``'s, copied the same way.
"""

from __future__ import annotations

import torch


def if_training(training: bool, when_training: object, otherwise: object) -> object:
    """A value the forward computes from a module's training flag (traced as two constants)."""
    return when_training if training else otherwise


def norm_once(norm: torch.nn.Module, *args: object) -> object:
    """``norm(*args)``; when backward recomputes the region, its running statistics are put
    back as the forward left them (a compiled graph never replays the update)."""
    if torch.compiler.is_compiling() or torch._C._current_graph_task_id() == -1:
        return norm(*args)
    with torch.no_grad():
        kept = [b.clone() for b in norm.buffers(recurse=False)]
    try:
        return norm(*args)
    finally:
        with torch.no_grad():
            for buffer, value in zip(norm.buffers(recurse=False), kept, strict=True):
                buffer.copy_(value)
