"""Feature skew by Gaussian input noise of rising strength (NIID-Bench "noise-based").

Li et al., ICDE 2022, https://arxiv.org/abs/2102.02079. The data are split IID; client ``i``
of ``N`` gets noise ``x + e, e ~ N(0, s_i^2)`` with standard deviation ``s_i = sigma * i / (N-1)``,
so the first client is clean and the last gets ``sigma``.

The FedLoss thesis (Tagarakis, 2023) describes this as a *variance* of ``sigma * i / N``;
NIID-Bench's code, which the thesis ran through FedLab, passes ``sigma * i / (N-1)`` as the
*standard deviation* of ``torch.randn``. We follow the code, because it is what produced the
thesis's numbers. The noise itself is applied lazily per sample by
:class:`fl_partitions.transforms.NoisyDataset`, deterministic per (seed, client, sample).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fl_checks import check_positive_float
from fl_partitions.iid import IID


class FeatureNoise(IID):
    """Feature skew: IID split, Gaussian input noise std rising from 0 to sigma."""

    name = "feature_noise"
    kind = "noise"

    def __init__(self, *, sigma: float = 0.1) -> None:
        self.sigma = check_positive_float("sigma", sigma, allow_zero=True)

    def noise_std(self, num_clients: int) -> NDArray[np.float64]:
        if num_clients == 1:
            return np.zeros(1)
        with np.errstate(over="ignore"):
            std = self.sigma * np.arange(num_clients) / (num_clients - 1)
        if not np.all(np.isfinite(std)):  # sigma near the float maximum: divide first
            std = self.sigma * (np.arange(num_clients) / (num_clients - 1))
        return std
