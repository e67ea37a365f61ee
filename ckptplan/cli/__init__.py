"""The ``ckptplan`` command: thin shells over the Python API, and what they print."""
