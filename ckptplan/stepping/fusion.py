"""Which values of a graph inductor never writes to memory: the pointwise ops it inlines into
their users' kernels. The compiled fake run leaves those values uncounted, and the partition's
price leaves out their traffic.
"""

from __future__ import annotations

import torch
import torch.fx

# Note [which values inductor fuses away]
#     Inductor inlines a pointwise op into the kernel of each consumer that is pointwise or a
#     reduction (through views, which become indexing), so its value never reaches memory;
#     a value read by a library kernel (matmul, attention, a fallback op), by the graph's
#     output or by the backward graph is written out. Executed with eager kernels, the
#     decomposed gradient of GELU alone leaves five block-sized temporaries that inductor's
#     one kernel never allocates: the fake run over-counted compiled peaks by 12-15%.


def fused_away(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The pointwise nodes of ``graph`` whose every use fuses into its user's kernel. Random
    ops are pointwise too, drawn inside the kernel, unless ``fallback_random`` has inductor
    call eager's random kernels."""
    fallback = _fallback_random()
    return {
        node
        for node in graph.nodes
        if _pointwise(node, fallback)
        and node.users
        and all(_fuses(u, fallback) for u in node.users)
    }


def in_fused_kernel(node: torch.fx.Node) -> bool:
    """Whether inductor runs ``node`` in a kernel of its own making, which may fuse with its
    neighbours' (a pointwise op or a reduction), rather than calling a library kernel."""
    return node.op == "call_function" and not is_view(node) and _fuses(node, _fallback_random())


def _fallback_random() -> bool:
    from torch._inductor import config as inductor_config

    return bool(inductor_config.fallback_random)


def _pointwise(node: torch.fx.Node, fallback_random: bool) -> bool:
    tags = (torch.Tag.pointwise,) if fallback_random else (torch.Tag.pointwise, _RANDOM)
    return any(_tagged(node, tag) for tag in tags)


_RANDOM = torch.Tag.nondeterministic_seeded


def _fuses(user: torch.fx.Node, fallback_random: bool) -> bool:
    """Whether ``user``'s kernel reads its input from registers: a pointwise or reduction
    kernel, but not eager's random kernel (``native_dropout`` is tagged pointwise), which
    inductor calls on a materialised input under ``fallback_random``."""
    if fallback_random and _tagged(user, _RANDOM):
        return False
    if _tagged(user, torch.Tag.pointwise) or _tagged(user, torch.Tag.reduction):
        return True
    if is_view(user):
        return bool(user.users) and all(_fuses(u, fallback_random) for u in user.users)
    return False


def _tagged(node: torch.fx.Node, tag: torch.Tag) -> bool:
    target = node.target
    return node.op == "call_function" and tag in getattr(target, "tags", ())


def is_view(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return (
        node.op == "call_function"
        and schema is not None
        and bool(schema.returns)
        and schema.returns[0].alias_info is not None
        and not schema.returns[0].alias_info.is_write
    )
