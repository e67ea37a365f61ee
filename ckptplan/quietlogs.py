"""Torch's loggers kept quiet while ckptplan runs a step on fake tensors.

When an op's fake kernel refuses what its real kernel runs (``aten._grouped_mm`` in float32),
torch's fake-tensor logger prints the whole traceback on stderr before raising. ckptplan
catches that error and says in one line what it does instead (a real step, or the model's
error), so the traceback is noise: no traceback text is for the user. The loggers' levels are
raised for the run only and restored after it, so the caller's logging is left as it was.

A fake run of a plan also keeps ckptplan's own logger quiet: it applies the plan, whose report
(``checkpointed N regions``, what the first backward recomputed) is for the user's own run and
would otherwise repeat, once per candidate plan, during ``solve``; so are the warnings of the
plan's guards, for its own step, not the user's.

Example:
    >>> fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    >>> with torch_logs_quieted():
    ...     fake_log.isEnabledFor(logging.ERROR)
    False
    >>> fake_log.isEnabledFor(logging.ERROR)
    True
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_LOGGERS = ("torch._subclasses.fake_tensor",)
"""Torch's loggers that log an exception ckptplan's fake runs catch (``log.exception``)."""
_OWN_LOGGER = "ckptplan"
"""The logger of ``apply``'s report, which a fake run's ``apply`` would repeat."""


@contextmanager
def torch_logs_quieted() -> Iterator[None]:
    """While active, ``_LOGGERS`` log nothing; also a decorator (``@torch_logs_quieted()``)."""
    with _quieted(_LOGGERS):
        yield


@contextmanager
def fake_run_logs_quieted(ignored: tuple[type[Warning], ...] = ()) -> Iterator[None]:
    """While active, ``_LOGGERS`` and ckptplan's own logger log nothing, and warnings of the
    ``ignored`` classes are not shown: for a fake run of a plan, which applies it (and whose
    step is no user's: a plan for an H100 runs it on the CPU); also a decorator."""
    with _quieted((*_LOGGERS, _OWN_LOGGER)), warnings.catch_warnings():
        for category in ignored:
            warnings.simplefilter("ignore", category)
        yield


@contextmanager
def _quieted(names: tuple[str, ...]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
