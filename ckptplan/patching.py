"""The one way ckptplan patches process-wide state, under one lock.

Note [process-wide patches]: planning runs in the caller's process, so whatever it patches
there (an attribute of torch, a library module, a shared logger, an environment variable) every
thread of that process sees while the patch holds. Each patch that has no scoped route (a
dispatch mode, a hook on the model at hand, an argument) goes through ``patched`` or
``patched_env``: they take one lock, patch, and put the caller's own object back in
``finally``. Two threads that plan at once then patch in turn, and neither restores the
other's replacement as the original. The lock is re-entrant: a thread's patches nest (a fake
run quiets the loggers, then counts the RNG states). The patches kept, each with its reason
where it is made:

- ``torch.nn.Module._apply`` (``loading``): a fake parameter is converted by swapping it with
  its copy, which torch refuses while the fake mode holds a weak reference to it; the model is
  being built, so no instance exists yet to hook.
- ``torch.get_rng_state`` (``profiling.memtrack``): ``torch.utils.checkpoint`` stashes the RNG
  state through it, outside aten dispatch, where no dispatch mode sees the tensor.
- transformers' ``masking_utils.find_packed_sequence_indices`` (``profiling.fakepaths``): the
  library calls its own module global; no argument answers it without changing the step.
- FSDP2's ``alloc_storage``/``free_storage`` (``planning.distributed``): they resize a storage
  in place, which no dispatcher op reports.
- the ``disabled`` flag and ``filters`` of a few loggers (``quietlogs``): a logger is one object
  per process; the caller's own list of filters is put back, not edited.
- ``KINETO_LOG_LEVEL`` (``profiling.allocmeter``): kineto reads it when the profiler first
  starts; ``torch.profiler`` takes no log level.
- functorch's ``activation_memory_budget`` (``verifying.peers``) and ``enable_autograd_cache``
  (``stepping.compiled``), inductor's ``fx_graph_cache`` and ``fallback_random``
  (``stepping.inductor_memory``, ``verifying.verification``): the compilers read only their
  configs.
- inductor's ``PythonWrapperCodegen.memory_plan_reuse`` (``stepping.inductor_memory``): the
  one point where the lowered graph's buffer plan can be read before it is run.
- the global random generators (``callerstate``): a public entry point seeds them for its
  runs and puts the caller's states back; models draw from them, not from a generator passed.
- the warnings filters (``quietlogs``): Python's filters are one list per process, which
  ``warnings.catch_warnings`` saves and puts back.

Example:
    >>> import types
    >>> owner = types.SimpleNamespace(value=1)
    >>> with patched(owner, "value", 2):
    ...     owner.value
    2
    >>> owner.value
    1
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOCK = threading.RLock()
"""Held while any process-wide patch of ckptplan's holds (see the Note above)."""


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` while active; the original object is put back after."""
    with _LOCK:
        own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, value)
        try:
            yield
        finally:
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


@contextmanager
def patched_env(name: str, value: str) -> Iterator[None]:
    """The environment variable ``name`` is ``value`` while active, unless the caller set it
    (then it is left as the caller set it)."""
    with _LOCK:
        if name in os.environ:
            yield
            return
        os.environ[name] = value
        try:
            yield
        finally:
            os.environ.pop(name, None)


@contextmanager
def exclusive() -> Iterator[None]:
    """The lock alone, for a save, set and restore of process state that ``torch`` or Python
    makes (``torch.random.fork_rng``) rather than an attribute this module sets."""
    with _LOCK:
        yield


@contextmanager
def patched_config(config: Any, **changes: Any) -> Iterator[None]:
    """torch's ``config.patch(**changes)`` (a module-wide setting) under the same lock."""
    with _LOCK, config.patch(**changes):
        yield


@contextmanager
def caught_warnings() -> Iterator[None]:
    """``warnings.catch_warnings()`` (the process's one list of filters) under the same lock."""
    with _LOCK, warnings.catch_warnings():
        yield
