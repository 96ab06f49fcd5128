"""Vectors sent in a JSON body (a Gaussian's mu and logvar, a backbone vector) as float32
arrays, after the checks the schema cannot express."""

import numpy as np

from service.errors import InvalidQueryError


def backbone_vector(values: list[float], max_dim: int) -> np.ndarray:
    """A backbone vector as float32 (its width is checked by the heads that read it)."""
    if len(values) > max_dim:
        raise InvalidQueryError(f"features has {len(values)} values; the limit is {max_dim}")
    return np.asarray(values, np.float32)


def gaussian(mu: list[float], logvar: list[float], max_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """mu and logvar as float32 arrays of one length, at most max_dim, within float32."""
    if len(mu) != len(logvar):
        raise InvalidQueryError(
            f"mu has {len(mu)} values and logvar {len(logvar)}; they must match"
        )
    if len(mu) > max_dim:
        raise InvalidQueryError(f"embedding has {len(mu)} dimensions; the limit is {max_dim}")
    float32_max = float(np.finfo(np.float32).max)
    if max(map(abs, mu + logvar)) > float32_max:
        raise InvalidQueryError(f"mu and logvar must fit in float32 (|x| <= {float32_max:.3g})")
    return np.asarray(mu, np.float32), np.asarray(logvar, np.float32)
