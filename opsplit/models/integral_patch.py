r"""Images at other pixel grids: the patch embedding as a convolution integral whose
quadrature follows the pixel grid.

An image is a function :math:`f` on :math:`\Omega = [0, 1]^2`; a grid of :math:`H \times W`
pixels holds its values on the pixel cells (the cell rule: pixel :math:`q` stands for
:math:`f` on its cell :math:`C_q`).  A patch embedding (ViT's :math:`F`, eq. 36 of paper 002;
CvT's convolutional token embedding, eq. 44) is the integral operator

.. math::  z_p(y) = \frac{1}{|c|}\int_{\Omega_p} E(\xi - \xi_p;\, y)\, f(\xi)\, d\xi + b(y),  \tag{P}

over the patch (or stencil) :math:`\Omega_p`, with a kernel :math:`E` that is **constant
on the cells** :math:`c` **of the reference pixel grid** the model was trained on: there
:math:`E` takes the trained weights :math:`W_{ij}` and (P) is exactly the plain patch
embedding :math:`\sum_{ij} W_{ij} f_{ij} + b`.  On any other pixel grid the integral is
evaluated by the quadrature the pixels define — every pixel contributes its value times
the area it shares with each kernel cell:

.. math::  z_p(y) = \sum_{ij} W_{ij}(y)\, \bar f_{ij} + b(y), \qquad
           \bar f_{ij} = \frac{1}{|c_{ij}|} \sum_q |c_{ij} \cap C_q|\, f_q ,

i.e. the image's averages over the reference cells (:class:`PixelQuadrature`: two exact
area-overlap matrices, one per axis, any sizes, also non-integer ratios), followed by the
trained embedding unchanged.  The tokens, their number and the positions stay those of the
training grid ("the same tokens with larger patches"); an image upsampled by nearest
neighbours gives exactly the reference tokens, a smooth image sampled on finer grids gives
tokens that converge to the integral (P) at the quadrature's order (second order for cell
midpoint values; ``tests/test_integral_patch.py``).

:class:`IntegralPatchEmbedding` is ViT's :class:`~opsplit.models.PatchEmbedding` evaluated
this way (its pixels are checked finite before the averages, which mix every pixel of a
row and of a column); :class:`OnPixelGrid` puts the same quadrature in front of any image model whose
first operator is a convolution with cell-constant kernel (opsplit's CvT).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import check_finite, check_parameters_finite, check_positive_int
from .vit import PatchEmbedding, _pair

__all__ = ["area_weights", "PixelQuadrature", "IntegralPatchEmbedding", "OnPixelGrid"]


def area_weights(n_in: int, n_out: int, dtype=None, device=None) -> Tensor:
    r"""``(n_out, n_in)``: row :math:`i` holds :math:`|I_i \cap J_j| / |I_i|` for the
    :math:`n_{out}` equal cells :math:`I_i` and the :math:`n_{in}` equal cells :math:`J_j` of
    :math:`[0, 1]` (exact rational breakpoints; rows sum to 1)."""
    n_in = check_positive_int(n_in, "area_weights.n_in")
    n_out = check_positive_int(n_out, "area_weights.n_out")
    # work on the common refinement 1 / (n_in n_out): cell i of the output covers
    # [i n_in, (i + 1) n_in), cell j of the input [j n_out, (j + 1) n_out) in those units
    i = torch.arange(n_out, dtype=torch.float64)[:, None]
    j = torch.arange(n_in, dtype=torch.float64)[None, :]
    lo = torch.maximum(i * n_in, j * n_out)
    hi = torch.minimum((i + 1) * n_in, (j + 1) * n_out)
    A = (hi - lo).clamp_min(0) / n_in
    return A.to(dtype=dtype or torch.get_default_dtype(), device=device)


class PixelQuadrature(nn.Module):
    r"""The averages of an image ``(B, C, H, W)`` over the cells of the reference grid
    ``size`` = :math:`(H_0, W_0)`: ``(B, C, H_0, W_0)``, exact for the cell rule (see the module
    docstring); the identity on the reference grid itself."""

    def __init__(self, size):
        super().__init__()
        self.size = _pair(size, "PixelQuadrature.size")

    def check_input(self, images, name: str = "PixelQuadrature: images") -> None:
        """Type, rank, floating dtype and at least one pixel per axis (values: :meth:`forward`)."""
        if not isinstance(images, Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"{name}: expected shape (B, C, H, W), got {shape}")
        if not images.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {images.dtype}")
        H, W = images.shape[-2:]
        if H < 1 or W < 1:
            raise ValueError(f"{name}: expected at least one pixel per axis, got {(H, W)}")

    def forward(self, images: Tensor) -> Tensor:
        """The averages ``(B, C, H_0, W_0)``, after :meth:`check_input` and a check of finite
        pixel values (the area matrices mix every pixel of a row and a column: one NaN pixel
        would make whole rows of averages NaN)."""
        self.check_input(images)
        check_finite(images, "PixelQuadrature: images")
        return self._average(images)

    def _average(self, images: Tensor) -> Tensor:
        H, W = images.shape[-2:]
        if (H, W) == self.size:
            return images
        R = area_weights(H, self.size[0], images.dtype, images.device)
        S = area_weights(W, self.size[1], images.dtype, images.device)
        return R @ images @ S.t()

    def extra_repr(self) -> str:
        return f"size={self.size}"


class IntegralPatchEmbedding(PatchEmbedding):
    r"""ViT's patch embedding as the integral (P): images of any size, evaluated by the
    quadrature of their own pixel grid on the reference grid ``image_size`` (the trained
    weights, the tokens and the positions unchanged).  Same arguments as
    :class:`~opsplit.models.PatchEmbedding`; :meth:`from_patch_embedding` wraps a trained one."""

    def __init__(self, image_size, patch_size, num_channels: int, n_y: int, **kwargs):
        super().__init__(image_size, patch_size, num_channels, n_y, **kwargs)
        self.quadrature = PixelQuadrature(self.image_size)

    @classmethod
    def from_patch_embedding(cls, embedding: PatchEmbedding) -> IntegralPatchEmbedding:
        """The integral form of ``embedding`` (its parameters copied; equal on its own grid)."""
        if not isinstance(embedding, PatchEmbedding):
            raise TypeError(f"IntegralPatchEmbedding.from_patch_embedding: expected a PatchEmbedding, got "
                            f"{type(embedding).__name__}")
        w = embedding.weight
        new = cls(embedding.image_size, embedding.patch_size, embedding.num_channels, embedding.n_y,
                  bias=embedding.bias is not None, dropout=embedding.dropout, device=w.device, dtype=w.dtype)
        new.load_state_dict(embedding.state_dict())
        return new

    def patches(self, pixel_values: Tensor) -> Tensor:
        r""":math:`\mathbf R` of the reference-grid averages (the pixels' values are checked by
        :meth:`forward`)."""
        if isinstance(pixel_values, Tensor) and pixel_values.dim() == 4 and pixel_values.shape[1] == self.num_channels:
            self.quadrature.check_input(pixel_values, "pixel_values")
            pixel_values = self.quadrature._average(pixel_values)
        return super().patches(pixel_values)


class OnPixelGrid(nn.Module):
    r"""``model(quadrature(images))``: an image model trained on the reference grid ``size``
    takes images of any pixel grid, its first convolution evaluated as the integral (P) with
    cell-constant kernel (CvT's convolutional token embedding: the stencil's taps are the
    reference cells).  ``forward`` returns what ``model`` returns."""

    def __init__(self, model: nn.Module, size):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"OnPixelGrid.model: expected an nn.Module, got {type(model).__name__}")
        self.model = model
        self.quadrature = PixelQuadrature(size)

    def forward(self, images: Tensor, *args, **kwargs):
        """``model(quadrature(images))``: the parameters (named ``model.…``) and the pixels
        (``PixelQuadrature: images``) are checked finite first."""
        check_parameters_finite(self, "OnPixelGrid")
        try:
            return self.model(self.quadrature(images), *args, **kwargs)
        except ValueError:
            check_parameters_finite(self, "OnPixelGrid", fresh=True)
            raise
