r"""Training as an optimal-control problem (paper 002, eqs. 10–12 and 36).

- :class:`Objective` — :math:`J(\theta)` = data term + running costs on the controls;
- gradient modes (:data:`GRADIENT_MODES`): ``"backprop"``, ``"checkpoint"``, ``"adjoint"``;
- :class:`Unsplit` — the unsplit continuous model (eq. 10) as a trainable module.
"""

from .costs import energy_cost, leaf_controls, smoothness_cost
from .gradients import GRADIENT_MODES, Unsplit, gradient_mode, set_gradient_mode
from .objective import LOSSES, Objective, ObjectiveValue

__all__ = [
    "Objective",
    "ObjectiveValue",
    "LOSSES",
    "smoothness_cost",
    "energy_cost",
    "leaf_controls",
    "GRADIENT_MODES",
    "set_gradient_mode",
    "gradient_mode",
    "Unsplit",
]
