"""CvT on every image size Hugging Face's CvtModel runs (issue 17, finding 4).

A strided convolution with kernel k, stride s and padding p maps an N-node token grid to
floor((N + 2p - k)/s) + 1 nodes, for any N with N + 2p >= k (opsplit.operators.transfer).
The sweep below builds seeded random small CvtConfigs (1-3 stages; patch sizes, strides
and paddings; K/V kernels, strides 1-3 and paddings; query strides; mlp_ratio from 0.1 to
4, whose int(embed_dim * mlp_ratio) hidden width may be 0) in transformers, converts them,
and runs both models on square, non-square, odd and prime image sizes:

* every size HF runs, opsplit runs, with HF's last hidden state, class token and logits
  (float64 within 1e-10; float32 within 1e-5 of HF's float64 outputs; relative to the
  tensor's scale) and HF's gradient with respect to the pixels (float64) — except where
  HF's query projection does not map the token grid onto itself (HF then broadcasts a
  one-token attention output over the grid, or reads a grid of another shape): opsplit
  refuses those, naming ``pixel_values`` (see ``sweep``);
* every size HF refuses, opsplit refuses with a ValueError naming ``pixel_values``, before
  any convolution, matmul or normalisation has run (recorded by a dispatch mode).

Skipped when transformers is not installed (a test-only dependency)."""

from __future__ import annotations

import copy
import random
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_cvt_hf import _hf_logits, assert_close, randomized  # noqa: E402
from test_vit_hf import _AtenOps  # noqa: E402

from opsplit.models import from_hf  # noqa: E402
from opsplit.models.cvt_hf import _hf_parts, _pairs  # noqa: E402

#: square sizes 1..17 (10 and 14 among them), primes, and non-square sizes
SIZES = [(n, n) for n in range(1, 18)] + [(19, 19), (23, 23), (32, 32), (37, 37), (2, 3), (5, 9), (7, 12), (13, 4),
                                          (16, 11), (1, 6), (31, 17), (48, 29)]
#: aten ops that mean the forward pass started computing
COMPUTE = ("convolution", "mm", "addmm", "bmm", "linear", "layer_norm", "batch_norm", "softmax",
           "scaled_dot_product", "gelu")


def random_config(seed: int) -> dict:
    """A seeded random small CvtConfig (kwargs).  transformers' CvtStage indexes
    ``linspace(0, rate, depth)[stage]``, so stage k needs depth > k; the class token is sized
    by ``embed_dim[-1]``, so only the last stage has one."""
    r = random.Random(seed)
    K = r.choice([1, 1, 2, 2, 3])
    keys = ("depth", "num_heads", "embed_dim", "patch_sizes", "patch_stride", "patch_padding", "kernel_qkv",
            "padding_q", "padding_kv", "stride_kv", "stride_q", "qkv_bias", "mlp_ratio", "cls_token",
            "qkv_projection_method", "drop_rate", "attention_drop_rate", "drop_path_rate")
    cfg = {k: [] for k in keys}
    odd_query = r.randrange(K) if r.random() < 0.25 else -1
    for k in range(K):
        H = r.choice([1, 2])
        kq = r.choice([1, 3, 3, 5])
        sq, pq = 1, (kq - 1) // 2  # the usual query projection: stride 1, 'same' padding
        if k == odd_query:  # strided (keeps the grid of a few small sizes, or of none) or 'valid' padding (none)
            kq = r.choice([1, 2, 3])
            sq, pq = r.choice([(1, 0), (2, 0), (2, 1), (3, 1), (2, 2)])
        cfg["depth"].append(k + 1)
        cfg["num_heads"].append(H)
        cfg["embed_dim"].append(H * r.choice([2, 3, 4]))
        cfg["patch_sizes"].append(r.randint(1, 7))
        cfg["patch_stride"].append(r.randint(1, 4))
        cfg["patch_padding"].append(r.randint(0, 3))
        cfg["kernel_qkv"].append(kq)
        cfg["stride_q"].append(sq)
        cfg["padding_q"].append(pq)
        cfg["stride_kv"].append(r.choice([1, 2, 2, 3]))
        cfg["padding_kv"].append(r.randint(0, 2))
        cfg["qkv_bias"].append(r.random() < 0.6)
        cfg["mlp_ratio"].append(r.choice([0.1, 0.25, 0.5, 1.0, 1.37, 2.0, 4.0, round(r.uniform(0.1, 4.0), 2)]))
        cfg["cls_token"].append(k == K - 1 and r.random() < 0.5)
        cfg["qkv_projection_method"].append("dw_bn")
        for key in ("drop_rate", "attention_drop_rate", "drop_path_rate"):
            cfg[key].append(0.0)
    cfg["num_channels"] = r.choice([1, 3])
    cfg["num_labels"] = r.choice([0, 3])
    return cfg


def hf_model(cfg: dict, seed: int, dtype):
    cls = "CvtForImageClassification" if seed % 2 else "CvtModel"
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nn.Linear(E, 0) of a small mlp_ratio: "zero-element tensors"
        hf = getattr(transformers, cls)(transformers.CvtConfig(**cfg)).to(dtype).eval()
    return randomized(hf, seed)


def _hf_run(hf, x):
    """HF's outputs (last hidden state, class token, logits), or the exception it raises
    (the logits through ``_hf_logits``: transformers 5.x's ``CvtForImageClassification``
    forward fails at every size when the last stage has no class token)."""
    try:
        if type(hf).__name__ == "CvtForImageClassification":
            base = hf.cvt(x)
            return base.last_hidden_state, base.cls_token_value, _hf_logits(hf, x, base)
        out = hf(x)
        return out.last_hidden_state, out.cls_token_value, None
    except Exception as e:  # noqa: BLE001 - torch's and transformers' errors vary (RuntimeError, ValueError)
        return e


def _conv(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def query_keeps_grid(cfg: dict, H: int, W: int) -> bool:
    """Whether every stage's query projection maps its token grid onto itself, by the
    convolution size formula (a transcription independent of opsplit's grid code)."""
    for k in range(len(cfg["depth"])):
        H, W = (_conv(n, cfg["patch_sizes"][k], cfg["patch_stride"][k], cfg["patch_padding"][k]) for n in (H, W))
        if min(H, W) < 1:
            return True  # the embedding does not fit: not a query projection question
        q = tuple(_conv(n, cfg["kernel_qkv"][k], cfg["stride_q"][k], cfg["padding_q"][k]) for n in (H, W))
        if q != (H, W):
            return False
    return True


def _refused_before_compute(model, x, match="pixel_values"):
    with _AtenOps() as rec, pytest.raises(ValueError, match=match) as info:
        model(x)
    started = [op for op in rec.ops if any(c in op for c in COMPUTE)]
    assert not started, f"refused after computing {started}: {info.value}"
    return info.value


def sweep(seed: int, dtype, sizes, tol, grad: bool) -> dict:
    """Run HF (float64, the reference) and opsplit (converted from a ``dtype`` copy) on
    every size; return the outcome counts.  In float32 the tolerance is against HF's
    float64 outputs: HF in float32 is itself up to ~8e-6 (of the scale) off them here, and
    the two float32 models differ from each other by up to ~1.5e-5.

    The one place where HF runs and opsplit refuses is a query projection that does not map
    the token grid onto itself: HF's residual sum then broadcasts a one-token attention
    output over the whole grid (a query grid of 1x1), or reads a query grid of another
    shape with the same number of tokens as the state's grid.  opsplit refuses (the
    attention term is a field on the state's grid); the sweep checks that this is exactly
    when it refuses such a size, and counts it."""
    cfg = random_config(seed)
    hf = hf_model(cfg, seed, torch.float64)  # the reference: HF in float64
    counts = {"run": 0, "refused": 0, "run_not_divisible": 0, "query_grid_differs": 0}
    try:
        model = from_hf(copy.deepcopy(hf).to(dtype))
    except ValueError as e:  # a query projection that keeps no token grid at any size
        assert "query projection keeps no token grid" in str(e), e
        for H, W in sizes:
            ref = _hf_run(hf, torch.zeros(1, cfg["num_channels"], H, W, dtype=torch.float64))
            assert isinstance(ref, Exception) or not query_keeps_grid(cfg, H, W), (H, W)
            counts["refused" if isinstance(ref, Exception) else "query_grid_differs"] += 1
        return counts
    g = torch.Generator().manual_seed(seed)
    for H, W in sizes:
        x = torch.randn(2, cfg["num_channels"], H, W, generator=g, dtype=torch.float64)
        ref = _hf_run(hf, x)
        if isinstance(ref, Exception):
            _refused_before_compute(model, x.to(dtype))
            counts["refused"] += 1
            continue
        if not query_keeps_grid(cfg, H, W):
            _refused_before_compute(model, x.to(dtype), "pixel_values.*the query projection must keep the token grid")
            counts["query_grid_differs"] += 1
            continue
        x1 = x.to(dtype).detach().clone().requires_grad_(grad)
        out = model(x1)
        assert_close(out.last_hidden_state.double(), ref[0], tol)
        assert (out.cls_token_value is None) == (ref[1] is None)
        if ref[1] is not None:
            assert_close(out.cls_token_value.double(), ref[1], tol)
        if ref[2] is not None:
            assert_close(out.logits.double(), ref[2], tol)
        if grad:
            w = torch.randn(ref[0].shape, generator=g, dtype=torch.float64)
            x2 = x.clone().requires_grad_()
            (hf.cvt if ref[2] is not None else hf)(x2).last_hidden_state.mul(w).sum().backward()
            out.last_hidden_state.mul(w).sum().backward()
            assert_close(x1.grad, x2.grad, tol)
        counts["run"] += 1
        strides = cfg["patch_stride"] + cfg["stride_kv"]
        counts["run_not_divisible"] += any(H % s or W % s for s in strides)
    return counts


N_CONFIGS = 24


@pytest.mark.parametrize("seed", range(N_CONFIGS))
def test_every_size_hf_runs_float64(seed):
    sweep(seed, torch.float64, SIZES, 1e-10, grad=True)


@pytest.mark.parametrize("seed", range(0, N_CONFIGS, 3))
def test_every_size_hf_runs_float32(seed):
    sweep(seed, torch.float32, SIZES[::2], 1e-5, grad=False)


def test_the_sweep_covers_what_it_claims():
    """The random configurations run and refuse sizes, most runs on sizes the strides do not
    divide (all refused before this fix), and cover the options of the issue."""
    total = {"run": 0, "refused": 0, "run_not_divisible": 0, "query_grid_differs": 0}
    cfgs = [random_config(s) for s in range(N_CONFIGS)]
    flat = lambda key: [v for c in cfgs for v in c[key]]  # noqa: E731
    assert {len(c["depth"]) for c in cfgs} == {1, 2, 3}
    assert {1, 2, 3} <= set(flat("stride_kv")) and {1, 2, 3, 4} <= set(flat("patch_stride"))
    assert {0, 1, 2, 3} <= set(flat("patch_padding")) and {1, 2, 3, 5} <= set(flat("kernel_qkv"))
    assert min(flat("mlp_ratio")) == 0.1 and max(flat("mlp_ratio")) == 4.0
    assert any(int(e * r) == 0 for c in cfgs for e, r in zip(c["embed_dim"], c["mlp_ratio"]))
    assert {True, False} <= {c["cls_token"][-1] for c in cfgs} and {2, 3} <= set(flat("stride_q"))
    for seed in range(0, N_CONFIGS, 4):
        for k, v in sweep(seed, torch.float64, SIZES[::3], 1e-10, grad=False).items():
            total[k] += v
    assert total["run"] >= 20 and total["refused"] >= 5 and total["run_not_divisible"] >= 0.5 * total["run"], total


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_named_sizes_of_the_issue():
    """A small config (stride-2 embedding and stride-2 K/V): 14x14 and 10x10 images (7x7 and
    5x5 token grids, 4x4 and 3x3 K/V grids), a 32x32 image with an odd 15x15 token grid, and
    mlp_ratio 0.1 (int(8 * 0.1) = 0 hidden units: the FFN is its output bias)."""
    cfg = dict(depth=[1], num_heads=[2], embed_dim=[8], patch_sizes=[3], patch_stride=[2], patch_padding=[0],
               kernel_qkv=[3], padding_q=[1], padding_kv=[1], stride_kv=[2], stride_q=[1], qkv_bias=[True],
               mlp_ratio=[0.1], cls_token=[True], qkv_projection_method=["dw_bn"], drop_rate=[0.0],
               attention_drop_rate=[0.0], drop_path_rate=[0.0])
    hf = hf_model(cfg, 2, torch.float64)  # CvtModel
    model = from_hf(hf)
    assert model.specs[0].mlp_hidden == 0
    for size, grid, kv in (((14, 14), (6, 6), (3, 3)), ((10, 10), (4, 4), (2, 2)), ((32, 32), (15, 15), (8, 8)),
                           ((33, 20), (16, 9), (8, 5))):
        assert model.output_grid(size).size == grid
        att = model.stage_operators(0)["attention"]
        assert att.projection_grids(model.output_grid(size))["K"].size == kv
        x = torch.randn(2, 3, *size, dtype=torch.float64)
        ref = hf(x)
        out = model(x)
        assert_close(out.last_hidden_state, ref.last_hidden_state, 1e-10)
        assert_close(out.cls_token_value, ref.cls_token_value, 1e-10)
    back = model.to_hf()  # hidden width 0 round-trips
    assert back.encoder.stages[0].layers[0].intermediate.dense.out_features == 0


def test_train_mode_on_sizes_the_strides_do_not_divide():
    """Training mode (batch statistics, running-statistics updates) on odd sizes; a batch of
    one image whose K/V grid is 1x1 gives batch norm one value per channel: HF refuses it
    (nn.BatchNorm2d), opsplit refuses it before compute, naming pixel_values."""
    cfg = dict(depth=[1, 2], num_heads=[1, 2], embed_dim=[4, 8], patch_sizes=[3, 3], patch_stride=[2, 2],
               patch_padding=[1, 1], kernel_qkv=[3, 3], padding_q=[1, 1], padding_kv=[1, 1], stride_kv=[2, 2],
               stride_q=[1, 1], qkv_bias=[True, False], mlp_ratio=[1.5, 0.3], cls_token=[False, True],
               qkv_projection_method=["dw_bn"] * 2, drop_rate=[0.0] * 2, attention_drop_rate=[0.0] * 2,
               drop_path_rate=[0.0] * 2)
    base = hf_model(cfg, 3, torch.float64)
    n_refused = 0
    for B, (H, W) in [(2, (7, 7)), (3, (11, 5)), (2, (15, 15)), (1, (9, 13)), (1, (3, 3)), (1, (5, 5)), (2, (3, 3))]:
        hf = copy.deepcopy(base).train()
        model = from_hf(hf)
        x = torch.randn(B, 3, H, W, dtype=torch.float64)
        ref = _hf_run(hf, x)
        if isinstance(ref, Exception):
            assert "more than 1 value per channel" in str(ref)
            _refused_before_compute(model, x, r"pixel_values: stage [12]'s [QKV] projection has a 1x1 token grid")
            n_refused += 1
            continue
        assert_close(model(x).last_hidden_state, ref[0], 1e-10)
        P = _hf_parts(hf)
        params = {id(p) for p in hf.parameters()}
        for ours, theirs, view in _pairs(model, P["parts"], P["head"], P["ln"]):
            if id(theirs) not in params:  # running statistics after one step
                torch.testing.assert_close(ours, view(theirs), rtol=0, atol=1e-12)
    assert n_refused == 2
