"""Names of the choices the CLI offers, importable without torch."""

OPTIMIZERS = ("adamw", "adam", "sgd", "none")
DTYPES = ("fp32", "bf16", "fp16")
SCOPES = ("step", "activations")
