"""Applying: a ``Plan`` installed on a model in place, and what its regions do at run time."""
