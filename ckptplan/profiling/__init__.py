"""Profiling: one training step, run on fake tensors, recorded per op and priced as a chain of
blocks (a ``Profile``)."""
