r"""A second-order finite-difference solver of the 2-D Darcy problem on the unit square:

.. math::  -\nabla\cdot\big(a(x)\,\nabla u(x)\big) = f(x) \ \text{ in } (0, 1)^2, \qquad
           u = 0 \ \text{ on } \partial(0, 1)^2.                                      \tag{D}

**Grid.**  :math:`s \times s` nodes :math:`(x_i, y_j) = (i, j)/(s - 1)`, boundary nodes
included, :math:`h = 1/(s - 1)`; arrays are indexed ``[i, j]`` (``x`` along the first
axis, ``y`` along the second).  The unknowns are the :math:`(s - 2)^2` interior values.

**Stencil.**  The five-point, flux-form discretisation

.. math::  -\frac{a_{i+\frac12,j}(u_{i+1,j} - u_{ij}) - a_{i-\frac12,j}(u_{ij} - u_{i-1,j})}{h^2}
           -\frac{a_{i,j+\frac12}(u_{i,j+1} - u_{ij}) - a_{i,j-\frac12}(u_{ij} - u_{i,j-1})}{h^2}
           = f_{ij},

with the coefficient at a face the mean of its two nodes' values: ``face="arithmetic"``
(:math:`\tfrac12(a_P + a_Q)`, the default: the rule of FNO's data script ``solve_gwf.m``, so
the data is the benchmark's) or ``face="harmonic"`` (:math:`2 a_P a_Q/(a_P + a_Q)`, the
conductance of two half-cells in series, exact for a 1-D flux across a jump at the face's
midpoint).  For a smooth :math:`a` both are second order (they differ by
:math:`O(h^2)`); for a piecewise-constant :math:`a` whose interface is not aligned with
the grid both converge at about first order (``docs/darcy.md`` has the measured figures).
The matrix is symmetric positive definite.

**Solve.**  A sparse direct solve per coefficient (:func:`scipy.sparse.linalg.splu`): the
unknowns are ordered by a geometric nested dissection of the grid (recursive bisection by
grid lines, the separators last; computed once per ``s`` with the matrix's sparsity
pattern), which keeps the factors at :math:`O(n \log n)` entries for :math:`n = (s - 2)^2`
(``docs/darcy.md`` compares it with SuperLU's own orderings); no pivoting is needed (an SPD
matrix), so SuperLU runs in its symmetric mode with the diagonal as pivots.  The checks
(``tests/test_darcy_data.py``): a manufactured solution with a smooth variable coefficient
converges at order 2, and the solution satisfies the discrete equations to round-off.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .._checks import check_choice

__all__ = ["solve_darcy", "darcy_matrix", "nested_dissection", "factor_entries", "FACES", "MIN_NODES"]

#: the rules for the coefficient at a face between two nodes
FACES = ("arithmetic", "harmonic")
#: the smallest grid: one interior node
MIN_NODES = 3
#: leaf size of the nested dissection (blocks of at most 8 x 8 nodes are ordered row by row):
#: the fastest factorisation at s = 421 among 4, 8, 16, 32
_LEAF = 8


def factor_entries(s: int) -> float:
    """An upper estimate of the entries of the sparse ``L + U`` factors at ``s x s`` nodes,
    for the size guards: ``6 n log2 n`` for ``n`` interior unknowns (the nested dissection's
    factors have ``4.4, 4.7, 5.1, 5.3 n log2 n`` at ``s = 101, 201, 421, 841``)."""
    n = max(s - 2, 1) ** 2
    return 6.0 * n * max(math.log2(n), 1.0)


def nested_dissection(m: int, leaf: int = _LEAF) -> np.ndarray:
    """The nested-dissection order of an ``m x m`` grid of unknowns numbered row by row
    (``k = i m + j``): ``order[q]`` is the unknown eliminated ``q``-th.  A block with more
    than ``leaf`` nodes along its longer side is cut by its middle grid line; both halves are
    ordered (recursively) before the cut."""
    idx = np.arange(m * m).reshape(m, m)
    out = []
    stack = [(idx, False)]
    # iterative post-order: (block, children done)
    while stack:
        blk, done = stack.pop()
        r, c = blk.shape
        if r * c == 0:
            continue
        if done or max(r, c) <= leaf:
            out.append(blk.ravel())
            continue
        if r >= c:
            k = r // 2
            first, second, cut = blk[:k], blk[k + 1:], blk[k:k + 1]
        else:
            k = c // 2
            first, second, cut = blk[:, :k], blk[:, k + 1:], blk[:, k:k + 1]
        stack.extend([(cut, True), (second, False), (first, False)])
    return np.concatenate(out)


@lru_cache(maxsize=4)
def _pattern(s: int):
    """The sparsity pattern of the ``s x s`` problem, in nested-dissection order: the CSC
    ``indptr``, ``indices``, the position of each CSC entry in the list of matrix entries
    (diagonal, then the four neighbour links), and the order itself."""
    import scipy.sparse as sp  # imported on use (~0.2 s): opsplit.data stays quick to import

    m = s - 2
    order = nested_dissection(m)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    k = np.arange(m * m).reshape(m, m)
    rows = [k.ravel(), k[1:, :].ravel(), k[:-1, :].ravel(), k[:, 1:].ravel(), k[:, :-1].ravel()]
    cols = [k.ravel(), k[:-1, :].ravel(), k[1:, :].ravel(), k[:, :-1].ravel(), k[:, 1:].ravel()]
    r, c = rank[np.concatenate(rows)], rank[np.concatenate(cols)]
    ids = np.arange(1, r.size + 1, dtype=np.float64)  # entry ids (nonzero, exact in float64)
    csc = sp.coo_matrix((ids, (r, c)), shape=(m * m, m * m)).tocsc()
    csc.sort_indices()
    where = csc.data.astype(np.int64) - 1
    for arr in (csc.indptr, csc.indices, where, order):
        arr.setflags(write=False)
    return csc.indptr, csc.indices, where, order


def _faces(a: np.ndarray, face: str):
    """The coefficient at the faces: ``ax[i, j]`` between nodes ``(i, j)``, ``(i + 1, j)``
    and ``ay[i, j]`` between ``(i, j)``, ``(i, j + 1)``."""
    p, q = a[1:, :], a[:-1, :]
    r, t = a[:, 1:], a[:, :-1]
    if face == "arithmetic":
        return 0.5 * (p + q), 0.5 * (r + t)
    return 2.0 * p * q / (p + q), 2.0 * r * t / (r + t)


def _entries(a: np.ndarray, face: str) -> np.ndarray:
    """The matrix entries in the order of :func:`_pattern`'s list: the diagonal, then the
    links to the node below in ``i``, above in ``i``, below in ``j``, above in ``j``."""
    s = a.shape[0]
    ax, ay = _faces(a, face)
    w, e = ax[:-1, 1:-1], ax[1:, 1:-1]  # faces (i - 1/2, j), (i + 1/2, j) of interior nodes
    so, no = ay[1:-1, :-1], ay[1:-1, 1:]  # faces (i, j - 1/2), (i, j + 1/2)
    inv_h2 = float((s - 1) ** 2)
    return np.concatenate([(w + e + so + no).ravel(), -w[1:, :].ravel(), -e[:-1, :].ravel(),
                           -so[:, 1:].ravel(), -no[:, :-1].ravel()]) * inv_h2


def _check_face(face, name):
    return check_choice(face, FACES, name)


def _check_coefficient(a, name: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array of shape (s, s) or (B, s, s), got {type(a).__name__}")
    if a.dtype.kind not in "fiu" or a.dtype == bool:
        raise TypeError(f"{name}: expected a real floating-point array, got dtype {a.dtype}")
    if a.ndim not in (2, 3) or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"{name}: expected a square grid, shape (s, s) or (B, s, s), got {a.shape}")
    if a.shape[-1] < MIN_NODES:
        raise ValueError(f"{name}: expected at least {MIN_NODES} x {MIN_NODES} nodes (one interior node), "
                         f"got {a.shape[-1]} x {a.shape[-1]}")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: expected finite values, found NaN/inf")
    if not (a > 0).all():
        raise ValueError(f"{name}: expected a coefficient > 0 at every node (an elliptic problem), "
                         f"found min {a.min():g}")
    return a


def darcy_matrix(a: np.ndarray, face: str = "arithmetic"):
    """The matrix of the interior equations for the coefficient ``a`` (``(s, s)`` node
    values), unknowns numbered row by row (``u[1:-1, 1:-1].ravel()``): ``(s - 2)^2`` square,
    CSR (a ``scipy.sparse`` matrix)."""
    import scipy.sparse as sp  # imported on use (~0.2 s): opsplit.data stays quick to import

    a = _check_coefficient(a, "darcy_matrix.a")
    if a.ndim != 2:
        raise ValueError(f"darcy_matrix.a: expected one coefficient of shape (s, s), got {a.shape}")
    face = _check_face(face, "darcy_matrix.face")
    indptr, indices, where, order = _pattern(a.shape[0])
    n = order.size
    A = sp.csc_matrix((_entries(a, face)[where], indices, indptr), shape=(n, n))
    return A[np.argsort(order)][:, np.argsort(order)].tocsr()


def solve_darcy(a: np.ndarray, f=1.0, *, face: str = "arithmetic") -> np.ndarray:
    r"""Solve (D) for each coefficient in ``a``.

    Args:
        a: the coefficient at the nodes, ``(s, s)`` or ``(B, s, s)``, finite and ``> 0``.
        f: the right-hand side: a number, or the node values ``(s, s)`` (only the interior
            is used).
        face: the coefficient at a face: ``"arithmetic"`` or ``"harmonic"`` mean of its two
            nodes (see the module docstring).

    Returns:
        ``u`` at every node, float64, the shape of ``a``; zero on the boundary.
    """
    import scipy.sparse as sp  # imported on use (~0.2 s): opsplit.data stays quick to import
    import scipy.sparse.linalg as spla  # the same

    a = _check_coefficient(a, "solve_darcy.a")
    face = _check_face(face, "solve_darcy.face")
    s = a.shape[-1]
    if isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, float, np.integer, np.floating, np.ndarray)):
        raise TypeError(f"solve_darcy.f: expected a number or an array of shape ({s}, {s}), got {type(f).__name__}")
    f = np.asarray(f, dtype=np.float64)
    if f.ndim and f.shape != (s, s):
        raise ValueError(f"solve_darcy.f: expected a number or an array of shape ({s}, {s}), got {f.shape}")
    if not np.isfinite(f).all():
        raise ValueError("solve_darcy.f: expected finite values, found NaN/inf")
    indptr, indices, where, order = _pattern(s)
    n = order.size
    rhs = (np.broadcast_to(f, (s, s))[1:-1, 1:-1].ravel())[order]
    batch = a.reshape(-1, s, s)
    out = np.zeros(batch.shape)
    for b, coef in enumerate(batch):
        A = sp.csc_matrix((_entries(coef, face)[where], indices, indptr), shape=(n, n))
        lu = spla.splu(A, permc_spec="NATURAL", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
        x = np.empty(n)
        x[order] = lu.solve(rhs)
        out[b, 1:-1, 1:-1] = x.reshape(s - 2, s - 2)
    return out.reshape(a.shape)
