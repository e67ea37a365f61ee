"""Torch's loggers kept quiet while ckptplan runs a step on fake tensors.

When an op's fake kernel refuses what its real kernel runs (``aten._grouped_mm`` in float32),
torch's fake-tensor logger prints the whole traceback on stderr before raising. ckptplan
catches that error and says in one line what it does instead (a real step, or the model's
error), so the traceback is noise: no traceback text is for the user. The loggers' levels are
raised for the run only and restored after it, so the caller's logging is left as it was.

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
from collections.abc import Iterator
from contextlib import contextmanager

_LOGGERS = ("torch._subclasses.fake_tensor",)
"""Torch's loggers that log an exception ckptplan's fake runs catch (``log.exception``)."""


@contextmanager
def torch_logs_quieted() -> Iterator[None]:
    """While active, ``_LOGGERS`` log nothing; also a decorator (``@torch_logs_quieted()``)."""
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
