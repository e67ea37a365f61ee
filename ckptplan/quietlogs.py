"""Torch's loggers kept quiet while ckptplan runs a step on fake tensors.

When an op's fake kernel refuses what its real kernel runs (``aten._grouped_mm`` in float32),
torch's fake-tensor logger prints the whole traceback on stderr before raising. ckptplan
catches that error and says in one line what it does instead (a real step, or the model's
error), so the traceback is noise: no traceback text is for the user. The loggers are disabled
for the run only (their ``disabled`` flag, which ``isEnabledFor`` reads first) and enabled
after it, so the caller's logging is left as it was.

Libraries' messages about a step that ckptplan runs, not the user, are dropped during those
runs too (``huggingface.LOG_NOISE``: transformers' "`loss_type=None` ... unrecognized", said of
the profiled step of a model class it names no loss for, whose own default loss ckptplan runs):
a filter on the library's logger for the run only, so the caller's loggers say what they said
before.

A fake run of a plan also keeps ckptplan's own logger quiet: it applies the plan, whose report
(``checkpointed N regions``, what the first backward recomputed) is for the user's own run and
would otherwise repeat, once per candidate plan, during ``solve``; so are the warnings of the
plan's guards, for its own step, not the user's, and torch's advice on compiling a selective
region, which the compiled fake runs' regions would draw.

A logger is one object per process, and so is the list of warnings filters, so all three are
process-wide patches, made under ``patching``'s lock (Note [process-wide patches]): a flag set
and put back, a logger's list of filters replaced by a longer copy for the run and the caller's
own list put back, and ``warnings.catch_warnings``.

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
import re
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from ckptplan.huggingface import LOG_NOISE
from ckptplan.patching import caught_warnings, patched

_LOGGERS = ("torch._subclasses.fake_tensor",)
"""Torch's loggers that log an exception ckptplan's fake runs catch (``log.exception``)."""
_OWN_LOGGER = "ckptplan"
"""The logger of ``apply``'s report, which a fake run's ``apply`` would repeat."""
_REGION_ADVICE_LOGGER = "torch._higher_order_ops.wrap"
"""Torch's advice on every compiled checkpoint given a ``context_fn`` ("make sure the region
does not contain in-place ops"): said of the regions a compiled fake run applies, during
``solve``, where it reads as a warning about the user's model."""


class _DropNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextmanager
def library_noise_quieted() -> Iterator[None]:
    """While active, the library messages of ``LOG_NOISE`` are dropped; the loggers' filters are
    as the caller left them after. ``torch_logs_quieted`` and ``fake_run_logs_quieted`` hold it,
    and so does every command's run under the CLI (``cli.output.progress_display``).

    Example:
        >>> log = logging.getLogger("transformers.modeling_utils")
        >>> record = log.makeRecord(log.name, logging.WARNING, "", 0, "`loss_type=None` was set "
        ...     "in the config but it is unrecognized.", None, None)
        >>> with library_noise_quieted():
        ...     log.filter(record)
        False
        >>> bool(log.filter(record))
        True
    """
    with ExitStack() as patches:
        for name, pattern in LOG_NOISE.items():
            logger = logging.getLogger(name)
            noisy = [*logger.filters, _DropNoise(pattern)]
            patches.enter_context(patched(logger, "filters", noisy))
        yield


@contextmanager
def torch_logs_quieted() -> Iterator[None]:
    """While active, ``_LOGGERS`` log nothing and the libraries' noise is dropped; also a
    decorator (``@torch_logs_quieted()``)."""
    with _quieted(_LOGGERS), library_noise_quieted():
        yield


@contextmanager
def fake_run_logs_quieted(ignored: tuple[type[Warning], ...] = ()) -> Iterator[None]:
    """While active, ``_LOGGERS`` and ckptplan's own logger log nothing, and warnings of the
    ``ignored`` classes are not shown: for a fake run of a plan, which applies it (and whose
    step is no user's: a plan for an H100 runs it on the CPU); also a decorator."""
    with (
        _quieted((*_LOGGERS, _OWN_LOGGER, _REGION_ADVICE_LOGGER)),
        library_noise_quieted(),
        caught_warnings(),
    ):
        for category in ignored:
            warnings.simplefilter("ignore", category)
        yield


@contextmanager
def _quieted(names: tuple[str, ...]) -> Iterator[None]:
    with ExitStack() as patches:
        for name in names:
            patches.enter_context(patched(logging.getLogger(name), "disabled", True))
        yield
