"""The caller's process state, left as it was by the library's public functions.

Profiling, fake runs and measured steps seed torch's generator (``torch.manual_seed``) so that
a model builds the same weights and draws the same dropout masks on every run. Seeding the
global generator inside ``ckptplan.solve`` would change the random stream of the training
script that called it, so each public entry point runs under a fork of the generators it may
touch: the CPU's, and those of the CUDA devices already initialised (forking every device
would initialise CUDA on all of them, a context per GPU on every rank of a launched job).
The generators are the process's, so a fork is held under ``patching``'s lock (Note
[process-wide patches]): two threads that plan at once take turns, and neither puts back the
other's seeded state as the caller's.

glibc's malloc tuning for steady CPU step times (``memtrack.keep_freed_host_memory``) cannot
be scoped or undone, so the library never makes it: the CLI's timing commands do, in their own
process, and a Python caller who times on the CPU may call it.

Example:
    >>> import torch
    >>> @keeps_random_state
    ... def seeded_draw():
    ...     torch.manual_seed(0)
    ...     return torch.rand(1)
    >>> before = torch.random.get_rng_state()
    >>> _ = seeded_draw()
    >>> torch.equal(before, torch.random.get_rng_state())
    True
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

from ckptplan.patching import exclusive

P = ParamSpec("P")
R = TypeVar("R")


def keeps_random_state(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, run under a fork of the CPU's and the initialised CUDA devices' RNGs, and
    of Python's and (if imported) NumPy's global generators, which ``seed_all`` seeds too."""

    @functools.wraps(function)
    def forked(*args: P.args, **kwargs: P.kwargs) -> R:
        with exclusive():
            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            devices = list(range(torch.cuda.device_count())) if cuda else []
            python = random.getstate()
            numpy = sys.modules.get("numpy")
            numpy_state = numpy.random.get_state() if numpy is not None else None
            try:
                with torch.random.fork_rng(devices=devices):
                    return function(*args, **kwargs)
            finally:
                random.setstate(python)
                if numpy is not None:
                    numpy.random.set_state(numpy_state)

    return forked


def seed_all(seed: int) -> None:
    """Seed torch's, Python's and (if imported) NumPy's global generators: a model may draw
    from any of them in its forward (wav2vec 2.0's SpecAugment masks are drawn with NumPy), and
    two runs compared step for step must draw alike."""
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
