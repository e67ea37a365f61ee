"""How many FSDP ranks a budget needs, for a budget no plan on one rank fits.

Checkpointing every block still leaves a rank its parameters, gradients, optimizer state and
one block's activations. When that is over the budget the useful answer is not "use a larger
budget" (the GPU has the memory it has) but how far to shard: under FSDP2 the persistent bytes
fall with the world size while the activations stay, so the least feasible peak per rank falls
monotonically with it (``distributed.per_rank``) and a bisection over powers of two finds the
least world size whose segments plan fits. Past ``MAX_RANKS`` the activations alone are over:
sharding does not help, and the message says what does.
"""

from __future__ import annotations

from ckptplan.errors import option
from ckptplan.planning.distributed import per_rank
from ckptplan.planning.problem import to_chain
from ckptplan.solvers import run_solver
from ckptplan.solvers.chain import InfeasibleBudget
from ckptplan.values.budget import format_bytes
from ckptplan.values.profile_types import Profile

MAX_RANKS = 1024


def least_rank_peak(whole: Profile, world_size: int, scope: str) -> int:
    """The least peak of one of ``world_size`` FSDP ranks, checkpointing by segments."""
    chain = to_chain(per_rank(whole, world_size, "fsdp"), scope)
    try:
        return run_solver("dp", chain, 0).peak
    except InfeasibleBudget as exc:
        return exc.least_peak


def ranks_that_fit(whole: Profile, aim: int, scope: str, at_least: int = 1) -> int | None:
    """The least power-of-two world size above ``at_least`` whose FSDP ranks fit ``aim``, or
    None when not even ``MAX_RANKS`` do."""
    sizes = [n for n in (2**k for k in range(1, 11)) if n > at_least]
    if not sizes or least_rank_peak(whole, sizes[-1], scope) > aim:
        return None
    low, high = -1, len(sizes) - 1  # sizes[high] fits; sizes[low] does not (or is none)
    while high - low > 1:
        middle = (low + high) // 2
        if least_rank_peak(whole, sizes[middle], scope) <= aim:
            high = middle
        else:
            low = middle
    return sizes[high]


def sharding_advice(whole: Profile, aim: int, scope: str, world_size: int) -> str:
    """What to shard to fit ``aim``, as the tail of a one-line refusal."""
    if not whole.blocks:
        return ""
    ranks = ranks_that_fit(whole, aim, scope, world_size if world_size > 1 else 1)
    if ranks is None:
        least = least_rank_peak(whole, MAX_RANKS, scope)
        return (
            f"; sharding cannot fit it: even over {MAX_RANKS} FSDP ranks a rank needs "
            f"{format_bytes(least)}, for activations that sharding leaves whole: shorten the "
            "sequence or the batch"
        )
    return (
        f", or shard the model: {option('world_size', ranks)} {option('strategy', 'fsdp')} "
        f"fits ({format_bytes(least_rank_peak(whole, ranks, scope))} per rank at least)"
    )
