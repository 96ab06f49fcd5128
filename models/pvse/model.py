"""The PVSE models: ProbabilisticModel's interface (so training, export and evaluation treat
them like the other types) with encoders that also give the K embeddings: PIE-Nets on the
small trunks (PvseModel), or K heads on pretrained backbones' vectors (PvseHeadsModel).

The classes live in models.networks.probabilistic_model, beside the classes they subclass,
because build_model there chooses between them; this module names them for the PVSE code.
"""

from models.networks.probabilistic_model import PvseHeadsModel, PvseModel

AnyPvseModel = PvseModel | PvseHeadsModel

__all__ = ["AnyPvseModel", "PvseHeadsModel", "PvseModel"]
