"""The ``ckptplan`` command: thin shells over the Python API, and what they print.

The command is its own process, so it sets torch's C++ log level before torch loads: the CPU
allocator's "Memory block of unknown size" warnings, which the profiler's memory tracking
provokes, are torch's bookkeeping, not the user's business (a level the user set is kept).
"""

import os

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
