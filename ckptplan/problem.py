"""From a Profile to the torch-free chain problem the solvers take.

``scope="step"`` budgets the whole step (parameters, gradients, optimizer state, batch,
activations); ``scope="activations"`` budgets activations alone, so the persistent bytes and
the gradients present at each event are taken out of every figure.
"""

from __future__ import annotations

from ckptplan.errors import CkptplanError
from ckptplan.options import SCOPES
from ckptplan.profiler import Profile
from ckptplan.solvers.chain import Chain, ChainBlock


def to_chain(profile: Profile, scope: str = "step") -> Chain:
    if scope not in SCOPES:
        raise CkptplanError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
    if scope == "step":
        return Chain(
            blocks=tuple(
                ChainBlock(
                    name=b.path,
                    fwd_time=b.time_fwd,
                    input_bytes=b.input_bytes,
                    saved_bytes=b.saved_bytes,
                    input_kept=b.input_kept,
                    fwd_start=b.fwd_start,
                    fwd_peak=b.fwd_peak,
                    fwd_peak_nograd=b.fwd_peak_nograd,
                    bwd_start=b.bwd_start,
                    bwd_peak=b.bwd_peak,
                    joins_previous=b.joins_previous,
                )
                for b in profile.blocks
            ),
            tail_peaks=profile.tail_peaks,
            fixed_peaks=profile.fixed_peaks,
        )
    base = profile.persistent_bytes
    blocks = []
    for b in profile.blocks:
        grads = b.grads_at_bwd_end
        blocks.append(
            ChainBlock(
                name=b.path,
                fwd_time=b.time_fwd,
                input_bytes=b.input_bytes,
                saved_bytes=b.saved_bytes,
                input_kept=b.input_kept,
                fwd_start=b.fwd_start - base,
                fwd_peak=b.fwd_peak - base,
                fwd_peak_nograd=b.fwd_peak_nograd,
                bwd_start=b.bwd_start - base - (grads - b.parameter_bytes),
                bwd_peak=b.bwd_peak - base - grads,
                joins_previous=b.joins_previous,
            )
        )
    last_grads = profile.blocks[-1].grads_at_bwd_end - profile.blocks[-1].parameter_bytes
    return Chain(
        blocks=tuple(blocks),
        tail_peaks=(
            (profile.tail_peaks[0][0] - base, profile.tail_peaks[0][1]),
            (profile.tail_peaks[1][0] - base - last_grads, profile.tail_peaks[1][1]),
        ),
        fixed_peaks=tuple(
            (max(0, v - base - profile.gradient_bytes), e) for v, e in profile.fixed_peaks
        ),
    )
