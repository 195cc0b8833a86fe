"""Digits at other pixel grids: a model trained on the 8 x 8 digits, evaluated without
retraining on the same test digits resampled to 16 x 16 and 32 x 32.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/digits_resolution.py

Two models, trained once each on 8 x 8 (split seed 0, weight seed 0):

* the digits classifier of ``benchmarks/train_digits.py`` (``ImageClassifier`` with a
  ``SplitEncoder``: 2 x 2 patches, 16 tokens and a class token; the recipe's 100 epochs with
  small random affine moves);
* a one-stage CvT (``build_cvt``: convolutional token embedding 3 x 3, stride 2, padding 1 ->
  a 4 x 4 token grid, 32 channels, depth 2, 2 heads, depthwise 3 x 3 Q/K/V convolutions, mean
  read-out), same optimizer, schedule and augmentation.

Test images: the 359 held-out 8 x 8 digits, upsampled by ``F.interpolate`` (bilinear,
``align_corners=False``: FlexiViT's image resize; and nearest) to 16 x 16 and 32 x 32.
Embeddings compared on the larger images, the trained weights unchanged:

* **integral** (opsplit): the patch embedding (resp. the CvT's first convolution) as the
  convolution integral with a kernel constant on the 8 x 8 training cells, its quadrature on
  the image's own pixel grid (``IntegralPatchEmbedding``, ``OnPixelGrid``): the same 16
  tokens from larger patches;
* **PI-resize** (FlexiViT, Beyer et al. 2023; ViT only): the 2 x 2 patch weights w resized
  to p x p (p = 4, 8) by the pseudo-inverse of the bilinear resize B of a patch,
  w' = B (B^T B)^-1 w, so that <B x, w'> = <x, w> for every patch x;
* **vanilla resize** (ViT): w bilinearly resized to p x p (FlexiViT's failing baseline);
* **bare CvT**: the CvT applied to the larger image as it is (its kernels in pixels: 4x or
  16x more tokens that each see a smaller part of the digit).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import _common
import torch
import torch.nn.functional as F
import train_digits

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import load_digits
from opsplit.models import (
    CvtStageSpec,
    IntegralPatchEmbedding,
    OnPixelGrid,
    PatchEmbedding,
    build_cvt,
)

OUT = _common.OUT / "digits_resolution"
SIZES = (8, 16, 32)


def resample(images, size: int, mode: str):
    if images.shape[-1] == size:
        return images
    if mode == "nearest":
        k = size // images.shape[-1]
        return images.repeat_interleave(k, 2).repeat_interleave(k, 3)
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


def resize_matrix(p: int, q: int) -> torch.Tensor:
    """B (q^2 x p^2): the bilinear resize of a p x p patch to q x q, as a matrix."""
    basis = torch.eye(p * p, dtype=torch.float64).view(p * p, 1, p, p)
    out = F.interpolate(basis, size=(q, q), mode="bilinear", align_corners=False)
    return out.view(p * p, q * q).t()


class ResizedPatchEmbedding(torch.nn.Module):
    """A trained PatchEmbedding with its patch weights resized to q x q (``pi``: FlexiViT's
    pseudo-inverse resize; else the vanilla bilinear resize); positions and tokens unchanged."""

    def __init__(self, emb: PatchEmbedding, q: int, pi: bool):
        super().__init__()
        p = emb.patch_size[0]
        B = resize_matrix(p, q)  # (q^2, p^2)
        W = emb.weight.detach().double()  # (p^2, N_y), rows in (row, col) order of the patch
        if pi:
            W2 = B @ torch.linalg.solve(B.t() @ B, W)  # B (B^T B)^-1 W
        else:
            W2 = F.interpolate(W.t().reshape(-1, 1, p, p), size=(q, q), mode="bilinear",
                               align_corners=False).reshape(W.shape[1], q * q).t()
        self.emb, self.q = emb, q
        self.register_buffer("W2", W2.to(emb.weight.dtype))

    def forward(self, x):
        B_, C, H, W = x.shape
        q, g = self.q, H // self.q
        R = x.reshape(B_, C, g, q, g, q).permute(0, 2, 4, 1, 3, 5).reshape(B_, g * g, C * q * q)
        u = R @ self.W2 + self.emb.bias
        v0 = self.emb.cls_token.view(1, 1, -1).expand(B_, 1, -1)
        return torch.cat([v0, u], 1) + self.emb.position


def train(model, train_set, test_set, args, output=None):
    cfg = TrainConfig(epochs=args.epochs, batch_size=64, lr=3e-3, weight_decay=0.05, schedule="cosine",
                      warmup_steps=50, grad_clip=1.0, seed=0, eval_every=10**6, progress=False)
    aug = train_digits.augment(train_digits.settings())
    trainer = Trainer(model, Objective("cross_entropy", output=output), cfg, augment=aug)
    t = time.process_time()
    trainer.fit(train_set)
    return time.process_time() - t


@torch.no_grad()
def accuracy(fn, images, labels) -> float:
    out = fn(images)
    out = getattr(out, "logits", out)
    return float((out.argmax(-1) == labels).double().mean())


def cvt_model():
    torch.manual_seed(0)
    return build_cvt(1, [CvtStageSpec(in_channels=1, embed_dim=32, depth=2, num_heads=2, patch_size=3,
                                      patch_stride=2, patch_padding=1, mlp_hidden=64)], num_labels=10)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=100)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    train_set, test_set = load_digits(seed=0)
    x8, y = test_set.inputs, test_set.targets
    rows = []

    vit = train_digits.build(train_digits.settings())
    cpu_vit = train(vit, train_set, test_set, args)
    vit.eval()
    plain = vit.embedding
    integral = IntegralPatchEmbedding.from_patch_embedding(plain)
    cvt = cvt_model()
    cpu_cvt = train(cvt, train_set, test_set, args, output="logits")
    cvt.eval()
    on_grid = OnPixelGrid(cvt, 8)
    for mode in ("bilinear", "nearest"):
        for n in SIZES:
            x = resample(x8, n, mode)
            res = {"resample": mode, "size": n}
            vit.embedding = integral
            res["vit_integral"] = accuracy(vit, x, y)
            if n > 8:
                for name, pi in (("vit_pi_resize", True), ("vit_vanilla_resize", False)):
                    vit.embedding = ResizedPatchEmbedding(plain, 2 * n // 8, pi)
                    res[name] = accuracy(vit, x, y)
            vit.embedding = plain
            res["cvt_integral"] = accuracy(on_grid, x, y)
            res["cvt_bare"] = accuracy(cvt, x, y)
            rows.append(res)
            print(json.dumps(res), flush=True)
    info = {"vit_train_cpu_s": cpu_vit, "cvt_train_cpu_s": cpu_cvt, "epochs": args.epochs, "n_test": len(y),
            "vit_params": sum(q.numel() for q in vit.parameters()), "cvt_params": sum(q.numel() for q in cvt.parameters()),
            "loadavg": _common.loadavg()}
    print(json.dumps(info))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps({"rows": rows, "info": info}, indent=1))
    cols = ["vit_integral", "vit_pi_resize", "vit_vanilla_resize", "cvt_integral", "cvt_bare"]
    print("| resample | size | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for r in rows:
        print(f"| {r['resample']} | {r['size']} | " + " | ".join(
            f"{100 * r[c]:.2f} %" if c in r else "= integral" for c in cols) + " |")


if __name__ == "__main__":
    main()
