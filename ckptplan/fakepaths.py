"""Library branches that take another path on fake tensors than in the real step.

Some libraries read a tensor's values to choose a path and, since a fake tensor has none, take
their tracing path instead. transformers asks whether the position ids pack several sequences
into one row (``find_packed_sequence_indices``): in the real step the positions the model makes
itself (an ``arange`` per row) never do, so it builds no mask and attention runs causal; on
fake tensors it assumes they might, and every decoder builds a full float mask that attention
then saves (64 KiB on a 128-token GPT-2, 2.5 MiB over a 4-layer Gemma). The profile, the fake
run and the real step must run the same ops, so here those questions get the real step's
answer. Positions given in the batch keep the library's behaviour (their values are unknown).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch._subclasses.fake_tensor import FakeTensor


@contextmanager
def real_step_paths(inputs: Any) -> Iterator[None]:
    """While active, the library checks above answer as in the real step for ``inputs``."""
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None or (isinstance(inputs, dict) and "position_ids" in inputs):
        yield
        return

    def one_sequence_per_row(position_ids: Any) -> Any:
        return None if isinstance(position_ids, FakeTensor) else original(position_ids)

    masking.find_packed_sequence_indices = one_sequence_per_row
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original
