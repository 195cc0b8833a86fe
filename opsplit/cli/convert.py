"""``opsplit convert``: a torch ``nn.TransformerEncoder`` and a Hugging Face ViT built from
a config (seeded, no download) converted to opsplit (:func:`opsplit.models.from_torch`,
:func:`opsplit.models.from_hf`); the table of the largest output and input-gradient
differences, in float32 and float64."""

from __future__ import annotations

import torch

from .config import ConfigError, Field, at_least, positive

NAME = "convert"
SUMMARY = "convert torch / Hugging Face transformers built from a config to opsplit; error table"
EXAMPLE = """\
examples:
  opsplit convert                                  # both models, float32 and float64
  opsplit convert --models torch --layers 4 --d-model 32 --nhead 8
  opsplit convert --config convert.toml

convert.toml:
  [convert]
  models = ["torch", "vit"]
  dtypes = ["float32", "float64"]
  [torch]                 # nn.TransformerEncoder(nn.TransformerEncoderLayer(...), num_layers)
  d_model = 32
  nhead = 4
  norm_first = true
  [vit]                   # transformers.ViTModel(ViTConfig(...)), random weights
  image_size = 32
  patch_size = 8
"""

MODELS = ("torch", "vit", "cvt")


SCHEMA = {
    "convert": {
        "models": Field("str_list", list(MODELS), "which models to convert", choices=MODELS),
        "dtypes": Field("str_list", ["float32", "float64"], "floating types",
                        choices=("float32", "float64")),
        "seed": Field("int", 0, "seed of the weights and inputs", at_least(0)),
        "batch": Field("int", 2, "inputs per batch", at_least(1)),
    },
    "torch": {
        "d_model": Field("int", 16, "model width", at_least(1)),
        "nhead": Field("int", 4, "attention heads (a divisor of d_model)", at_least(1)),
        "dim_feedforward": Field("int", 32, "FFN hidden width", at_least(1)),
        "num_layers": Field("int", 2, "encoder layers", at_least(1)),
        "norm_first": Field("bool", False, "pre-norm (true) or post-norm (false) layers"),
        "activation": Field("str", "relu", "FFN activation", choices=("relu", "gelu")),
        "final_norm": Field("bool", True, "a final LayerNorm after the stack"),
        "layer_norm_eps": Field("float", 1e-5, "LayerNorm eps", positive),
        "seq_len": Field("int", 10, "tokens per sequence", at_least(1)),
    },
    "vit": {
        "hidden_size": Field("int", 24, "model width", at_least(1)),
        "num_hidden_layers": Field("int", 2, "encoder layers", at_least(1)),
        "num_attention_heads": Field("int", 3, "heads (a divisor of hidden_size)", at_least(1)),
        "intermediate_size": Field("int", 40, "FFN hidden width", at_least(1)),
        "image_size": Field("int", 16, "image side (a multiple of patch_size)", at_least(1)),
        "patch_size": Field("int", 4, "patch side", at_least(1)),
        "num_channels": Field("int", 3, "image channels", at_least(1)),
        "hidden_act": Field("str", "gelu", "FFN activation", choices=("gelu", "relu", "gelu_new")),
    },
    "cvt": {  # transformers.CvtModel(CvtConfig(...)): one entry per stage in the lists
        "depth": Field("int_list", [1, 2], "layers per stage", at_least(1)),
        "num_heads": Field("int_list", [1, 2], "heads per stage", at_least(1)),
        "embed_dim": Field("int_list", [8, 16], "channels per stage (multiples of the heads)",
                           at_least(1)),
        "patch_sizes": Field("int_list", [3, 3], "convolutional token embedding kernel per stage",
                             at_least(1)),
        "patch_stride": Field("int_list", [2, 2], "its stride per stage", at_least(1)),
        "cls_token": Field("bool", True, "a class token in the last stage"),
        "image_size": Field("int", 16, "image side", at_least(1)),
        "num_channels": Field("int", 3, "image channels", at_least(1)),
    },
}


def add_arguments(p):
    p.add_argument("--models", nargs="+", metavar="M", help="torch vit")
    p.add_argument("--dtypes", nargs="+", metavar="D", help="float32 float64")
    p.add_argument("--layers", type=int, help="torch.num_layers")
    p.add_argument("--d-model", type=int, help="torch.d_model")
    p.add_argument("--nhead", type=int, help="torch.nhead")
    p.add_argument("--seed", type=int, help="convert.seed")


def overrides(a) -> dict:
    return {"convert.models": a.models, "convert.dtypes": a.dtypes, "torch.num_layers": a.layers,
            "torch.d_model": a.d_model, "torch.nhead": a.nhead, "convert.seed": a.seed}


def prepare(cfg) -> dict:
    t, v = cfg["torch"], cfg["vit"]
    models = cfg["convert"]["models"]
    if "torch" in models and t["d_model"] % t["nhead"]:
        raise ConfigError(f"torch.nhead: expected a divisor of torch.d_model = {t['d_model']}, "
                          f"got {t['nhead']}")
    if "vit" in models:
        if v["hidden_size"] % v["num_attention_heads"]:
            raise ConfigError(f"vit.num_attention_heads: expected a divisor of vit.hidden_size = "
                              f"{v['hidden_size']}, got {v['num_attention_heads']}")
        if v["image_size"] % v["patch_size"]:
            raise ConfigError(f"vit.patch_size: expected a divisor of vit.image_size = "
                              f"{v['image_size']} (whole patches), got {v['patch_size']}")
    if "vit" in models or "cvt" in models:
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise ConfigError("convert.models: 'vit' and 'cvt' need the transformers package "
                              "(pip install transformers, or the [test] extra)") from None
    if "cvt" in models:
        c = cfg["cvt"]
        keys = ("depth", "num_heads", "embed_dim", "patch_sizes", "patch_stride")
        lengths = {k: len(c[k]) for k in keys}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"cvt.{'/'.join(keys)}: expected one entry per stage in each, got "
                              f"lengths {lengths}")
        if any(d <= k for k, d in enumerate(c["depth"])):
            raise ConfigError(f"cvt.depth: expected depth[k] > k for stage k (transformers' CvtStage "
                              f"indexes its per-layer drop-path rates by the stage), got {c['depth']}")
        for d, h in zip(c["embed_dim"], c["num_heads"]):
            if d % h:
                raise ConfigError(f"cvt.embed_dim: expected multiples of cvt.num_heads = "
                                  f"{c['num_heads']}, got {c['embed_dim']}")
    return {}


def _perturb(module, gen):
    # random weights everywhere (biases and LayerNorm affines included), so that a missed
    # parameter shows in the difference
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))
    return module


def _diff(a, b) -> tuple[float, float]:
    d = float((a - b).abs().max())
    return d, d / max(float(b.abs().max()), 1e-300)


def convert_torch(t: dict, batch: int, seed: int, dtype) -> dict:
    """Build the torch encoder, convert it, compare outputs, input gradients and the
    round trip ``to_torch(from_torch(m))``."""
    from torch import nn

    from ..models import from_torch, to_torch

    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        t["d_model"], t["nhead"], t["dim_feedforward"], dropout=0.0, activation=t["activation"],
        layer_norm_eps=t["layer_norm_eps"], batch_first=True, norm_first=t["norm_first"],
    )
    norm = nn.LayerNorm(t["d_model"], eps=t["layer_norm_eps"]) if t["final_norm"] else None
    ref = nn.TransformerEncoder(layer, t["num_layers"], norm=norm, enable_nested_tensor=False)
    gen = torch.Generator().manual_seed(seed)
    ref = _perturb(ref.to(dtype), gen).eval()
    model = from_torch(ref).eval()
    x = torch.randn(batch, t["seq_len"], t["d_model"], generator=gen, dtype=torch.float64).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = ref(x1), model(x2)
    w = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    back = to_torch(model).eval()
    with torch.no_grad():  # both in the same mode (no_grad may take torch's fast path)
        y_back, y_ref0 = back(x), ref(x)
    out_abs, out_rel = _diff(y.detach(), y_ref.detach())
    g_abs, _ = _diff(x2.grad, x1.grad)
    rt_abs, _ = _diff(y_back, y_ref0)
    return {"model": f"nn.TransformerEncoder ({t['num_layers']} layers, "
                     f"{'pre' if t['norm_first'] else 'post'}-norm, {t['activation']})",
            "opsplit class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""),
            "max abs diff (output)": out_abs, "relative diff (output)": out_rel, "max abs diff (input grad)": g_abs,
            "round trip": rt_abs, "parameters": sum(p.numel() for p in ref.parameters())}


def convert_vit(v: dict, batch: int, seed: int, dtype) -> dict:
    import transformers

    from ..models import from_hf

    torch.manual_seed(seed)
    cfg = transformers.ViTConfig(**v)
    ref = transformers.ViTModel(cfg)
    gen = torch.Generator().manual_seed(seed)
    ref = _perturb(ref.to(dtype), gen).eval()
    model = from_hf(ref).eval()
    x = torch.randn(batch, v["num_channels"], v["image_size"], v["image_size"], generator=gen,
                    dtype=torch.float64).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    r, o = ref(x1), model(x2)
    w = torch.randn(o.last_hidden_state.shape, generator=gen, dtype=torch.float64).to(dtype)
    (r.last_hidden_state * w).sum().backward()
    (o.last_hidden_state * w).sum().backward()
    out_abs, out_rel = _diff(o.last_hidden_state.detach(), r.last_hidden_state.detach())
    pool_abs, _ = _diff(o.pooler_output.detach(), r.pooler_output.detach())
    g_abs, _ = _diff(x2.grad, x1.grad)
    return {"model": f"HF ViTModel ({v['num_hidden_layers']} layers, {v['image_size']}px, "
                     f"patch {v['patch_size']})",
            "opsplit class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""),
            "max abs diff (output)": max(out_abs, pool_abs), "relative diff (output)": out_rel,
            "max abs diff (input grad)": g_abs, "round trip": "",
            "parameters": sum(p.numel() for p in ref.parameters())}


def cvt_config(c: dict) -> dict:
    """A ``transformers.CvtConfig``'s arguments from the [cvt] section (the per-stage lists
    the section leaves out: 3 x 3 depth-wise Q/K/V convolutions, stride 1, Q/K/V biases, MLP
    ratio 2, no dropout)."""
    K = len(c["depth"])
    return dict(
        depth=c["depth"], num_heads=c["num_heads"], embed_dim=c["embed_dim"],
        patch_sizes=c["patch_sizes"], patch_stride=c["patch_stride"],
        patch_padding=[(p - 1) // 2 for p in c["patch_sizes"]], kernel_qkv=[3] * K,
        padding_q=[1] * K, padding_kv=[1] * K, stride_kv=[1] * K, stride_q=[1] * K,
        qkv_bias=[True] * K, mlp_ratio=[2.0] * K, cls_token=[False] * (K - 1) + [c["cls_token"]],
        qkv_projection_method=["dw_bn"] * K, drop_rate=[0.0] * K, attention_drop_rate=[0.0] * K,
        drop_path_rate=[0.0] * K, num_channels=c["num_channels"],
    )


def convert_cvt(c: dict, batch: int, seed: int, dtype) -> dict:
    import transformers

    from ..models import from_hf

    torch.manual_seed(seed)
    ref = transformers.CvtModel(transformers.CvtConfig(**cvt_config(c)))
    gen = torch.Generator().manual_seed(seed)
    ref = _perturb(ref.to(dtype), gen).eval()
    model = from_hf(ref).eval()
    x = torch.randn(batch, c["num_channels"], c["image_size"], c["image_size"], generator=gen,
                    dtype=torch.float64).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    r, o = ref(x1), model(x2)
    w = torch.randn(o.last_hidden_state.shape, generator=gen, dtype=torch.float64).to(dtype)
    (r.last_hidden_state * w).sum().backward()
    (o.last_hidden_state * w).sum().backward()
    out_abs, out_rel = _diff(o.last_hidden_state.detach(), r.last_hidden_state.detach())
    if r.cls_token_value is not None:
        out_abs = max(out_abs, _diff(o.cls_token_value.detach(), r.cls_token_value.detach())[0])
    g_abs, _ = _diff(x2.grad, x1.grad)
    return {"model": f"HF CvtModel ({len(c['depth'])} stages, depths {c['depth']}, "
                     f"{c['image_size']}px)",
            "opsplit class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""),
            "max abs diff (output)": out_abs, "relative diff (output)": out_rel,
            "max abs diff (input grad)": g_abs, "round trip": "",
            "parameters": sum(p.numel() for p in ref.parameters())}


# name -> builder(section config, batch, seed, dtype) -> a table row; a new converter plugs
# in here with a schema section of the same name
CONVERTERS = {"torch": convert_torch, "vit": convert_vit, "cvt": convert_cvt}


def run(cfg, plan, out, progress=True, heading="Converted models", prefix=""):
    from tqdm.auto import tqdm

    c = cfg["convert"]
    jobs = [(m, d) for m in c["models"] for d in c["dtypes"]]
    rows = []
    for m, d in tqdm(jobs, desc="convert", disable=not progress, leave=False):
        rows.append(CONVERTERS[m](cfg[m], c["batch"], c["seed"], getattr(torch, d)))
    out.heading(heading)
    out.text(
        "Each model is built from the config with seeded random weights (no download), "
        "converted to opsplit, and run on the same seeded input in eval mode. "
        "max abs diff (output): the largest absolute difference of the outputs (ViT: last "
        "hidden state and pooler); relative: divided by the largest absolute reference "
        "output; input grad: the gradients with respect to the input of a random linear "
        "functional of the outputs; round trip: to_torch(from_torch(m)) against m, both "
        "under no_grad."
    )
    out.table(f"{prefix}conversion_errors", rows, title="opsplit against the original model")
    for r in rows:
        print(f"  {r['model']:<55} {r['dtype']:<8} max abs diff {r['max abs diff (output)']:.2e}  "
              f"grad {r['max abs diff (input grad)']:.2e}")
    return rows
