"""A Hugging Face model named by its config, instead of a model file: ``hf:NAME_OR_DIR``.

The model is built from ``config.json`` alone (``from_config``: no weights are read), from a
local folder, or for a Hub name (``hf:ORG/NAME``) from the Hugging Face cache or the Hub itself:
``huggingface_hub`` fetches ``config.json`` and nothing else, honouring its cache,
``HF_HUB_OFFLINE``, ``HF_ENDPOINT`` and the user's token (a gated model's). The task comes from
the config's ``architectures`` (``LlamaForCausalLM`` -> causal-lm) unless given, and the batch
is synthesised from the config: token ids below ``vocab_size`` with themselves as labels for a
language model, ``pixel_values`` of the config's image size and class labels for an image
classifier. The loss is the model's own (``output.loss``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

import torch

from ckptplan.errors import CkptplanError, option
from ckptplan.huggingface import (
    AUTO_CLASSES,
    CONFIG_FILE,
    HUB_PREFIX,
    HUB_TASKS,
    INPUT_IDS,
    LABELS,
    PIXEL_VALUES,
    architecture_task,
)
from ckptplan.loading import Inputs, default_loss

DEFAULT_SEQ_LEN = 512
"""Tokens per sequence of a text model when ``--seq-len`` is not given."""


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise CkptplanError(
            "hf: models need transformers; pip install torch==2.13.0 transformers"
        ) from None
    return transformers


@dataclass(frozen=True)
class HubModel:
    """A workload (like a model file) for a Hugging Face config."""

    source: str
    """A folder holding ``config.json``, or a model's name on the Hugging Face Hub."""
    task: str | None = None
    seq_len: int | None = None
    """Tokens per sequence of a text model (default: ``DEFAULT_SEQ_LEN``)."""
    image_size: int | None = None
    """Side of the square images of an image model (default: the config's ``image_size``)."""

    default_batch_size = 1

    @classmethod
    def parse(cls, spec: str, **options: Any) -> HubModel:
        source = spec[len(HUB_PREFIX) :]
        if not source:
            raise CkptplanError("hf: names no model; e.g. hf:./my-config-folder or hf:gpt2")
        task = options.get("task")
        if task is not None and task not in HUB_TASKS:
            raise CkptplanError(f"{option('task', task)}: choose one of {', '.join(HUB_TASKS)}")
        given = {k: v for k, v in options.items() if v is not None}
        return cls(source, **given)

    @property
    def name(self) -> str:
        return f"{HUB_PREFIX}{self.source}"

    @property
    def position_limit(self) -> int | None:
        """The longest sequence the config's positions take, if it says."""
        config = self.config
        return getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )

    def sized_as(self, signature: Any) -> HubModel:
        """The inputs' sizes a plan recorded (its ``inputs``), where this one leaves them to
        their defaults: ``verify hf:DIR plan.json`` measures the batch the plan was made for,
        as the plan's batch size is taken, without ``--seq-len`` said again."""
        if not isinstance(signature, dict):
            return self
        ids, pixels = signature.get(INPUT_IDS), signature.get(PIXEL_VALUES)
        seq_len = self.seq_len
        if seq_len is None and _recorded_shape(ids, 2):
            seq_len = ids[0][1]
        image_size = self.image_size
        if image_size is None and _recorded_shape(pixels, 4):
            image_size = pixels[0][-1]
        return replace(self, seq_len=seq_len, image_size=image_size)

    def __str__(self) -> str:
        return self.name

    @functools.cached_property
    def config(self) -> Any:
        transformers = _transformers()
        folder = Path(self.source).expanduser()
        if folder.is_dir():
            if not (folder / CONFIG_FILE).is_file():
                raise CkptplanError(f"{self.name}: the folder {folder} holds no {CONFIG_FILE}")
            return transformers.AutoConfig.from_pretrained(folder)
        fetched = Path(_hub_config(self.source, self.name))
        return transformers.AutoConfig.from_pretrained(fetched.parent)

    @functools.cached_property
    def resolved_task(self) -> str:
        if self.task is not None:
            return self.task
        for architecture in self.config.architectures or ():
            task = architecture_task(architecture)
            if task is not None:
                return task
        transformers = _transformers()
        for task, auto in AUTO_CLASSES.items():
            if type(self.config) in getattr(transformers, auto)._model_mapping:
                return task
        raise CkptplanError(
            f"{self.name}: cannot tell the task of a {type(self.config).__name__}; pass "
            f"{option('task')}"
        )

    def build(self) -> torch.nn.Module:
        transformers = _transformers()
        architectures = [a for a in self.config.architectures or () if hasattr(transformers, a)]
        matching = [a for a in architectures if architecture_task(a) == self.resolved_task]
        if matching:
            return getattr(transformers, matching[0])(self.config)
        auto = getattr(transformers, AUTO_CLASSES[self.resolved_task])
        try:
            return auto.from_config(self.config)
        except ValueError as exc:
            reason = str(exc).splitlines()[0]
            raise CkptplanError(f"{self.name}: {reason}; pass {option('task')}") from None

    def inputs(self, batch_size: int | None = None) -> Inputs:
        batch = batch_size or self.default_batch_size
        config, task = self.config, self.resolved_task
        if task == "image-classification":
            size = self.image_size or int(getattr(config, "image_size", 224))
            channels = getattr(config, "num_channels", 3)
            return {
                PIXEL_VALUES: torch.randn(batch, channels, size, size),
                LABELS: torch.randint(0, config.num_labels, (batch,)),
            }
        vocab = getattr(config, "vocab_size", None)
        if not vocab:
            raise CkptplanError(f"{self.name}: its config has no vocab_size to draw tokens from")
        limit = self.position_limit
        seq_len = self.seq_len or DEFAULT_SEQ_LEN
        if limit is not None and seq_len > limit:
            raise CkptplanError(
                f"{option('seq_len', seq_len)} is longer than {self.name} takes ({limit} positions)"
            )
        ids = torch.randint(0, vocab, (batch, seq_len))
        if task == "sequence-classification":
            return {INPUT_IDS: ids, LABELS: torch.randint(0, config.num_labels, (batch,))}
        return {INPUT_IDS: ids, LABELS: ids.clone()}

    def loss(self, output: Any) -> torch.Tensor:
        return default_loss(output)


def _hub_config(repo_id: str, name: str) -> str:
    """The local path of the Hub model ``repo_id``'s ``config.json``: from the Hugging Face
    cache, or fetched into it (that file alone); each way it can fail is one line with a fix."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    login = "log in with `hf auth login` or set HF_TOKEN"
    try:
        return hf_hub_download(repo_id, CONFIG_FILE)
    except HFValidationError:
        problem = f"no folder {repo_id} here, and {repo_id!r} is no Hub model name (ORG/NAME)"
        fix = "pass a folder holding config.json, or a Hub name such as hf:gpt2"
    except GatedRepoError:
        problem = f"{repo_id} is gated on the Hugging Face Hub and no token of yours may read it"
        fix = f"accept its terms on its page at {constants.ENDPOINT}/{repo_id}, then {login}"
    except RepositoryNotFoundError:
        problem = f"the Hugging Face Hub has no model {repo_id} that you may read"
        fix = f"check the name; for a private model, {login}"
    except LocalEntryNotFoundError:
        where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
        if constants.HF_HUB_OFFLINE:
            problem = f"HF_HUB_OFFLINE is set and {repo_id}'s config.json is not in {where}"
            fix = "unset HF_HUB_OFFLINE to fetch it (config.json only), or pass a folder"
        else:
            problem = f"{constants.ENDPOINT} cannot be reached and {repo_id}'s config.json "
            problem += f"is not in {where}"
            fix = "check the connection (or HF_ENDPOINT), or pass a folder holding config.json"
    except EntryNotFoundError:
        problem = f"the Hub model {repo_id} has no config.json"
        fix = "pass a folder holding its config.json"
    except HfHubHTTPError as exc:
        status = exc.response.status_code
        problem = f"the Hugging Face Hub answered {status} for {repo_id}'s config.json"
        fix = login if status in (401, 403) else "try again later, or pass a folder"
    raise CkptplanError(f"{name}: {problem}; {fix}") from None


def _recorded_shape(leaf: Any, dims: int) -> TypeGuard[list[Any]]:
    """Whether ``leaf`` is a plan's record ``[shape, dtype]`` of a ``dims``-d tensor."""
    return (
        isinstance(leaf, list)
        and len(leaf) == 2
        and isinstance(leaf[0], list)
        and (len(leaf[0]) == dims)
    )
