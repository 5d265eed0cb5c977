"""Whether pFedLA's weights follow the clients' data: per layer, the weight a client gives the
clients whose class set equals its own against the weight it gives those that share no class,
and the correlation of every weight with the class overlap of the two clients.

Class sets come from the clients' identity replies (``classes``); the paper's Figures 5 and 6
make the same comparison (same labels, similar labels, different labels).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np


def class_overlap(classes: Sequence[Collection[int]]) -> np.ndarray:
    """Jaccard overlap of every pair of class sets: [N, N]."""
    sets = [set(c) for c in classes]
    return np.array([[len(a & b) / max(len(a | b), 1) for b in sets] for a in sets])


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def alpha_structure(alpha: np.ndarray, classes: Sequence[Collection[int]]) -> dict[str, list[float | None]]:
    """Per layer of ``alpha`` [N, layers, N] (row i: client i's weights over the clients):

    - ``same``: the mean weight on another client with the same class set,
    - ``disjoint``: the mean weight on a client sharing no class,
    - ``ratio``: same / disjoint (None where either is undefined or disjoint is 0),
    - ``overlap-correlation``: Pearson correlation of alpha_i^{l,j} with the class overlap of
      i and j over all pairs i != j (None where the overlaps are all equal).
    """
    n = alpha.shape[0]
    overlap = class_overlap(classes)
    others = ~np.eye(n, dtype=bool)
    same = (overlap == 1.0) & others
    disjoint = overlap == 0.0
    out: dict[str, list[float | None]] = {"same": [], "disjoint": [], "ratio": [], "overlap-correlation": []}
    for layer in range(alpha.shape[1]):
        a = alpha[:, layer, :]
        s, d = _mean(a[same]), _mean(a[disjoint])
        out["same"].append(s)
        out["disjoint"].append(d)
        out["ratio"].append(s / d if s is not None and d else None)
        x, y = a[others], overlap[others]
        corr = np.corrcoef(x, y)[0, 1] if x.std() > 0 and y.std() > 0 else None
        out["overlap-correlation"].append(None if corr is None else float(corr))
    return out


def group_order(classes: Sequence[Collection[int]]) -> list[int]:
    """Clients ordered by class set (clients with the same set side by side), then by id."""
    return sorted(range(len(classes)), key=lambda i: (sorted(classes[i]), i))
