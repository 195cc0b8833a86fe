"""Probe double backward, torch.compile(fullgraph=True), torch.jit.trace and state_dict
(weights_only=True) support of each piece of opsplit, in float64 on CPU.

Each piece runs inside a small propagator.  double backward: ``gradgradcheck`` (fast mode)
with respect to the input, with torch's default attention backend (a refusal is printed
as the error; a wrong value as "wrong values").  compile: ``torch.compile(m, fullgraph=True,
backend="eager")`` called at batch 2 and batch 5, compared with eager (atol 1e-12);
trace: ``torch.jit.trace`` at batch 2, run on new data of that shape; state_dict: saved,
loaded with ``torch.load(weights_only=True)`` into a freshly built model, outputs equal.

    PYTHONPATH=. python scripts/support_matrix.py [names...]
"""
import io
import sys
import time
import warnings

import torch

from opsplit import Grid, ImageGrid, Interval, Propagator
from opsplit.models import ContinuousTransformer, PaperTransformer, TorchDecoder, TorchEncoder
from opsplit.operators import (
    Activation,
    BatchNormMap,
    ConvAttention,
    Convolution2d,
    ConvTransfer,
    FeedForward,
    FFNIntegral,
    FieldDropout,
    PointwiseAffine,
    PreNorm,
    ProjectionS1,
    ProjectionS2,
    SlicedReLUAttention,
    SlicedReLUBumpAttention,
)
from opsplit.schemes import Hybrid, Lie, Parallel, Relaxation, Strang
from opsplit.solvers import (
    RK4,
    CatchUp,
    ExactMidpoint,
    Heun,
    ODESolve,
    ProjectedS1,
    SemiImplicit,
    Substep,
)

warnings.filterwarnings("ignore")
D = torch.float64
torch.manual_seed(0)
def W(): return torch.nn.Parameter(0.3 * torch.randn(4, 4, dtype=D))
def ffn(): return FFNIntegral(W(), torch.nn.Parameter(torch.randn(4, dtype=D)), bias_axis="y")
def P(ops, n=2): return Propagator(Lie(ops), n, grid=Grid(x=Interval(length=1.0), y=Interval(n=4, length=2.0)))
def ff(): return FeedForward.create(4, 6, dtype=D, activation="gelu")
IMG = ImageGrid.paper((2, 4), 4, n_prefix=1)  # a 2x4 token image and a class token: N_x = 9
def PI(ops, n=2): return Propagator(Lie(ops), n, grid=IMG)
def dw(stride=1):  # a depthwise 3x3 projection that keeps the class token, then batch norm
    c = ConvTransfer(torch.nn.Parameter(0.3 * torch.randn(4, 1, 3, 3, dtype=D)), stride=stride, padding=1,
                     groups="depthwise", prefix="keep")
    return [c, BatchNormMap(4, dtype=D)]
def conv_attention():
    Wh = [torch.nn.Parameter(0.5 * torch.randn(4, 2, 2, dtype=D)) for _ in range(3)]
    return ConvAttention(*Wh, torch.nn.Parameter(0.5 * torch.randn(2, 2, 4, dtype=D)),
                         q_proj=dw(), k_proj=dw(2), v_proj=dw(2))
CASES = {
 "ProjectionS1": lambda: P([ffn(), ProjectionS1(0.1, 1.5)]),
 "ProjectionS2": lambda: P([ffn(), ProjectionS2()]),
 "PointwiseAffine(S1)": lambda: P([ffn(), PointwiseAffine(torch.nn.Parameter(torch.ones(4, dtype=D)), None, projection=ProjectionS1(eps=1e-5))]),
 "FFNIntegral": lambda: P([ffn()]),
 "FeedForward": lambda: P([ff()]),
 "FieldDropout(eval)": lambda: P([FieldDropout(ffn(), 0.1)]).eval(),
 "PreNorm": lambda: P([PreNorm(ff(), ProjectionS1())]),
 "Relaxation": lambda: P([Relaxation([Substep((ffn(), ProjectionS2()), SemiImplicit())])]),
 "Activation": lambda: P([ffn(), Activation("gelu")]),
 "Strang": lambda: Propagator(Strang([ffn(), ProjectionS1()]), 2),
 "Parallel(batch=False)": lambda: Propagator(Parallel([ffn(), ffn()], batch=False), 2),
 "Parallel(batch='auto')": lambda: Propagator(Parallel([ffn(), ffn()]), 2),
 "Hybrid": lambda: Propagator(Hybrid([[ffn(), ffn()], [ProjectionS1()]]), 2),
 "Heun/RK4/ExactMidpoint": lambda: Propagator(Lie([Substep(ffn(), Heun()), Substep(ffn(), RK4()), Substep(ffn(), ExactMidpoint())]), 2),
 "ProjectedS1/CatchUp": lambda: Propagator(Lie([Substep(ffn(), ProjectedS1()), Substep(ProjectionS1(), CatchUp())]), 2),
 "ODESolve(rk4)": lambda: Propagator(Lie([Substep(ffn(), ODESolve("rk4", options={"step_size": 0.5}))]), 2),
 "PaperTransformer": lambda: PaperTransformer(4, n_x=3, J=2, n_steps=2, sigma1=0.5, dtype=D),
 "ContinuousTransformer": lambda: ContinuousTransformer(2, J=1, n_steps=2, dtype=D),
 "Convolution2d": lambda: PI([Convolution2d(torch.nn.Parameter(0.2 * torch.randn(4, 4, 3, 3, dtype=D)),
                                              torch.nn.Parameter(torch.randn(4, dtype=D)))]),
 "Convolution2d(depthwise)": lambda: PI([Convolution2d.create(4, 3, groups="depthwise", dtype=D)]),
 "ConvAttention(eval)": lambda: PI([conv_attention()]).eval(),
 "SlicedReLUAttention(causal)": lambda: P([SlicedReLUAttention.build(4, 2, causal=True, dtype=D)]),
 "SlicedReLUBumpAttention(causal)": lambda: P([SlicedReLUBumpAttention.build(4, 2, causal=True, dtype=D)]),
 "SlicedReLUAttention": lambda: P([SlicedReLUAttention.build(4, 2, dtype=D)]),
 "TorchEncoder": lambda: TorchEncoder(4, 2, 6, dropout=0.0, batch_first=True, num_layers=2, dtype=D).eval(),
 "TorchDecoder": lambda: TorchDecoder(4, 2, 6, dropout=0.0, batch_first=True, num_layers=2, dtype=D).eval(),
}


def short(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"


def inputs(name, b):
    x = (torch.randn(b, 9 if name.startswith("Conv") else 3, 4, dtype=D),)
    return x + (torch.randn(b, 2, 4, dtype=D),) if name == "TorchDecoder" else x


def probe(name):
    torch.manual_seed(1)
    m = CASES[name]()
    x, x2 = inputs(name, 2), inputs(name, 5)
    ref, ref2 = m(*x), m(*x2)
    row = [name]
    try:
        xg = tuple(a.clone().requires_grad_() for a in x)
        ok = torch.autograd.gradgradcheck(lambda *a: m(*a), xg, fast_mode=True, raise_exception=False)
        row.append("yes" if ok else "wrong values")
    except Exception as e:
        row.append("no: " + short(e))
    t = time.time()
    try:
        torch._dynamo.reset()
        c = torch.compile(m, fullgraph=True, backend="eager")
        ok = torch.allclose(c(*x), ref, atol=1e-12, rtol=0)
        ok2 = torch.allclose(c(*x2), ref2, atol=1e-12, rtol=0)
        row.append("yes" if ok and ok2 else f"wrong values ({ok}, {ok2})")
    except Exception as e:
        row.append("no: " + short(e))
    row.append(f"{time.time() - t:.0f}s")
    try:
        tr = torch.jit.trace(m, x, check_trace=False)
        x3 = inputs(name, 2)
        row.append("yes" if torch.allclose(tr(*x3), m(*x3), atol=1e-12, rtol=0) else "wrong values")
    except Exception as e:
        row.append("no: " + short(e))
    try:
        buf = io.BytesIO()
        torch.save(m.state_dict(), buf)
        buf.seek(0)
        torch.manual_seed(2)
        m2 = CASES[name]()
        m2.load_state_dict(torch.load(buf, weights_only=True))
        row.append("yes" if torch.equal(m2(*x), ref) else "wrong values")
    except Exception as e:
        row.append("no: " + short(e))
    return " | ".join(row)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        print(probe(name), flush=True)
