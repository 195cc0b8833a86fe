"""Training as an optimal-control problem (paper 002, eqs. 10 and 12): discretise, then
optimise the controls theta^n of the propagator with autograd.

    python examples/train_control.py

A teacher transformer (random controls) generates targets v_i = N_teacher(u_i); a student
with its own random controls minimises (1/B) sum_i |N_student(u_i) - v_i|^2 with Adam.
"""

import torch

from opsplit.models import PaperTransformer

torch.manual_seed(0)
kw = dict(n_y=8, n_x=6, J=2, n_steps=3, dtype=torch.float64)
teacher, student = PaperTransformer(**kw), PaperTransformer(**kw)
inputs = torch.randn(256, 6, 8, dtype=torch.float64)
with torch.no_grad():
    targets = teacher(inputs)

opt = torch.optim.Adam(student.parameters(), lr=2e-2)
for it in range(301):
    idx = torch.randint(0, 256, (32,))
    loss = (student(inputs[idx]) - targets[idx]).pow(2).mean()  # eq. (12)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 50 == 0:
        with torch.no_grad():
            full = (student(inputs) - targets).pow(2).mean()
        print(f"iteration {it:4d}   training objective (12) = {full.item():.4e}")
