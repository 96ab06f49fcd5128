"""The PVSE model: ProbabilisticModel's interface (so training, export and evaluation treat it
like the other types) with PIE-Net encoders that also give the K embeddings.

The class lives in models.networks.probabilistic_model, beside the class it subclasses, because
build_model there chooses between them; this module names it for the PVSE code.
"""

from models.networks.probabilistic_model import PvseModel

__all__ = ["PvseModel"]
