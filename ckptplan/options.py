"""Names of the choices the CLI offers, importable without torch."""

OPTIMIZERS = ("adamw", "adam", "sgd", "none")
DTYPES = ("fp32", "bf16", "fp16")
SCOPES = ("step", "activations")
HUB_PREFIX = "hf:"
HUB_TASKS = (
    "causal-lm",
    "masked-lm",
    "seq2seq-lm",
    "sequence-classification",
    "image-classification",
)
