"""Rewriting: a ``Plan`` baked into a standalone ``torch.fx`` graph and the Python file written from
it."""
