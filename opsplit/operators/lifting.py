r"""Lifting and projection: fields :math:`u(x)` of any resolution in and out of the
continuous model (the pre- and post-processing :math:`F`, :math:`G` of paper 002, eq. 36,
for functions of :math:`x \in \Omega_x = [0, L)`).

**Lifting** :math:`F`: a field with :math:`C` channels and the positions :math:`p(x)` are
mapped pointwise in :math:`x` onto the feature domain :math:`\Omega_y`,

.. math::  v(x, y) = \sum_{c} W(c, y)\, \big[u(x);\ p(x)\big]_c + b(y),          \tag{F}

an integral operator in the channel variable (plain sums over the :math:`C + 2K` input
channels).  The positions are functions of :math:`x` — never of a token index:

.. math::  p(x) = \big(\cos(2\pi k x / L),\ \sin(2\pi k x / L)\big)_{k = 1..K},

periodic (a model of a periodic problem sees no seam at :math:`x = 0`), and evaluated at the
nodes of whatever grid the field comes on, so the same lifting takes 256 nodes or 8192.

**Projection** :math:`G`: pointwise in :math:`x` again, a one-hidden-layer map from
:math:`\Omega_y` to the output channels,

.. math::  w(x, c) = \sum_{z} W_2(z, c)\, \sigma\Big(\int_{\Omega_y} W_1(\xi, z)\, v(x, \xi)\,
           d\xi + b_1(z)\Big) + b_2(c).                                           \tag{G}

**Input checks** (before any compute): a float tensor ``(B, N_x)`` or ``(B, N_x, C)``, finite,
with at least ``min_nodes`` nodes, and — the positions assume it — periodic: a field whose
jump across the seam :math:`x = L \to 0` is more than ``periodic_tol`` times its largest step
between neighbouring nodes is refused (a non-periodic function is not data on this domain),
and so is a batch whose first and last samples are equal (to rounding) in every sample and channel (both
ends :math:`x = 0` and :math:`x = L` of a periodic function sampled: a node counted twice).
The projection's input ``(B, N_x, N_y)`` is checked the same way (floating, the parameters'
dtype and device, finite).  Both check their own parameters finite (named) before any
compute and their output after it (:mod:`opsplit.operators._guard`), and map an empty batch
``B = 0`` to an empty batch, as ``nn.Linear`` does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    check_finite,
    check_float_dtype,
    check_parameters_finite,
    check_positive_float,
    check_positive_int,
    check_tensor,
    skip_value_checks,
)
from ..grid import Interval
from ._guard import checked_call

__all__ = ["Lifting", "Projection", "periodic_positions", "check_field", "check_periodic"]


def periodic_positions(x: Tensor, n_freq: int, length: float) -> Tensor:
    r""":math:`p(x) = (\cos 2\pi k x/L, \sin 2\pi k x/L)_{k=1..K}`: ``x`` ``(N,)`` ->
    ``(N, 2K)``."""
    k = torch.arange(1, n_freq + 1, dtype=x.dtype, device=x.device)
    a = (2 * math.pi / length) * x[:, None] * k[None, :]
    return torch.cat([a.cos(), a.sin()], dim=-1)


def check_field(u, name: str, channels: int | None, min_nodes: int = 1) -> Tensor:
    """A field ``(B, N_x)`` or ``(B, N_x, C)``: returned as ``(B, N_x, C)``."""
    u = check_tensor(u, name)
    check_float_dtype(u, name)
    if u.dim() == 2:
        u = u.unsqueeze(-1)
    elif u.dim() != 3:
        raise ValueError(f"{name}: expected a field of shape (B, N_x) or (B, N_x, C), got shape {tuple(u.shape)}")
    if channels is not None and u.shape[-1] != channels:
        raise ValueError(f"{name}: expected {channels} channel(s) in the last dimension, got shape {tuple(u.shape)}")
    if u.shape[1] < min_nodes:
        raise ValueError(
            f"{name}: the field has N_x = {u.shape[1]} nodes; this model needs N_x >= {min_nodes} (its Fourier "
            "modes would alias on fewer)")
    check_finite(u, name)
    return u


def check_periodic(u: Tensor, name: str, tol: float) -> None:
    """Refuse a field ``(B, N_x, C)`` whose jump across the seam exceeds ``tol`` times its
    largest interior step (per sample and channel)."""
    if skip_value_checks() or u.shape[1] < 3 or u.shape[0] == 0:  # (an empty batch has no samples to check)
        return
    with torch.no_grad():
        inner = (u[:, 1:] - u[:, :-1]).abs().amax(1)
        seam = (u[:, 0] - u[:, -1]).abs()
        tiny = 16 * torch.finfo(u.dtype).eps * u.abs().amax(1)
        if bool((seam <= tiny).all()) and bool((inner > tiny).all()):
            raise ValueError(
                f"{name}: expected a periodic field on [0, L) sampled at x_j = j L / N_x (x = L excluded); the first "
                "and last samples are equal (to rounding) in every sample and channel, as when both ends x = 0 and x = L of a "
                "periodic function are sampled (np.linspace(0, L, N) includes both): drop the last node")
        bad = seam > tol * inner
        if bool(bad.any()):
            b, c = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name}: expected a periodic field on [0, L) sampled at x_j = j L / N_x; sample {b} (channel {c}) "
                f"jumps by {float(seam[b, c]):.3g} across the seam x = L -> 0, {float(seam[b, c] / inner[b, c]):.1f} "
                f"times its largest step between neighbouring nodes ({float(inner[b, c]):.3g}); a non-periodic "
                "function, or samples that include both ends x = 0 and x = L, are not data on this domain")


def _check_like(x: Tensor, p: Tensor, name: str) -> None:
    """``x`` on the dtype and device of the parameter ``p`` (the model's), else a ``TypeError``."""
    if x.dtype != p.dtype or x.device != p.device:
        raise TypeError(f"{name}: expected a {p.dtype} tensor on {p.device} (the model's), got {x.dtype} on "
                        f"{x.device}")


class _CheckedMap(nn.Module):
    """A map of a field whose ``forward`` checks the parameters finite (named), the input by
    ``check_input``, both before any compute, then applies ``_map`` under
    :func:`~opsplit.operators._guard.checked_call` (errors named by ``_what``)."""

    _what = "map"

    def forward(self, x: Tensor) -> Tensor:
        check_parameters_finite(self, self._what)
        x = self.check_input(x)
        return checked_call(self, self._what, lambda: self._map(x))


class Lifting(_CheckedMap):
    r"""The lifting (F) of the module docstring: ``u`` ``(B, N_x)`` or ``(B, N_x, C)`` ->
    ``(B, N_x, N_y)``.

    Args:
        in_channels: :math:`C`, channels of the input field.
        n_y: :math:`N_y`, the features of the model's state.
        n_freq: :math:`K`, frequencies of the positions (0: none).
        length: :math:`L = |\Omega_x|`.
        rule: the node rule of the periodic grid (``"left"``: :math:`x_j = jL/N`, the data's).
        periodic_tol: the seam tolerance of the periodicity check (``None``: no check).
        min_nodes: the fewest nodes accepted (the model sets it from its Fourier modes).
    """

    def __init__(self, in_channels: int, n_y: int, *, n_freq: int = 4, length: float = 1.0, rule: str = "left",
                 periodic_tol: float | None = 4.0, min_nodes: int = 1, device=None, dtype=None):
        super().__init__()
        self.in_channels = check_positive_int(in_channels, "Lifting.in_channels")
        self.n_y = check_positive_int(n_y, "Lifting.n_y")
        if isinstance(n_freq, bool) or not isinstance(n_freq, int) or n_freq < 0:
            raise ValueError(f"Lifting.n_freq: expected an integer >= 0, got {n_freq!r}")
        self.n_freq = n_freq
        self.length = check_positive_float(length, "Lifting.length")
        if rule == "trapezoid":
            raise ValueError("Lifting.rule: a periodic grid has equally weighted nodes ('left', 'midpoint', 'right')")
        Interval(length=self.length, rule=rule)  # checks the rule's name
        self.rule = rule
        self.periodic_tol = None if periodic_tol is None else check_positive_float(periodic_tol, "Lifting.periodic_tol")
        self.min_nodes = check_positive_int(min_nodes, "Lifting.min_nodes")
        self.linear = nn.Linear(in_channels + 2 * n_freq, n_y, device=device, dtype=dtype)

    def interval(self, n: int) -> Interval:
        """:math:`\\Omega_x` at ``n`` nodes."""
        return Interval(n=n, length=self.length, rule=self.rule)

    def positions(self, n: int, dtype=None, device=None) -> Tensor:
        """:math:`p(x_j)` at the ``n`` nodes, ``(n, 2K)``."""
        x = self.interval(n).nodes(torch.float64, device)
        return periodic_positions(x, self.n_freq, self.length).to(dtype or torch.get_default_dtype())

    def check_input(self, u, name: str = "u") -> Tensor:
        u = check_field(u, name, self.in_channels, self.min_nodes)
        _check_like(u, self.linear.weight, name)
        if self.periodic_tol is not None:
            check_periodic(u, name, self.periodic_tol)
        return u

    _what = "Lifting"

    def _lift(self, u: Tensor) -> Tensor:
        """(F) on a checked field ``(B, N_x, C)``."""
        B, n, _ = u.shape
        if self.n_freq:
            p = self.positions(n, u.dtype, u.device).expand(B, n, 2 * self.n_freq)
            u = torch.cat([u, p], dim=-1)
        return self.linear(u)

    _map = _lift

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, n_y={self.n_y}, n_freq={self.n_freq}, L={self.length:g}, "
                f"rule={self.rule!r}, periodic_tol={self.periodic_tol}")


class Projection(_CheckedMap):
    r"""The projection (G) of the module docstring: ``(B, N_x, N_y)`` -> ``(B, N_x)`` (one
    output channel) or ``(B, N_x, C)``.

    Args:
        n_y: :math:`N_y`.
        hidden: width of the hidden layer.
        out_channels: :math:`C` (1: the output is ``(B, N_x)``).
        activation: ``"gelu"`` or ``"relu"``.
    """

    def __init__(self, n_y: int, hidden: int = 128, out_channels: int = 1, *, activation: str = "gelu",
                 device=None, dtype=None):
        super().__init__()
        self.n_y = check_positive_int(n_y, "Projection.n_y")
        hidden = check_positive_int(hidden, "Projection.hidden")
        self.out_channels = check_positive_int(out_channels, "Projection.out_channels")
        if activation not in ("gelu", "relu"):
            raise ValueError(f"Projection.activation: expected 'gelu' or 'relu', got {activation!r}")
        self.activation = activation
        self.fc1 = nn.Linear(n_y, hidden, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden, out_channels, device=device, dtype=dtype)

    def check_input(self, v, name: str = "Projection input") -> Tensor:
        """A floating state ``(B, N_x, N_y)`` on the dtype and device of the parameters, with
        finite values (as :meth:`Lifting.check_input`)."""
        v = check_tensor(v, name)
        check_float_dtype(v, name)
        if v.dim() != 3 or v.shape[-1] != self.n_y:
            raise ValueError(f"{name}: expected shape (B, N_x, {self.n_y}), got {tuple(v.shape)}")
        _check_like(v, self.fc1.weight, name)
        check_finite(v, name)
        return v

    _what = "Projection"

    def _project(self, v: Tensor) -> Tensor:
        """(G) on a checked state."""
        h = self.fc1(v)
        h = F.gelu(h) if self.activation == "gelu" else F.relu(h)
        w = self.fc2(h)
        return w.squeeze(-1) if self.out_channels == 1 else w

    _map = _project
