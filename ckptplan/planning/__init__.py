"""Planning: from a ``Profile`` to the torch-free problem, the solver runs that search it, and the
``Plan`` they make."""
