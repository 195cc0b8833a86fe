"""Image augmentations for :class:`~opsplit.control.Trainer` (``augment=fn(inputs, generator)``):
small random affine deformations resampled bilinearly, for images too small (8×8 digits)
for whole-pixel shifts (:func:`~opsplit.data.random_shift`) to be a small perturbation."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_generator

__all__ = ["random_affine"]


def _bound(v, name: str, *, below_one: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"random_affine.{name}: expected a finite number >= 0, got {v!r}")
    if below_one and v >= 1:
        raise ValueError(f"random_affine.{name}: expected a number in [0, 1), got {v!r}")
    return float(v)


def random_affine(
    *,
    rotate: float = 0.0,
    scale: float = 0.0,
    shear: float = 0.0,
    shift: float = 0.0,
    fill: float | None = None,
):
    r"""A training augmentation ``fn(images, generator)`` that moves every image of
    ``(B, C, H, W)`` by its own random affine map of the plane, drawn uniformly:

    * a rotation by :math:`\alpha \in [-\mathrm{rotate}, \mathrm{rotate}]` degrees,
    * a scaling by :math:`s \in [1 - \mathrm{scale}, 1 + \mathrm{scale}]` (both axes),
    * a horizontal shear :math:`x \mapsto x + \kappa y`, :math:`\kappa \in [-\mathrm{shear},
      \mathrm{shear}]` (slanted handwriting),
    * a translation by :math:`(\delta_x, \delta_y) \in [-\mathrm{shift}, \mathrm{shift}]^2`
      pixels (fractions of a pixel allowed),

    about the image centre, in pixel units (so a rotation is a rotation for ``H != W`` too).
    The output pixel at :math:`p` is the bilinear interpolation of the input at
    :math:`A p + \delta` (:func:`torch.nn.functional.grid_sample`, ``align_corners=False``);
    points outside the image read ``fill`` (default: the batch minimum, the background of
    standardised digits).  All draws come from ``generator`` (the trainer's seeded one:
    runs and resumed runs repeat them); with every bound 0 the images are returned as they
    are.
    """
    rotate = _bound(rotate, "rotate")
    scale = _bound(scale, "scale", below_one=True)
    shear = _bound(shear, "shear")
    shift = _bound(shift, "shift")
    if fill is not None:
        if isinstance(fill, bool) or not isinstance(fill, (int, float)) or not math.isfinite(fill):
            raise ValueError(f"random_affine.fill: expected None or a finite number, got {fill!r}")
        fill = float(fill)
    identity = rotate == scale == shear == shift == 0.0

    def affine(images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if not isinstance(images, Tensor) or not images.is_floating_point() or images.dim() != 4:
            raise ValueError(
                f"random_affine: expected floating images (B, C, H, W), got {getattr(images, 'shape', type(images))}"
            )
        check_generator(generator, "random_affine.generator")
        if identity:
            return images
        B, _, H, W = images.shape
        # U(-1, 1) per image and parameter, drawn on the CPU (the trainer's generator)
        u = torch.rand(B, 5, generator=generator, dtype=torch.float64) * 2 - 1
        a = torch.deg2rad(rotate * u[:, 0])
        s = 1 + scale * u[:, 1]
        k = shear * u[:, 2]
        cos, sin = torch.cos(a), torch.sin(a)
        # A = s R(a) [[1, k], [0, 1]] in pixel coordinates (x along W, y along H)
        A = torch.stack(
            [torch.stack([cos, cos * k - sin], -1), torch.stack([sin, sin * k + cos], -1)], -2
        )
        A = s[:, None, None] * A
        # grid_sample's normalised coordinates: x_n = x / (W / 2), y_n = y / (H / 2)
        D = torch.tensor([W / 2.0, H / 2.0], dtype=torch.float64)
        theta = torch.cat(
            [A * D[None, None, :] / D[None, :, None], (shift * u[:, 3:5] / D)[:, :, None]], -1
        )
        theta = theta.to(device=images.device, dtype=images.dtype)
        grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
        bg = images.amin() if fill is None else fill
        out = torch.nn.functional.grid_sample(
            images - bg, grid, mode="bilinear", padding_mode="zeros", align_corners=False
        )
        return out + bg

    return affine
