"""Float32 rounding of the paper's transformer: opsplit vs an independent transcription of
paper 002's eqs. (27)-(35) (``opsplit.analysis.formulas``), both against the float64
evaluation of the same map.

    python benchmarks/paper_float32.py [--seeds 60]

Prints, per N_t, the worst max-abs difference over random models and inputs of
  opsplit(f32) - reference(f32),  opsplit(f32) - reference(f64),  reference(f32) - reference(f64),
and opsplit(f64) - reference(f64).  Used for the figures in docs/paper_scheme.md.
"""

import argparse
import math

import torch

from opsplit.analysis.formulas import paper_transformer
from opsplit.models import PaperTransformer

CONFIGS = [(2, 16, 12, 2), (2, 5, 8, 2), (3, 7, 6, 3), (1, 3, 4, 1), (4, 32, 24, 2)]


def weights(model, nt):
    a = model.attention
    return [
        {
            "WQ": a.WQ(n), "WK": a.WK(n), "WV": a.WV(n),
            "Ws": [f.W(n) for f in model.ffn], "bs": [f.b(n) for f in model.ffn],
            "s1": model.norm.sigma1(n), "s2": model.norm.sigma2(n),
        }
        for n in range(nt)
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=60)
    args = p.parse_args()
    print(f"{'N_t':>4} {'op32-ref32':>11} {'op32-ref64':>11} {'ref32-ref64':>12} {'op64-ref64':>11}  max|u|")
    for nt in (1, 2, 4, 6):
        w = [0.0] * 4
        umax = 0.0
        for seed in range(args.seeds):
            for B, nx, ny, J in CONFIGS:
                torch.manual_seed(seed)
                m = PaperTransformer(ny, n_x=nx, J=J, n_steps=nt)
                m64 = PaperTransformer(ny, n_x=nx, J=J, n_steps=nt, dtype=torch.float64)
                m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
                f = torch.randn(B, nx, ny)
                s = 1 / math.sqrt(ny)
                with torch.no_grad():
                    o32, o64 = m(f).double(), m64(f.double())
                    r32 = paper_transformer(f, weights(m, nt), s).double()
                    r64 = paper_transformer(f.double(), weights(m64, nt), s)
                for i, d in enumerate((o32 - r32, o32 - r64, r32 - r64, o64 - r64)):
                    w[i] = max(w[i], float(d.abs().max()))
                umax = max(umax, float(r64.abs().max()))
        print(f"{nt:>4} {w[0]:>11.2e} {w[1]:>11.2e} {w[2]:>12.2e} {w[3]:>11.2e}  {umax:.2f}")


if __name__ == "__main__":
    main()
