"""CvT: the model (opsplit.models.cvt) and its Hugging Face conversion both ways
(opsplit.models.cvt_hf), issue 43; and the way back of LayerNorms whose S1 sigmas are not
(0, 1), checked against transformers' CvT built from a config (no download)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_cvt_hf import _hf_logits, hf_model, random_config  # noqa: E402

import opsplit.models as models  # noqa: E402
from opsplit.controls import PiecewiseConstant  # noqa: E402
from opsplit.models import CvT, CvtStageSpec, from_hf  # noqa: E402
from opsplit.models import cvt_hf as cvt_hf_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / "opsplit" / "models"
D = torch.float64


def _set_sigmas(model, seed: int) -> int:
    """Every LayerNorm's sigma_1 in [-0.5, 0.5] and sigma_2 in [0.5, 2] (distinct per norm),
    written through load_state_dict as a checkpoint would; returns how many norms."""
    g = torch.Generator().manual_seed(seed)
    sd = model.state_dict()
    keys = [k for k in sd if k.endswith("projection.sigma1.value")]
    for k in keys:
        sd[k] = (torch.rand((), generator=g, dtype=D) - 0.5).to(sd[k].dtype)
        k2 = k.replace("sigma1", "sigma2")
        sd[k2] = (0.5 + 1.5 * torch.rand((), generator=g, dtype=D)).to(sd[k2].dtype)
    model.load_state_dict(sd)
    return len(keys)


@pytest.mark.parametrize("seed", [1, 3])
def test_to_hf_folds_the_layer_norm_sigmas(seed):
    # before: the sigmas were dropped, the rebuilt model off by ~1 (the entry norm's sigma_2)
    cfg, size = random_config(seed)
    hf = hf_model(cfg, "CvtForImageClassification", D, seed)
    model = from_hf(hf)
    n_norms = _set_sigmas(model, seed)
    # per stage the entry norm and the two norms of its layers (one sigma pair each, shared by
    # the layers: the weights are per layer); the read-out's
    assert n_norms == 3 * len(cfg["depth"]) + 1
    x = torch.randn(2, cfg["num_channels"], size, size, dtype=D, generator=torch.Generator().manual_seed(seed))
    ours = model(x)
    assert (ours.last_hidden_state - hf.cvt(x).last_hidden_state).abs().max() > 1e-3  # the sigmas matter
    back = model.to_hf()
    ref = back.cvt(x)
    torch.testing.assert_close(ours.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-10)
    torch.testing.assert_close(ours.logits, _hf_logits(back, x, ref), rtol=0, atol=1e-10)
    # the round trip: HF's LayerNorm holds gamma sigma_2 and gamma sigma_1 + beta, read back as
    # the affine map of S1(0, 1): the same model
    again = from_hf(back)
    torch.testing.assert_close(again(x).logits, ours.logits, rtol=0, atol=1e-10)


def test_to_hf_is_still_a_pure_copy_at_the_default_sigmas():
    cfg, _ = random_config(2)
    hf = hf_model(cfg, "CvtModel", D, 2)
    back = from_hf(hf).to_hf()
    for k, v in hf.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k


def test_to_hf_refuses_a_sigma_that_varies_in_time():
    spec = CvtStageSpec(3, 4, 2, 1, patch_size=3, patch_stride=2, patch_padding=1, mlp_hidden=8)
    model = CvT(3, [spec], dtype=D)
    norm = model.stage_operators(0)["norm1"]
    norm.projection.sigma2 = PiecewiseConstant(torch.tensor([1.0, 2.0], dtype=D), t0=0.0, t1=2.0, positive=True)
    with pytest.raises(ValueError, match=r"^CvT\.to_hf: propagator\.scheme\.stages\.0\.body\.substeps\.0\.terms\.0\.norm"
                                         r"\.projection\.sigma2 is a PiecewiseConstant; Hugging Face's LayerNorm"):
        model.to_hf()


def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_the_model_and_its_conversion_are_two_modules():
    # as hf_decoders is for the decoders: the model's module reads nothing of transformers
    # and does not import its converter; the converter registers both directions
    assert not {m for m in _imports(ROOT / "cvt.py") if "transformers" in m or m.endswith("cvt_hf")}
    assert ".cvt" in _imports(ROOT / "cvt_hf.py")
    assert models.cvt_from_hf is cvt_hf_module.cvt_from_hf
    assert models.hf_converters()["CvtModel"] is cvt_hf_module.cvt_from_hf
    assert CvT.__module__ == "opsplit.models.cvt"
    for name in ("CvT", "CvTOutput", "CvtReadout", "CvtStageSpec", "build_cvt", "cvt_from_hf", "one_head_cvt"):
        assert name in models.__all__ and hasattr(models, name)
    with pytest.raises(TypeError, match="cvt_to_hf: model: expected a CvT"):
        cvt_hf_module.cvt_to_hf(torch.nn.Linear(2, 2))
