"""Load a model file (docs/design.md §3) and turn its mistakes into one-line errors.

A model file defines ``build_model()``, ``example_inputs(batch_size=...)`` and optionally
``loss_fn(output)``. Every failure names the file, the line where it can, and the fix.

``MODULE:NAME`` stands for a model file inside an importable package, without a file of its
own: NAME is either a function that returns the model, used as ``build_model`` beside
MODULE's own ``example_inputs`` (and ``loss_fn``, if any), or an object (a class, an instance,
a submodule) with ``build_model`` and ``example_inputs`` attributes of its own.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
from torch._guards import detect_fake_mode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ckptplan.errors import CkptplanError
from ckptplan.huggingface import output_loss
from ckptplan.options import is_factory_spec
from ckptplan.patching import patched

Inputs = tuple[Any, ...] | dict[str, Any]

_SIGNATURES = {
    "build_model": "def build_model() -> torch.nn.Module: ...",
    "example_inputs": "def example_inputs(batch_size: int = 8) -> tuple | dict: ...",
}


@dataclass(frozen=True)
class ModelFile:
    """The functions a model file provides, with the file they came from.

    For ``MODULE:NAME``, ``module`` is the object whose functions are called, ``build_name``
    the (dotted) name of the one that builds the model, and ``label`` the spec itself.
    """

    path: Path | None
    module: Any
    build_name: str = "build_model"
    label: str | None = None

    @property
    def name(self) -> str:
        if self.label is not None or self.path is None:
            return self.label or repr(self.module)
        return self.path.name

    def build(self) -> torch.nn.Module:
        model = _call(self, self.build_name)
        if not isinstance(model, torch.nn.Module):
            raise CkptplanError(
                f"{self.build_name}() in {self.name} returned {type(model).__name__}; "
                "it must return a torch.nn.Module"
            )
        return model

    def inputs(self, batch_size: int | None = None) -> Inputs:
        args = () if batch_size is None else (batch_size,)
        inputs = _call(self, "example_inputs", *args)
        return as_inputs(inputs, f"example_inputs() in {self.name} returned")

    def loss(self, output: Any) -> torch.Tensor:
        if hasattr(self.module, "loss_fn"):
            loss = _call(self, "loss_fn", output)
        else:
            loss = default_loss(output)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise CkptplanError(
                f"the loss of {self.name} is not a scalar tensor; define "
                "`def loss_fn(output) -> torch.Tensor` returning one"
            )
        return loss

    @property
    def default_batch_size(self) -> int | None:
        parameter = inspect.signature(self.module.example_inputs).parameters.get("batch_size")
        if parameter is None or parameter.default is inspect.Parameter.empty:
            return None
        return int(parameter.default)


@dataclass(frozen=True)
class LiveModel:
    """A model object and its batch, given through the Python API instead of a file.

    ``build`` returns a copy; under ``FakeTensorMode`` its weights are fake tensors of the same
    shapes, so profiling never touches (or duplicates) the user's weights.
    """

    model: torch.nn.Module
    example_inputs: Inputs
    loss_fn: Callable[[Any], torch.Tensor] | None = None

    @property
    def name(self) -> str:
        return type(self.model).__name__

    default_batch_size = None

    def build(self) -> torch.nn.Module:
        mode = detect_fake_mode()
        if mode is None:
            return copy.deepcopy(self.model)
        memo: dict[int, Any] = {}
        for tensor in (*self.model.parameters(), *self.model.buffers()):
            fake = mode.from_tensor(tensor)
            if isinstance(tensor, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = fake
        return copy.deepcopy(self.model, memo)

    def inputs(self, batch_size: int | None = None) -> Inputs:
        if batch_size is not None:
            raise CkptplanError(
                "batch_size cannot change a batch given as example_inputs; pass that batch"
            )
        return pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.example_inputs
        )

    def loss(self, output: Any) -> torch.Tensor:
        return self.loss_fn(output) if self.loss_fn is not None else default_loss(output)


class Workload(Protocol):
    """What every stage needs of a model: a ``ModelFile``, a ``LiveModel``, a
    ``hub.HubModel``."""

    @property
    def name(self) -> str: ...

    @property
    def default_batch_size(self) -> int | None: ...

    def build(self) -> torch.nn.Module: ...

    def inputs(self, batch_size: int | None = None) -> Inputs: ...

    def loss(self, output: Any) -> torch.Tensor: ...


class _ValuesReadAsZero(TorchDispatchMode):
    """Lets value-dependent weight initialisation run on fake tensors while building.

    Initialisers such as ``trunc_normal_`` read a scalar back (``.item()``), which fake
    tensors cannot answer; the values of fake weights are never used, so reading 0 is safe.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            return False if args[0].dtype == torch.bool else 0
        return func(*args, **(kwargs or {}))


def as_inputs(value: object, source: str) -> Inputs:
    """``value`` as the inputs of forward: a tensor is its one positional argument, a list its
    positional arguments. Anything else but a tuple or a dict is refused in one line that
    starts with ``source`` ("example_inputs() in model.py returned")."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    if not isinstance(value, tuple | dict):
        raise CkptplanError(
            f"{source} {type(value).__name__}; pass a tensor, a tuple of forward's positional "
            "arguments or a dict of its keyword arguments"
        )
    return value


def build_fake(workload: Workload) -> torch.nn.Module:
    """Build the model inside an active ``FakeTensorMode`` (weights are never computed)."""
    with _ValuesReadAsZero(), _fake_module_conversion():
        return workload.build()


@contextmanager
def _fake_module_conversion() -> Iterator[None]:
    """``Module.to``/``.float()`` that work on fake parameters while a model is built.

    torch converts a fake parameter by swapping it with its converted copy, and refuses the
    swap whenever a weak reference to it exists, which the fake mode itself keeps: PEFT's
    ``get_peft_model`` (it moves each adapter to its base layer's device) and any ``.to()`` in
    a model's constructor then fail. Here a conversion that changes nothing keeps the
    parameter, and one that changes it replaces it by a new parameter, tied ones once.

    A process-wide patch, under ``patching``'s lock (Note [process-wide patches]): the
    conversions run inside the model's constructor, before there is an instance to hook.
    """

    def convert(module: torch.nn.Module, fn: Callable[[Any], Any], recurse: bool = True) -> Any:
        converted: dict[int, torch.nn.Parameter] = {}
        for each in module.modules() if recurse else (module,):
            for key, param in each._parameters.items():
                if param is None:
                    continue
                if id(param) not in converted:
                    with torch.no_grad():
                        applied = fn(param)
                    converted[id(param)] = (
                        param
                        if applied is param
                        else torch.nn.Parameter(applied, requires_grad=param.requires_grad)
                    )
                each._parameters[key] = converted[id(param)]
            for key, buffer in each._buffers.items():
                if buffer is not None:
                    each._buffers[key] = fn(buffer)
        return module

    with patched(torch.nn.Module, "_apply", convert):
        yield


def default_loss(output: Any) -> torch.Tensor:
    """``output.loss`` when the model returns one, else the sum of its floating outputs."""
    loss = output_loss(output)
    if loss is not None:
        return loss
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    floats = [t.float().sum() for t in leaves if t.is_floating_point() and t.requires_grad]
    if not floats:
        raise CkptplanError(
            "the model's output has no floating tensor that needs a gradient; define "
            "`def loss_fn(output) -> torch.Tensor` in the model file"
        )
    return torch.stack(floats).sum() if len(floats) > 1 else floats[0]


def call_model(model: torch.nn.Module, inputs: Inputs) -> Any:
    """Run forward with the inputs as a model file gives them (positional or keyword)."""
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def load_model_file(path: str | Path) -> ModelFile:
    """Import a model file, or the ``MODULE:NAME`` that stands for one; a missing file or
    module, an import error or a missing function is one line."""
    if is_factory_spec(path):
        return load_factory(str(path))
    file = Path(path)
    if not file.is_file():
        raise CkptplanError(
            f"model file {path} not found; pass the path of a .py file, MODULE:FUNCTION or "
            "hf:NAME_OR_DIR"
        )
    name = f"ckptplan_model_{abs(hash(file.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise CkptplanError(f"{path} is not a Python file ckptplan can import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise CkptplanError(
            f"importing {file.name} failed: {describe_exception(exc, file)}"
        ) from None
    for required, signature in _SIGNATURES.items():
        if not callable(getattr(module, required, None)):
            raise CkptplanError(f"{file.name} defines no {required}(); add `{signature}`")
    return ModelFile(file, module)


def load_factory(spec: str) -> ModelFile:
    """``MODULE:NAME`` (see the module docstring), MODULE imported as ``import`` would."""
    module_name, _, attribute = spec.partition(":")
    module = _import(module_name, spec)
    found = _lookup(module, attribute)
    if found is None:
        raise CkptplanError(
            f"{spec}: module {module_name} defines no {attribute}; name a function that returns "
            "the model, or an object with build_model and example_inputs"
        )
    path = Path(module.__file__) if getattr(module, "__file__", None) else None
    if all(callable(getattr(found, role, None)) for role in _SIGNATURES):
        return ModelFile(path, found, label=spec)
    if not callable(found):
        raise CkptplanError(
            f"{spec} is a {type(found).__name__}, neither a function that returns the model nor "
            "an object with build_model and example_inputs"
        )
    if not callable(getattr(module, "example_inputs", None)):
        raise CkptplanError(
            f"{spec}: module {module_name} defines no example_inputs() to call beside "
            f"{attribute}(); add `{_SIGNATURES['example_inputs']}` to it"
        )
    return ModelFile(path, module, build_name=attribute, label=spec)


def _import(module_name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{module_name}.".startswith(f"{exc.name}."):
            raise CkptplanError(
                f"{spec}: no module named {exc.name} to import; install its package, or run "
                "from the folder that holds it"
            ) from None
        raise CkptplanError(
            f"importing {module_name} for {spec} failed: "
            f"{describe_exception(exc, _source_of(module_name))}"
        ) from None
    except Exception as exc:
        raise CkptplanError(
            f"importing {module_name} for {spec} failed: "
            f"{describe_exception(exc, _source_of(module_name))}"
        ) from None


def _source_of(module_name: str) -> Path | None:
    """The file of a module that failed to import, to name the line that failed."""
    try:
        found = importlib.util.find_spec(module_name)
    except Exception:  # its parent package fails to import too: no file to name
        return None
    return Path(found.origin) if found is not None and found.origin else None


def _lookup(owner: Any, dotted: str) -> Any:
    """``owner.a.b`` for ``"a.b"``, or None where a part is missing."""
    for part in dotted.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return owner


def _call(model_file: ModelFile, function: str, *args: Any) -> Any:
    try:
        return functools.reduce(getattr, function.split("."), model_file.module)(*args)
    except CkptplanError:
        raise
    except Exception as exc:
        raise CkptplanError(
            f"{function}() in {model_file.name} raised {describe_exception(exc, model_file.path)}"
        ) from None


def describe_exception(exc: BaseException, file: Path | None) -> str:
    """``Type: message (file.py, line N)`` with the deepest line of the user's file."""
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    for frame in traceback.extract_tb(exc.__traceback__):
        if file is not None and Path(frame.filename).resolve() == file.resolve():
            line = frame.lineno
    text = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)  # no location twice
    message = text.strip().splitlines()[0] if text.strip() else ""
    location = f" ({file.name}, line {line})" if line and file is not None else ""
    return f"{type(exc).__name__}: {message}{location}"
