"""``opsplit convert``: a torch ``nn.TransformerEncoder``, a Hugging Face ViT and a Hugging
Face CvT, and the decoder-only LLMs GPT-2, Llama, Qwen2 and Mistral
(:mod:`opsplit.cli.convert_decoders`), built from a config (seeded, no download) and
converted to opsplit (:func:`opsplit.models.from_torch`, :func:`opsplit.models.from_hf`);
the table of the largest output and gradient differences, in float32 and float64 (and for
the LLMs, how many greedy tokens agree)."""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from ..models import from_hf, from_torch, to_torch
from . import convert_decoders as llm
from .budget import Estimate
from .config import ConfigError, Field, at_least, positive, seed_field
from .conversion import diff, perturb

NAME = "convert"
SUMMARY = ("convert a torch encoder, a Hugging Face ViT, CvT, GPT-2, Llama, Qwen2 or Mistral built from a "
           "config to opsplit; error table")
EXAMPLE = """\
examples:
  opsplit convert                                  # the three models, float32 and float64
  opsplit convert --models torch --layers 4 --d-model 32 --nhead 8
  opsplit convert --models gpt2 llama qwen2 mistral   # the decoder-only LLMs (+ greedy generation)
  opsplit convert --config convert.toml

convert.toml:
  [convert]
  models = ["torch", "vit", "cvt"]
  dtypes = ["float32", "float64"]
  [torch]                 # nn.TransformerEncoder(nn.TransformerEncoderLayer(...), num_layers)
  d_model = 32
  nhead = 4
  norm_first = true
  [vit]                   # transformers.ViTModel(ViTConfig(...)), random weights
  image_size = 32
  patch_size = 8
  [cvt]                   # transformers.CvtModel(CvtConfig(...)): one entry per stage
  depth = [1, 2]
  embed_dim = [8, 16]
  [llama]                 # transformers.LlamaForCausalLM(LlamaConfig(...)), random weights
  num_attention_heads = 4
  num_key_value_heads = 1 # multi-query
  seq_len = 8             # prompt tokens; new_tokens: greedy tokens generated
  new_tokens = 16
"""

MODELS = ("torch", "vit", "cvt") + llm.FAMILIES


SCHEMA = {
    "convert": {
        "models": Field("str_list", ["torch", "vit", "cvt"], "which models to convert", choices=MODELS),
        "dtypes": Field("str_list", ["float32", "float64"], "floating types",
                        choices=("float32", "float64")),
        "seed": seed_field("seed of the weights and inputs"),
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
    **llm.SCHEMA,
}


def add_arguments(p):
    p.add_argument("--models", nargs="+", metavar="M", help="torch vit cvt gpt2 llama qwen2 mistral")
    p.add_argument("--dtypes", nargs="+", metavar="D", help="float32 float64")
    p.add_argument("--layers", type=int, help="torch.num_layers")
    p.add_argument("--d-model", type=int, help="torch.d_model")
    p.add_argument("--nhead", type=int, help="torch.nhead")
    p.add_argument("--seed", type=int, help="convert.seed")


def overrides(a) -> dict:
    return {"convert.models": a.models, "convert.dtypes": a.dtypes, "torch.num_layers": a.layers,
            "torch.d_model": a.d_model, "torch.nhead": a.nhead, "convert.seed": a.seed}


def check(cfg) -> None:
    """The cross-key checks of the requested models (no model built)."""
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
    hf = [m for m in models if m != "torch"]
    if hf:
        try:
            # optional: only the Hugging Face models need it
            import transformers  # noqa: F401
        except ImportError:
            raise ConfigError(f"convert.models: {', '.join(map(repr, hf))} need the transformers package "
                              "(pip install transformers, or the [test] extra)") from None
    llm.check(cfg, [m for m in models if m in llm.FAMILIES])
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
        sides = cvt_sides(c)
        if min(sides) < 1:
            raise ConfigError(f"cvt.image_size: the stages' convolutional embeddings (kernels "
                              f"{c['patch_sizes']}, strides {c['patch_stride']}) leave token grids of "
                              f"side {sides}; expected an image_size that leaves every stage >= 1 token "
                              f"per side, got {c['image_size']}")


def cvt_sides(c: dict) -> list[int]:
    """The token grid's side after each stage's convolutional embedding (padding (k-1)//2)."""
    n, out = c["image_size"], []
    for k, s in zip(c["patch_sizes"], c["patch_stride"]):
        n = (n + 2 * ((k - 1) // 2) - k) // s + 1
        out.append(n)
    return out


def _encoder_cost(B, L, d, ff, layers, heads) -> tuple[float, float, float]:
    """``(flops, parameters, activation elements)`` of a pre/post-norm encoder's forward."""
    params = layers * (4.0 * d * d + 2.0 * d * ff + 9.0 * d + ff)
    flops = layers * (2.0 * B * L * (4.0 * d * d + 2.0 * d * ff) + 4.0 * B * L * L * d)
    act = layers * (B * L * (10.0 * d + 2.0 * ff) + 3.0 * B * heads * L * L)
    return flops, params, act


def estimate(cfg) -> Estimate:
    """Per model and dtype: the reference and the converted model, each forward and backward
    (3 forward passes' flops; the torch round trip adds two forwards), both models' parameters
    and one autograd graph each at the peak."""
    c = cfg["convert"]
    B, total = c["batch"], Estimate()
    for name in c["models"]:
        if name == "torch":
            t = cfg["torch"]
            f, p, a = _encoder_cost(B, t["seq_len"], t["d_model"], t["dim_feedforward"],
                                    t["num_layers"], t["nhead"])
            passes, copies, calls = 8, 3, 8 * t["num_layers"] * 8
        elif name == "vit":
            v = cfg["vit"]
            L = (v["image_size"] // v["patch_size"]) ** 2 + 1
            f, p, a = _encoder_cost(B, L, v["hidden_size"], v["intermediate_size"],
                                    v["num_hidden_layers"], v["num_attention_heads"])
            emb = v["num_channels"] * v["patch_size"] ** 2 * v["hidden_size"]
            f += 2.0 * B * (L - 1) * emb
            p += emb + L * v["hidden_size"]
            a += B * v["num_channels"] * v["image_size"] ** 2
            passes, copies, calls = 6, 2, 6 * v["num_hidden_layers"] * 8
        elif name in llm.FAMILIES:
            total += llm.estimate(cfg, name, B).times(len(c["dtypes"]))
            continue
        else:
            cv = cfg["cvt"]
            f = p = a = 0.0
            calls, prev = 0, cv["num_channels"]
            a += B * prev * float(cv["image_size"]) ** 2
            for side, d, h, depth, k in zip(cvt_sides(cv), cv["embed_dim"], cv["num_heads"],
                                            cv["depth"], cv["patch_sizes"]):
                L = max(side, 0) ** 2 + 1
                f += 2.0 * B * L * prev * k * k * d
                p += prev * k * k * d
                ff, pp, aa = _encoder_cost(B, L, d, 2 * d, depth, h)
                f += ff + depth * 2.0 * B * L * 27.0 * d
                p += pp + depth * 27.0 * d
                a += aa
                calls += depth * 12
                prev = d
            passes, copies, calls = 6, 2, 6 * calls
        el = 8.0 if "float64" in c["dtypes"] else 4.0
        one = Estimate(passes * f, float(calls), el * (copies * 2.0 * p + 2.0 * a))
        total += one.times(len(c["dtypes"]))
    return total


def prepare(cfg) -> dict:
    """The converters' own checks: each requested model is built from its section and
    converted once (small: the guard ran first)."""
    c = cfg["convert"]
    for name in c["models"]:
        try:
            BUILDERS[name](cfg[name], c["seed"])
        except (ValueError, TypeError, NotImplementedError) as e:
            raise ConfigError(f"{name}: {' '.join(str(e).split())}") from None
    return {}


def _torch_reference(t: dict, seed: int):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        t["d_model"], t["nhead"], t["dim_feedforward"], dropout=0.0, activation=t["activation"],
        layer_norm_eps=t["layer_norm_eps"], batch_first=True, norm_first=t["norm_first"],
    )
    norm = nn.LayerNorm(t["d_model"], eps=t["layer_norm_eps"]) if t["final_norm"] else None
    return nn.TransformerEncoder(layer, t["num_layers"], norm=norm, enable_nested_tensor=False)


def _vit_reference(v: dict, seed: int):
    # optional (checked by check), and slow to import
    import transformers

    torch.manual_seed(seed)
    return transformers.ViTModel(transformers.ViTConfig(**v))


def _cvt_reference(c: dict, seed: int):
    # optional (checked by check), and slow to import
    import transformers

    torch.manual_seed(seed)
    return transformers.CvtModel(transformers.CvtConfig(**cvt_config(c)))


def _build_torch(t: dict, seed: int):
    return from_torch(_torch_reference(t, seed))


def _build_vit(v: dict, seed: int):
    return from_hf(_vit_reference(v, seed))


def _build_cvt(c: dict, seed: int):
    model = from_hf(_cvt_reference(c, seed))
    x = torch.zeros(1, c["num_channels"], c["image_size"], c["image_size"])
    with torch.no_grad():
        model(x)  # the image size against the stages' grids (opsplit.models.CvT's checks)
    return model


BUILDERS = {"torch": _build_torch, "vit": _build_vit, "cvt": _build_cvt, **llm.BUILDERS}


def convert_torch(t: dict, batch: int, seed: int, dtype) -> dict:
    """Build the torch encoder, convert it, compare outputs, input gradients and the
    round trip ``to_torch(from_torch(m))``."""
    ref = _torch_reference(t, seed)
    gen = torch.Generator().manual_seed(seed)
    ref = perturb(ref.to(dtype), gen).eval()
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
    out_abs, out_rel = diff(y.detach(), y_ref.detach())
    g_abs, _ = diff(x2.grad, x1.grad)
    rt_abs, _ = diff(y_back, y_ref0)
    return {"model": f"nn.TransformerEncoder ({t['num_layers']} layers, "
                     f"{'pre' if t['norm_first'] else 'post'}-norm, {t['activation']})",
            "opsplit class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""),
            "max abs diff (output)": out_abs, "relative diff (output)": out_rel, "max abs diff (input grad)": g_abs,
            "round trip": rt_abs, "parameters": sum(p.numel() for p in ref.parameters())}


def _image_model(ref, c: dict, batch: int, seed: int, dtype):
    """A Hugging Face image model ``ref`` (random weights added, eval mode) and its conversion
    on the same seeded images of section ``c``: ``(ref output, opsplit output, output diffs,
    input-gradient diff)`` (the gradients of a random linear functional of the last hidden
    state)."""
    gen = torch.Generator().manual_seed(seed)
    ref = perturb(ref.to(dtype), gen).eval()
    model = from_hf(ref).eval()
    x = torch.randn(batch, c["num_channels"], c["image_size"], c["image_size"], generator=gen,
                    dtype=torch.float64).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    r, o = ref(x1), model(x2)
    w = torch.randn(o.last_hidden_state.shape, generator=gen, dtype=torch.float64).to(dtype)
    (r.last_hidden_state * w).sum().backward()
    (o.last_hidden_state * w).sum().backward()
    out = diff(o.last_hidden_state.detach(), r.last_hidden_state.detach())
    return ref, model, r, o, out, diff(x2.grad, x1.grad)[0]


def _row(what: str, ref, model, dtype, out_abs: float, out_rel: float, g_abs) -> dict:
    return {"model": what, "opsplit class": type(model).__name__, "dtype": str(dtype).replace("torch.", ""),
            "max abs diff (output)": out_abs, "relative diff (output)": out_rel, "max abs diff (input grad)": g_abs,
            "round trip": "", "parameters": sum(p.numel() for p in ref.parameters())}


def convert_vit(v: dict, batch: int, seed: int, dtype) -> dict:
    ref, model, r, o, (out_abs, out_rel), g_abs = _image_model(_vit_reference(v, seed), v, batch, seed, dtype)
    pool_abs, _ = diff(o.pooler_output.detach(), r.pooler_output.detach())
    return _row(f"HF ViTModel ({v['num_hidden_layers']} layers, {v['image_size']}px, patch {v['patch_size']})",
                ref, model, dtype, max(out_abs, pool_abs), out_rel, g_abs)


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
    ref, model, r, o, (out_abs, out_rel), g_abs = _image_model(_cvt_reference(c, seed), c, batch, seed, dtype)
    if r.cls_token_value is not None:
        out_abs = max(out_abs, diff(o.cls_token_value.detach(), r.cls_token_value.detach())[0])
    return _row(f"HF CvtModel ({len(c['depth'])} stages, depths {c['depth']}, {c['image_size']}px)",
                ref, model, dtype, out_abs, out_rel, g_abs)


# name -> builder(section config, batch, seed, dtype) -> a table row; a new converter plugs
# in here with a schema section of the same name
CONVERTERS = {"torch": convert_torch, "vit": convert_vit, "cvt": convert_cvt, **llm.CONVERTERS}
#: the table's columns (a row leaves out what does not apply to its model)
COLUMNS = ("model", "opsplit class", "dtype", "max abs diff (output)", "relative diff (output)",
           "max abs diff (input grad)", "relative diff (parameter grads)", "greedy tokens equal", "round trip",
           "parameters")


def run(cfg, plan, out, progress=True, heading="Converted models", prefix=""):
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
        "hidden state and pooler; the LLMs: the logits of every position of a left-padded "
        "batch); relative: divided by the largest absolute reference "
        "output; input grad: the gradients with respect to the input of a random linear "
        "functional of the outputs; parameter grads (the LLMs): the gradients of that functional "
        "with respect to every parameter, the largest difference relative to the largest entry of "
        "each parameter's gradient; greedy tokens equal (the LLMs): new tokens of opsplit's "
        "generate equal to Hugging Face's generate (do_sample=False, key/value cache), out of "
        "all generated; round trip: to_torch(from_torch(m)) against m, both under no_grad."
    )
    out.table(f"{prefix}conversion_errors", rows, columns=COLUMNS, title="opsplit against the original model")
    for r in rows:
        g = r["max abs diff (input grad)"]
        grad = f"grad {g:.2e}" if g != "" else f"parameter grads {r['relative diff (parameter grads)']:.2e} (rel)"
        tokens = f"  greedy {r['greedy tokens equal']}" if r.get("greedy tokens equal") else ""
        print(f"  {r['model']:<55} {r['dtype']:<8} max abs diff {r['max abs diff (output)']:.2e}  {grad}{tokens}")
    return rows
