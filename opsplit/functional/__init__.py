r"""Functional attention kernels, in the style of ``torch.nn.functional``.

* :func:`sliced_relu_attention` — paper 004, eqs. (2)–(3), exact, :math:`O(n\log n)`;
* :func:`sliced_relu_bump_attention` — paper 004, eq. (7), exact, :math:`O(n\log n)`;
* :func:`causal_sliced_relu_attention`, :func:`causal_sliced_relu_bump_attention` — the same
  with causal masks, exact, :math:`O(n\log^2 n)`;
* :class:`SlicedDecodeCache` — their decode steps (generation), exact, :math:`O(D\log^2 n)`
  per new token over sorted runs (the logarithmic method);
* :func:`nadaraya_watson_attention` — kernel (Nadaraya–Watson) attention, paper 001.
"""

from .kernel import KERNELS, kernel_profile, nadaraya_watson_attention
from .sliced import sliced_relu_attention, sliced_relu_bump_attention
from .sliced_causal import causal_sliced_relu_attention, causal_sliced_relu_bump_attention
from .sliced_runs import SlicedDecodeCache

__all__ = [
    "sliced_relu_attention",
    "sliced_relu_bump_attention",
    "causal_sliced_relu_attention",
    "causal_sliced_relu_bump_attention",
    "SlicedDecodeCache",
    "nadaraya_watson_attention",
    "kernel_profile",
    "KERNELS",
]
