"""How close an exported graph must stay to its torch module, and the error when it does not."""

from __future__ import annotations

PARITY_ATOL = 1e-4


class ExportError(RuntimeError):
    """The exported graph does not reproduce the torch model."""
