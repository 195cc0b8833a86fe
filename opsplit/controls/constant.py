r"""The constant control: a tensor used as :math:`\theta(t)` for every :math:`t`, and
:func:`as_control`, which wraps a tensor so (the operators take tensors or controls alike)."""

from __future__ import annotations

from torch import Tensor, nn

from .base import Control, _check_values

__all__ = ["Constant", "as_control"]


def as_control(value, name: str, axes=()) -> Control:
    """Wrap a tensor as a time-independent control; pass controls through."""
    if isinstance(value, Control):
        return value
    if isinstance(value, Tensor):
        return Constant(value, axes=axes, name=name)
    raise TypeError(f"{name}: expected a Control or a torch.Tensor, got {type(value).__name__}")


class Constant(Control):
    """A time-independent control, holding the given tensor as it is.

    An ``nn.Parameter`` is registered as a parameter (trained with the module); any other
    tensor as a buffer, used without a copy, so autograd reaches it when it requires grad.
    For a trainable positive control use ``PiecewiseConstant(..., positive=True)``.
    """

    def __init__(self, value: Tensor, *, axes=(), positive: bool = False, name: str | None = None):
        super().__init__(axes)
        # ``name``: the argument the value was given as (e.g. "FFNIntegral.W"), for errors
        value = _check_values(value, name or "Constant.value")
        if len(self.axes) > value.dim():
            raise ValueError(
                f"{name or 'Constant'}: expected a tensor of rank >= {len(self.axes)} (axes "
                f"{self.axes}), got shape {tuple(value.shape)}"
            )
        if positive and not bool((value > 0).all()):
            raise ValueError(
                f"{name or 'Constant(positive=True)'}: expected values > 0, got min {float(value.min()):g}"
            )
        if isinstance(value, nn.Parameter):
            self.value = value
        else:
            self.register_buffer("value", value, persistent=True)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def forward(self, t=None, grid=None) -> Tensor:
        return self.value

    def validate(self, grid, name: str = "control") -> None:
        self.check_grid(self.shape, grid, name)

    def extra_repr(self) -> str:
        return f"shape={self.shape}" + self._repr_flags()
