"""Image augmentations for :class:`~opsplit.control.Trainer` (``augment=fn(inputs, generator)``):
small random affine deformations resampled bilinearly, for images too small (8×8 digits)
for whole-pixel shifts (:func:`~opsplit.data.random_shift`) to be a small perturbation."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_finite_float, check_generator, check_positive_float

__all__ = ["random_affine"]


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
    runs and resumed runs repeat them; a CPU generator, the warp runs on the images'
    device); with every bound 0 the images are returned as they are.  A bound that is not a
    finite number >= 0 (``scale`` < 1) is refused when the augmentation is built, images
    that are not floating ``(B, C, H, W)`` when it is called, naming the argument.
    """
    rotate, scale, shear, shift = (
        check_positive_float(v, f"random_affine.{name}", allow_zero=True)
        for v, name in ((rotate, "rotate"), (scale, "scale"), (shear, "shear"), (shift, "shift"))
    )
    if scale >= 1:
        raise ValueError(f"random_affine.scale: expected a number in [0, 1), got {scale!r}")
    if fill is not None:
        fill = check_finite_float(fill, "random_affine.fill")
    identity = rotate == scale == shear == shift == 0.0

    def affine(images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if not isinstance(images, Tensor):
            raise TypeError(
                f"random_affine.images: expected a torch.Tensor (B, C, H, W), got {type(images).__name__}"
            )
        if images.dim() != 4:
            raise ValueError(
                f"random_affine.images: expected (B, C, H, W), got shape {tuple(images.shape)}"
            )
        if not images.is_floating_point():
            raise TypeError(
                f"random_affine.images: expected a floating-point tensor, got dtype {images.dtype}"
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
