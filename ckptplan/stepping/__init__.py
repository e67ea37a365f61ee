"""Stepping: one training step, planned or not, eager or compiled, run for its peak memory, on
fake tensors (the fake run) or for real. Planning confirms a candidate plan with it and
verifying measures a plan with it, so it lies below both."""
