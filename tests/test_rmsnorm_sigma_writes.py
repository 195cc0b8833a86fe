"""ProjectionSphere reads sigma_2 at every call: a value written after construction
(load_state_dict, a checkpoint, an in-place edit) is the one used.  It used to keep the
number it was built with, so a Llama whose sigma_2 was loaded computed with the old one (the
rule: a cache is invalidated by every write to what it was built from, or not kept)."""

from __future__ import annotations

import pytest
import torch

from opsplit.grid import Grid
from opsplit.operators import ProjectionSphere

D = torch.float64


def _rms(u, sigma2, eps, compute_dtype=None):
    """u / sqrt(mean(u^2) + eps) * sigma2, written out (HF's literal float32 order when asked)."""
    h = u if compute_dtype is None else u.to(compute_dtype)
    h = h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps)
    return h.to(u.dtype) * sigma2


@pytest.mark.parametrize("compute_dtype", [None, torch.float32])
@pytest.mark.parametrize("write", ["load_state_dict", "in_place"])
def test_a_written_sigma2_is_the_one_used(compute_dtype, write):
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, 3, 5, dtype=D, generator=g)
    grid = Grid.paper(3, 5)
    op = ProjectionSphere(1.0, eps=1e-6, compute_dtype=compute_dtype).to(D)
    torch.testing.assert_close(op.resolvent(0.0, 1.0, u, grid), _rms(u, 1.0, 1e-6, compute_dtype), rtol=1e-6, atol=0)
    if write == "load_state_dict":
        op.load_state_dict({"sigma2.value": torch.tensor(2.5, dtype=D)})
    else:
        with torch.no_grad():
            op.sigma2.value.fill_(2.5)
    want = _rms(u, 2.5, 1e-6, compute_dtype)
    torch.testing.assert_close(op.resolvent(0.0, 1.0, u, grid), want, rtol=1e-6, atol=0)
    f = op.frozen_map(0.0, grid, D)
    torch.testing.assert_close(f(u, grid), want, rtol=1e-6, atol=0)


def test_a_llama_reads_its_loaded_final_norm_sigma2():
    transformers = pytest.importorskip("transformers")
    from _llm_configs import llama_config

    from opsplit.models import from_hf

    torch.manual_seed(0)
    model = from_hf(transformers.LlamaForCausalLM(llama_config(0)).to(D).eval())
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1))
    before = model(ids).logits
    key = next(k for k in model.state_dict() if k.startswith("final_norm.0.") and k.endswith("sigma2.value"))
    sd = model.state_dict()
    sd[key] = torch.tensor(2.0, dtype=sd[key].dtype)
    model.load_state_dict(sd)
    # the read-out is linear without a bias: twice the normalised state, twice the logits
    torch.testing.assert_close(model(ids).logits, 2.0 * before, rtol=1e-12, atol=0)
