"""The per-call value checks that are re-read only after a change: a constant modified in place,
or replaced, after a passing call is checked again at the next call."""

import pytest
import torch

from opsplit.grid import Grid
from opsplit.operators import ProjectionS1, ProjectionSphere


@pytest.mark.parametrize("kind", [ProjectionS1, ProjectionSphere])
def test_sigma2_checked_again_after_change(kind):
    op = kind(sigma2=torch.tensor(2.0, dtype=torch.float64)) if kind is ProjectionS1 else \
        kind(torch.tensor(2.0, dtype=torch.float64))
    g = Grid.paper(3, 4)
    op.check(g)
    op.check(g)  # unchanged: passes (from the cache)
    with torch.no_grad():
        op.sigma2.value.fill_(-1.0)  # in place: the version counter changes
    with pytest.raises(ValueError, match=f"{kind.__name__}.sigma2: expected sigma_2 > 0"):
        op.check(g)
    op.sigma2.value = torch.tensor(3.0, dtype=torch.float64)  # another tensor
    op.check(g)
    op.sigma2.value = torch.tensor(0.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="expected sigma_2 > 0"):
        op.check(g)
