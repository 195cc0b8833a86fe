"""A character-level GPT on text that ships with Python, trained as an optimal-control problem,
against a plain-torch nanoGPT-style peer on the same data, seeds and budget.

Data (``opsplit.data.load_text``): ``pydoc_data.topics`` split by document (seeded, 10 %
of the characters held out), windows of ``--context`` characters with next-character
targets; every run trains on the same ``--steps x --batch`` windows in the same order.

Models (the same size): the **peer** (``NanoGPT`` below: token embedding + learned
positions, pre-LN blocks with causal ``F.scaled_dot_product_attention``, GELU MLP 4x, final
LayerNorm, tied head; trained by a plain torch loop) and opsplit's continuous decoder
(``opsplit.models.DecoderLM``: the same map as a pre-norm splitting scheme with
piecewise-constant controls on [0, T], T = --layers), trained by ``opsplit.control.Trainer``
(objective: mean next-character cross-entropy).  Runs (``--runs``):

* ``softmax-lie``: softmax attention, Lie scheme, N_t = layers (dt = 1): the peer's discrete
  map, started from the peer's initial weights (a pure weight copy);
* ``softmax-strang``: the same controls split by Strang (attention over half steps);
* ``sliced-lie``, ``sliced-strang``: causal sliced ReLU attention (paper 004) in place of
  softmax attention (every other weight copied from the peer);
* ``softmax-lie-multi``: softmax, Lie, trained at several N_t (``TrainConfig.n_steps``,
  ``--multi``), every step at an N_t drawn by the trainer's seeded generator.

Every run uses AdamW, the same learning-rate schedule (linear warm-up, cosine decay), the
same gradient clipping and the same batches.  Reported per run: validation bits per
character (the whole held-out split, non-overlapping windows), training tokens/s (the
trainer's own step timer; the peer's loop likewise), generation tokens/s (one sequence,
``--gen`` new characters after a ``--prompt``, seeded sampling; with the key/value cache where
the model has one, and recomputing the sequence every step), and a generated sample.  Then
the **anytime** table: the one-N_t and the multi-N_t models evaluated at N_t = ``--anytime``
(bits/char, generation tokens/s), and the **paired step time** of the peer and
``softmax-lie`` (one training step each, same batch, interleaved A B A B, ``--pairs``
rounds, median of the per-round ratios).  Output: Markdown tables on stdout,
``<out>/results.json`` (runs of separate invocations with the same setup accumulate there;
``--report`` reprints every table from it), ``<out>/<run>/steps.csv``, and the figures ``--figures``
(``text_loss.png``: loss curves; ``text_anytime.png``: bits/char and generation speed
against N_t).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_text.py --figures docs/figures
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_text.py --runs sliced-strang --pairs 0 --figures docs/figures
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_text.py --paired-only --pairs 31   # re-time only
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_text.py --attribute --pairs 9   # where the step differs
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_text.py --gen-timing --gen-reps 5 --runs peer softmax-lie softmax-strang sliced-lie sliced-strang
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/train_text.py --steps 20 --runs peer softmax-lie  # quick look
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import time
from pathlib import Path

import _common
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import bits_per_char, load_text, text_windows
from opsplit.models import DecoderConfig, DecoderLM

RUNS = ("peer", "softmax-lie", "softmax-strang", "sliced-lie", "sliced-strang", "softmax-lie-multi")
#: the default table (sliced-strang, ~5x the peer's step, is run on its own: ``--runs sliced-strang``)
DEFAULT_RUNS = ("peer", "softmax-lie", "softmax-strang", "sliced-lie", "softmax-lie-multi")


# -- the peer: nanoGPT written by the book ------------------------------------------------------
class Block(nn.Module):
    """Pre-LN transformer block: x + proj(attn(ln1(x))), then x + mlp(ln2(x))."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, d_ff)
        self.out = nn.Linear(d_ff, d_model)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, N, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, N, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    """Token embedding + learned positions, ``n_layers`` pre-LN blocks, final LayerNorm,
    head tied to the token embedding; nanoGPT's initialisation (normal, std 0.02; the
    residual projections 0.02 / sqrt(2 n_layers); biases 0)."""

    def __init__(self, vocab_size: int, context: int, d_model: int, n_layers: int, n_heads: int, d_ff: int):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.tok.weight)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, *, temperature: float = 1.0, generator=None):
        """nanoGPT's loop: the whole (cropped) sequence every step, sample the last position."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.context:])[:, -1].float() / temperature
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


# -- opsplit's model ------------------------------------------------------------------------------
def opsplit_config(vocab_size: int, args, attention: str = "softmax", scheme: str = "lie") -> DecoderConfig:
    """The peer's architecture as a :class:`DecoderConfig` (GPT-2 layout, exact GELU)."""
    softmax = attention == "softmax"
    return DecoderConfig(vocab_size=vocab_size, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                         d_ff=4 * args.d_model, norm="layer", norm_eps=1e-5, norm_bias=True, mlp="plain",
                         activation="gelu", positions="learned", max_positions=args.context, qkv_bias=softmax,
                         out_bias=softmax, mlp_bias=True, tie_embeddings=True, attention=attention, scheme=scheme)


def piece(control, i: int):
    """The stored weights of control piece ``i``: a parameter of a ``LayerwiseConstant``, a row
    of a ``PiecewiseConstant``'s stacked tensor."""
    return control.pieces[i] if hasattr(control, "pieces") else control.raw[i]


@torch.no_grad()
def copy_peer_weights(peer: NanoGPT, model: DecoderLM) -> None:
    """The peer's parameters into ``model``: layer ``l`` of the peer is the control piece
    ``l`` (time interval [l, l+1)); the attention only when ``model``'s is softmax."""
    E = model.config.d_model
    H = model.config.n_heads
    model.embedding.weight.copy_(peer.tok.weight)
    model.positions.weight.copy_(peer.pos.weight)
    n1, n2 = (n[0] for n in model.norms)
    a, f = model.attention, model.ffn
    softmax = model.config.attention == "softmax"
    for i, b in enumerate(peer.blocks):
        pairs = [(n1.weight, b.ln1.weight), (n1.bias, b.ln1.bias), (n2.weight, b.ln2.weight), (n2.bias, b.ln2.bias),
                 (f.W1, b.fc.weight.t()), (f.b1, b.fc.bias), (f.W2, b.out.weight.t()), (f.b2, b.out.bias)]
        if softmax:
            for W, bias, cW, cb in zip(b.qkv.weight.split(E), b.qkv.bias.split(E), (a.WQ, a.WK, a.WV),
                                       (a.bQ, a.bK, a.bV)):
                pairs += [(cW, W.t().reshape(E, H, E // H)), (cb, bias.view(H, E // H))]
            pairs += [(a.WO, b.proj.weight.t().reshape(H, E // H, E)), (a.bO, b.proj.bias)]
        for control, value in pairs:
            piece(control, i).copy_(value)
    fn = model.final_norm[0]
    fn.weight.value.copy_(peer.ln_f.weight)
    fn.bias.value.copy_(peer.ln_f.bias)


def lm_loss(logits, targets):
    """Mean next-character cross-entropy (nats) over every position of every window."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- training -------------------------------------------------------------------------------------
def train_config(args, train_n_steps=None) -> TrainConfig:
    return TrainConfig(epochs=1, batch_size=args.batch, eval_batch_size=args.eval_batch, optimizer="adamw",
                       lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.99), schedule="cosine",
                       warmup_steps=args.warmup, min_lr_ratio=args.min_lr_ratio, grad_clip=1.0, seed=args.seed,
                       shuffle=False, n_steps=train_n_steps, progress=False)


def lr_factor(step: int, total: int, c: TrainConfig) -> float:
    """The schedule of ``TrainConfig(schedule="cosine", warmup_steps=...)``, written out."""
    if c.warmup_steps and step < c.warmup_steps:
        return (step + 1) / c.warmup_steps
    p = min(1.0, max(0.0, (step - c.warmup_steps) / max(1, total - c.warmup_steps)))
    return c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def train_peer(peer: NanoGPT, train, c: TrainConfig, out: Path | None = None) -> list[dict]:
    """A plain loop: batches in order, AdamW, the same schedule and clipping as the trainer."""
    opt = torch.optim.AdamW(peer.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)
    n = len(train)
    total = -(-n // c.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, c))
    torch.manual_seed(c.seed)
    rows, elapsed = [], 0.0
    peer.train()
    for s in range(total):
        x, y = train[torch.arange(s * c.batch_size, min(n, (s + 1) * c.batch_size))]
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(peer(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(peer.parameters(), c.grad_clip)
        opt.step()
        sched.step()
        elapsed += time.perf_counter() - t
        rows.append({"step": s + 1, "loss": float(loss.detach()), "time": elapsed})
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with (out / "steps.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return rows


@torch.no_grad()
def peer_bpc(peer: NanoGPT, val, batch: int) -> float:
    peer.eval()
    tot = 0.0
    for a in range(0, len(val), batch):
        x, y = val[torch.arange(a, min(len(val), a + batch))]
        tot += float(lm_loss(peer(x), y)) * x.shape[0]
    return bits_per_char(tot / len(val))


def generation(fn, n_new: int) -> tuple[float, torch.Tensor]:
    """``(tokens/s, ids)`` of ``fn()`` generating ``n_new`` tokens."""
    t = time.perf_counter()
    ids = fn()
    return n_new / (time.perf_counter() - t), ids


def sample_opsplit(model: DecoderLM, prompt, args, *, n_steps=None, use_cache=True):
    g = torch.Generator().manual_seed(args.seed)
    model.eval()
    return generation(lambda: model.generate(prompt, args.gen, do_sample=True, temperature=args.temperature,
                                             generator=g, use_cache=use_cache, n_steps=n_steps), args.gen)


def sample_peer(peer: NanoGPT, prompt, args):
    g = torch.Generator().manual_seed(args.seed)
    peer.eval()
    return generation(lambda: peer.generate(prompt, args.gen, temperature=args.temperature, generator=g), args.gen)


def _minor_faults() -> int | None:
    """Minor page faults of this process so far (``None`` where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def paired_step_times(args, vocab: int, x, y, pairs: int) -> dict:
    """One training step (forward, loss, backward, AdamW) of the peer and of ``softmax-lie``
    from the same weights on the same batch, interleaved; one warm-up step each.  A third
    model, ``softmax-lie`` with its value checks off (``check_finite_input = False``: no
    finiteness test of the input, the parameters and the output), attributes part of the gap.
    Also the median time of each phase of the step (``phases_ms``: forward with the loss,
    backward, optimizer step) per model, the median ratio of the thread's CPU time
    (``cpu_ratio_median``: time the process was descheduled does not count) and the minor
    page faults per step (``faults_per_step``, median and mean per model: the pages the
    allocator handed back to the system and the step touched again, ~2 us each on the
    machine of docs/text.md — a cost of the allocator's state, not of the model)."""
    torch.manual_seed(args.seed)
    peer = NanoGPT(vocab, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
    model = DecoderLM(opsplit_config(vocab, args))
    copy_peer_weights(peer, model)
    unchecked = DecoderLM(opsplit_config(vocab, args))
    copy_peer_weights(peer, unchecked)
    unchecked.check_finite_input = False
    runs = {"peer": (peer, lambda o: o), "opsplit": (model, lambda o: o.logits),
            "opsplit_unchecked": (unchecked, lambda o: o.logits)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in runs.items()}

    phases = {k: {"forward": [], "backward": [], "optimizer": []} for k in runs}
    cpu = {k: [] for k in runs}
    faults = {k: [] for k in runs}

    def one(k):
        m, sel = runs[k]
        f0 = _minor_faults()
        c = time.thread_time()
        t = time.perf_counter()
        opts[k].zero_grad(set_to_none=True)
        loss = lm_loss(sel(m(x)), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opts[k].step()
        t3 = time.perf_counter()
        cpu[k].append(time.thread_time() - c)
        if f0 is not None:
            faults[k].append(_minor_faults() - f0)
        for name, v in (("forward", t1 - t), ("backward", t2 - t1), ("optimizer", t3 - t2)):
            phases[k][name].append(v)
        return t3 - t

    for k in runs:
        one(k)
    for k in runs:
        for v in (*phases[k].values(), cpu[k], faults[k]):
            v.clear()
    times = {k: [] for k in runs}
    for _ in range(pairs):
        for k in runs:
            times[k].append(one(k))
    ratios = [a / b for a, b in zip(times["opsplit"], times["peer"])]
    ratios_u = [a / b for a, b in zip(times["opsplit_unchecked"], times["peer"])]
    return {"peer_median_s": statistics.median(times["peer"]), "opsplit_median_s": statistics.median(times["opsplit"]),
            "unchecked_median_s": statistics.median(times["opsplit_unchecked"]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratio_unchecked_median": statistics.median(ratios_u), "pairs": pairs, "batch": list(x.shape),
            "cpu_ratio_median": statistics.median(a / b for a, b in zip(cpu["opsplit"], cpu["peer"])),
            # the medians of the step's phases (forward with the loss, backward, optimizer), ms
            "phases_ms": {k: {n: round(1e3 * statistics.median(v), 3) for n, v in ph.items()}
                          for k, ph in phases.items()},
            "faults_per_step": {k: {"median": statistics.median(v), "mean": round(statistics.mean(v))}
                                for k, v in faults.items() if v}}


def generation_speeds(args, vocab: int, prompt) -> dict:
    """Generation tokens/s of every architecture in ``--runs``, timed interleaved (one
    generation of each per round, ``--gen-reps`` rounds, medians): the peer's loop and
    ``DecoderLM.generate`` with and without the key/value cache.  The models start from
    the seeded initial weights (no training): a generation's cost does not depend on the
    weights' values (the same operations on the same shapes, ``--gen`` characters after the
    prompt every time), so the speeds are those of the trained models, measured under one
    load.  ``softmax-lie-multi`` is the architecture of ``softmax-lie``: not timed twice.  With
    ``softmax-lie`` in ``--runs``, also its KV-cache generation at every N_t of ``--anytime``
    (the anytime table's cost column; ``"cache@N_t"``)."""
    torch.manual_seed(args.seed)
    peer = NanoGPT(vocab, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
    timed = {}
    for run in dict.fromkeys(r for r in args.runs if r != "softmax-lie-multi"):
        if run == "peer":
            timed[run] = [("recompute", lambda: sample_peer(peer, prompt, args)[0])]
            continue
        attention = "sliced_relu" if run.startswith("sliced") else "softmax"
        model = DecoderLM(opsplit_config(vocab, args, attention, "strang" if "strang" in run else "lie"))
        copy_peer_weights(peer, model)
        timed[run] = ([("cache", lambda m=model: sample_opsplit(m, prompt, args)[0])] if attention == "softmax"
                      else []) + [("recompute", lambda m=model: sample_opsplit(m, prompt, args, use_cache=False)[0])]
        if run == "softmax-lie":
            timed[run] += [(f"cache@{n}", lambda m=model, n=n: sample_opsplit(m, prompt, args, n_steps=n)[0])
                           for n in args.anytime]
    speeds = {run: {k: [] for k, _ in fns} for run, fns in timed.items()}
    for fns in timed.values():  # warm-up
        for _, fn in fns:
            fn()
    for _ in range(args.gen_reps):
        for run, fns in timed.items():
            for k, fn in fns:
                speeds[run][k].append(fn())
    return {run: {k: statistics.median(v) for k, v in sp.items()} for run, sp in speeds.items()}


def attribute_step(args, vocab: int, x, y, rounds: int) -> dict:
    """Where the step of ``softmax-lie`` differs from the peer's, by counts that do not depend
    on the machine's load, and per-op CPU time inside the whole step (same weights, same batch):

    * ``saved``: what autograd saves for the backward (``saved_tensors_hooks``): distinct
      non-parameter storages and their MiB;
    * ``alloc``: the allocations of one step (forward, backward, AdamW) under
      ``torch.profiler(profile_memory=True)``: count, MiB allocated, peak live MiB above the
      start, allocations of 1 MiB or more;
    * ``ops``: every ATen call of forward + backward timed by the thread's CPU time
      (a ``TorchDispatchMode``, ``rounds`` rounds interleaved, medians), grouped by op — GEMMs
      by operand shapes, ``T`` marking an operand stored transposed; ``op_ms``: their total;
      with the minor page faults each op took (``resource``; the first touch of memory the
      allocator had handed back to the system).
    Python time between the ops (the propagator, the scheme, autograd's engine) is not in
    ``op_ms``: the ``--batch 1 --context 8`` paired timing measures it.  ``fault_us``: what
    one minor page fault costs on this machine (the first write to each page of a fresh
    64 MiB mapping, median of 3)."""
    from collections import Counter, defaultdict

    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(args.seed)
    peer = NanoGPT(vocab, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
    model = DecoderLM(opsplit_config(vocab, args))
    copy_peer_weights(peer, model)
    runs = {"peer": (peer, lambda o: o), "opsplit": (model, lambda o: o.logits)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in runs.items()}

    def step(k, mode=None):
        m, sel = runs[k]
        opts[k].zero_grad(set_to_none=True)
        if mode is None:
            lm_loss(sel(m(x)), y).backward()
        else:
            with mode:
                lm_loss(sel(m(x)), y).backward()
        opts[k].step()

    for k in runs:
        step(k)
        step(k)
    out = {k: {} for k in runs}
    for k, (m, sel) in runs.items():
        store = {}
        params = {q.untyped_storage().data_ptr() for q in m.parameters()}

        def pack(t, store=store, params=params):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                store[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lm_loss(sel(m(x)), y)
        out[k]["saved"] = {"storages": len(store), "MiB": round(sum(store.values()) / 2**20, 2)}
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step(k)
        mem = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                     key=lambda e: e.start_ns())
        live = peak = 0
        for e in mem:
            live += e.nbytes()
            peak = max(peak, live)
        sizes = [e.nbytes() for e in mem if e.nbytes() > 0]
        out[k]["alloc"] = {"count": len(sizes), "MiB": round(sum(sizes) / 2**20, 1),
                           "peak_MiB": round(peak / 2**20, 1), "count_1MiB": sum(b >= 2**20 for b in sizes)}

    class Timed(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ms, self.n, self.faults = defaultdict(float), Counter(), Counter()

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            f0 = _minor_faults() or 0
            c = time.thread_time()
            r = func(*a, **(kw or {}))
            dt = time.thread_time() - c
            df = (_minor_faults() or 0) - f0
            name = str(func).replace("aten.", "").replace(".default", "")
            if name in ("mm", "addmm"):
                name += " " + " ".join(f"{tuple(t.shape)}{'T' if t.stride(0) == 1 and t.shape[0] > 1 else ''}"
                                       for t in a if isinstance(t, Tensor) and t.dim() == 2)
            self.ms[name] += 1e3 * dt
            self.n[name] += 1
            self.faults[name] += df
            return r

    per = {k: [] for k in runs}
    for _ in range(rounds):
        for k in runs:
            mode = Timed()
            step(k, mode)
            per[k].append(mode)
    names = sorted(set().union(*(md.ms for v in per.values() for md in v)))
    out["fault_us"] = _fault_cost_us()
    for k in runs:
        out[k]["calls"] = sum(per[k][0].n.values())
        out[k]["op_ms"] = round(statistics.median(sum(md.ms.values()) for md in per[k]), 2)
        out[k]["faults"] = statistics.median(sum(md.faults.values()) for md in per[k])
    out["ops"] = {n: {k: (per[k][0].n.get(n, 0), round(statistics.median(md.ms.get(n, 0.0) for md in per[k]), 3),
                          statistics.median(md.faults.get(n, 0) for md in per[k])) for k in runs} for n in names}
    return out


def _fault_cost_us(mib: int = 64, reps: int = 3) -> float | None:
    """Microseconds per minor page fault: the first write to each page of a fresh mapping."""
    import mmap

    f0 = _minor_faults()
    if f0 is None:
        return None
    costs = []
    for _ in range(reps):
        m = mmap.mmap(-1, mib << 20)
        f0, t = _minor_faults(), time.perf_counter()
        for i in range(0, mib << 20, mmap.PAGESIZE):
            m[i] = 1
        dt, n = time.perf_counter() - t, _minor_faults() - f0
        m.close()
        if n:
            costs.append(1e6 * dt / n)
    return round(statistics.median(costs), 2) if costs else None


def print_attribution(a: dict) -> None:
    print("| | peer | opsplit softmax-lie |")
    print("|---|---|---|")
    p, o = a["peer"], a["opsplit"]
    print(f"| saved for backward: storages, MiB | {p['saved']['storages']}, {p['saved']['MiB']} | "
          f"{o['saved']['storages']}, {o['saved']['MiB']} |")
    for key, label in (("count", "allocations per step"), ("MiB", "MiB allocated per step"),
                       ("peak_MiB", "peak live MiB above the start"), ("count_1MiB", "allocations >= 1 MiB")):
        print(f"| {label} | {p['alloc'][key]} | {o['alloc'][key]} |")
    print(f"| ATen calls, forward + backward | {p['calls']} | {o['calls']} |")
    print(f"| their CPU time, ms (median) | {p['op_ms']} | {o['op_ms']} |")
    print(f"| their minor page faults (median) | {p['faults']:.0f} | {o['faults']:.0f} |")
    print(f"\none minor page fault: {a['fault_us']} us")
    print()
    print("| op (forward + backward) | peer: calls, ms, faults | opsplit: calls, ms, faults |")
    print("|---|---|---|")
    rows = sorted(a["ops"].items(), key=lambda kv: -max(v[1] for v in kv[1].values()))
    for name, v in rows:
        if max(t[1] for t in v.values()) >= 0.2:
            print(f"| {name} | " + " | ".join(f"{v[k][0]}, {v[k][1]:.2f}, {v[k][2]:.0f}" for k in ("peer", "opsplit"))
                  + " |")


# -- figures --------------------------------------------------------------------------------------
def _losses(out: Path, run: str) -> list[float] | None:
    f = out / run / "steps.csv"
    return [float(row["loss"]) / math.log(2) for row in csv.DictReader(f.open())] if f.is_file() else None


def plot_loss(out: Path, runs, path: Path, title: str) -> None:
    """Left: the peer and opsplit's ``softmax-lie`` (same weights, same batches), and below
    their difference; right: every run (10-step running mean)."""
    plt = _common.pyplot()
    fig = plt.figure(figsize=(10.4, 4.2))
    gs = fig.add_gridspec(3, 2)
    a1, a0, a2 = fig.add_subplot(gs[:2, 0]), fig.add_subplot(gs[2, 0]), fig.add_subplot(gs[:, 1])
    peer, ours = _losses(out, "peer"), _losses(out, "softmax-lie")
    if peer and ours:
        steps = range(1, len(peer) + 1)
        a1.plot(steps, peer, color="black", lw=2.6, alpha=0.4, label="peer (plain torch loop)")
        a1.plot(steps, ours, color="C1", lw=1.0, ls="--", label="opsplit softmax-lie (Trainer)")
        a1.set_ylabel("training loss (bits / char)")
        a1.set_title("the peer and opsplit from the same weights on the same batches", fontsize=9)
        a1.legend(fontsize=7)
        a1.tick_params(labelbottom=False)
        diff = [abs(a - b) for a, b in zip(peer, ours)]
        a0.semilogy([s for s, d in zip(steps, diff) if d > 0], [d for d in diff if d > 0], ".", ms=3, color="C2")
        a0.set_ylabel("|difference|", fontsize=8)
        a0.set_xlabel(f"training step ({sum(d == 0 for d in diff)} of {len(diff)} steps: difference 0)")
        a0.set_xlim(a1.get_xlim())
    k = 10
    for r in runs:
        loss = _losses(out, r)
        if loss is None:
            continue
        sm = [statistics.mean(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
        a2.plot(range(1, len(loss) + 1), sm, label=r, **({"color": "black", "lw": 2.2, "alpha": 0.4} if r == "peer" else {}))
    a2.set_xlabel("training step")
    a2.set_ylabel("training loss (bits / char, 10-step mean)")
    a2.set_title(title, fontsize=9)
    a2.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_anytime(anytime: dict, path: Path, title: str) -> None:
    plt = _common.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.4, 3.4))
    for name, rows in anytime.items():
        nts = [r["n_t"] for r in rows]
        a1.plot(nts, [r["bpc"] for r in rows], "o-", label=name)
        a2.plot(nts, [r["gen_tok_s"] for r in rows], "o-", label=name)
    nts = [r["n_t"] for r in next(iter(anytime.values()))]
    for ax, lab in ((a1, "validation bits / char"), (a2, "generation tokens / s (KV cache)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nts, [str(n) for n in nts])
        ax.set_xlabel("N_t at inference")
        ax.set_ylabel(lab)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -----------------------------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=list(DEFAULT_RUNS), choices=RUNS)
    p.add_argument("--corpus", default="pydoc_topics", choices=["pydoc_topics", "stdlib"])
    p.add_argument("--layers", type=int, default=4, help="layers of the peer = control pieces = T = N_t")
    p.add_argument("--multi", type=int, nargs="+", default=[2, 4, 8], help="train_n_steps of softmax-lie-multi")
    p.add_argument("--seed", type=int, default=0, help="initial weights, training windows, trainer, sampling")
    p.add_argument("--split-seed", type=int, default=0, help="the train/validation split by document")
    p.add_argument("--eval-windows", type=int, default=None, help="cap on validation windows (default: all)")
    p.add_argument("--gen", type=int, default=200, help="characters generated after the prompt")
    _common.options(p, context=256, d_model=128, heads=4, steps=150, batch=16, lr=3e-3, weight_decay=0.0,
                    warmup=15, min_lr_ratio=0.1, anytime=[1, 2, 4, 8, 16], eval_batch=64, prompt="The ",
                    temperature=0.8)
    p.add_argument("--gen-reps", type=int, default=3, help="timed generations per model and N_t (median)")
    p.add_argument("--pairs", type=int, default=15, help="interleaved rounds of the paired step timing (0: none)")
    p.add_argument("--out", default=str(_common.OUT / "train_text"))
    p.add_argument("--figures", default=None, help="write text_loss.png and text_anytime.png here")
    _common.switches(
        p, paired_only="no training: the paired step timing only (stored in <out>/results.json)",
        attribute="no training: saved-tensor bytes, allocations and per-op CPU time of the peer's step and "
                  "softmax-lie's (--pairs rounds)",
        gen_timing="no training: generation tokens/s of every --runs architecture, interleaved (stored in "
                   "<out>/results.json)",
        report="no training: print the tables and draw the figures from <out>/results.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.report:
        saved = _load(out)
        if saved is None:
            p.error(f"--report: no {out / 'results.json'}")
        report(saved, args)
        return saved
    out.mkdir(parents=True, exist_ok=True)
    load0 = _loads()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY')}, loadavg {load0}", flush=True)

    corpus = load_text(args.corpus, seed=args.split_seed)
    vocab = corpus.vocab
    train = text_windows(corpus.train, args.context, args.steps * args.batch, seed=args.seed, name="train")
    val = text_windows(corpus.val, args.context, name="val")
    if args.eval_windows is not None:
        val = type(val)(val.inputs[: args.eval_windows], val.targets[: args.eval_windows], name="val")
    if args.attribute:
        x, y = train[torch.arange(args.batch)]
        a = attribute_step(args, vocab.size, x, y, max(1, args.pairs))
        a["loadavg"] = [load0, _loads()]
        print(json.dumps({"attribute": a}), flush=True)
        print_attribution(a)
        return a
    if args.paired_only:
        x, y = train[torch.arange(args.batch)]
        paired = paired_step_times(args, vocab.size, x, y, args.pairs)
        paired["loadavg"] = [load0, _loads()]
        print(json.dumps({"paired": paired}), flush=True)
        _store(out, args, "paired", paired)
        return paired
    prompt = vocab.encode(args.prompt, name="--prompt")[None]
    if prompt.shape[1] + args.gen > args.context:
        p.error(f"--gen: the prompt ({prompt.shape[1]}) and --gen ({args.gen}) exceed --context {args.context}")
    if args.gen_timing:
        speeds = {"tok_s": generation_speeds(args, vocab.size, prompt), "reps": args.gen_reps,
                  "loadavg": [load0, _loads()]}
        print(json.dumps({"gen_timing": speeds}), flush=True)
        _store(out, args, "gen_timing", speeds)
        return speeds
    print(f"{corpus}; {len(train)} training windows ({args.steps} steps x {args.batch}), {len(val)} validation "
          f"windows of {args.context}", flush=True)

    torch.manual_seed(args.seed)
    peer0 = NanoGPT(vocab.size, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
    init = {k: v.clone() for k, v in peer0.state_dict().items()}
    results, models = {}, {}
    tokens = args.steps * args.batch * args.context
    for run in args.runs:
        t0 = time.perf_counter()
        if run == "peer":
            peer = NanoGPT(vocab.size, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
            peer.load_state_dict(init)
            rows = train_peer(peer, train, train_config(args), out / run)
            bpc = peer_bpc(peer, val, args.eval_batch)
            gen_cache = None
            gen_full, ids = sample_peer(peer, prompt, args)
            models[run] = peer
            n_par = sum(q.numel() for q in peer.parameters())
            unknown = None
        else:
            attention = "sliced_relu" if run.startswith("sliced") else "softmax"
            scheme = "strang" if "strang" in run else "lie"
            model = DecoderLM(opsplit_config(vocab.size, args, attention, scheme),
                              generator=torch.Generator().manual_seed(args.seed))
            src = NanoGPT(vocab.size, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
            src.load_state_dict(init)
            copy_peer_weights(src, model)
            norms0 = _row_norms(model)
            multi = tuple(args.multi) if run.endswith("multi") else None
            tr = Trainer(model, Objective(lm_loss, output="logits"), train_config(args, multi))
            tr.fit(train, None, out_dir=out / run, plot=False)
            rows = tr.history.steps
            bpc = bits_per_char(tr.evaluate(val)["loss"])
            gen_cache = None
            if attention == "softmax":
                gen_cache, ids = sample_opsplit(model, prompt, args)
            gen_full, ids_full = sample_opsplit(model, prompt, args, use_cache=False)
            if attention != "softmax":
                ids = ids_full
            models[run] = (model, tr)
            n_par = sum(q.numel() for q in model.parameters())
            unknown = {"initial": norms0, "trained": _row_norms(model)}
        train_s = rows[-1]["time"]
        results[run] = {"run": run, "params": n_par, "val_bpc": bpc, "train_tok_s": tokens / train_s,
                        "train_s": train_s, "final_train_bpc": bits_per_char(statistics.mean(r["loss"] for r in rows[-10:])),
                        "gen_tok_s_cache": gen_cache, "gen_tok_s_recompute": gen_full,
                        "sample": vocab.decode(ids[0]), "wall_s": time.perf_counter() - t0,
                        "embedding_row_norms": unknown,
                        "loadavg": _loads()}
        print(json.dumps({k: v for k, v in results[run].items() if k != "sample"}), flush=True)

    anytime = {}
    pair = [r for r in ("softmax-lie", "softmax-lie-multi") if r in models]
    for run in pair:
        label = f"{run} (trained at N_t = {args.layers})" if run == "softmax-lie" else \
            f"{run} (trained at N_t in {tuple(args.multi)})"
        anytime[run] = {"label": label, "rows": []}
    for n in args.anytime:
        speeds = {run: [] for run in pair}
        for _ in range(args.gen_reps):  # the models' generations interleaved, median of the repeats
            for run in pair:
                speeds[run].append(sample_opsplit(models[run][0], prompt, args, n_steps=n)[0])
        for run in pair:
            bpc = bits_per_char(models[run][1].evaluate(val, n_steps=n)["loss"])
            anytime[run]["rows"].append({"n_t": n, "bpc": bpc, "gen_tok_s": statistics.median(speeds[run])})
            print(json.dumps({"anytime": run, **anytime[run]["rows"][-1]}), flush=True)
    anytime = {a["label"]: a["rows"] for a in anytime.values()}

    paired = None
    if args.pairs:
        x, y = train[torch.arange(args.batch)]
        paired = paired_step_times(args, vocab.size, x, y, args.pairs)
        paired["loadavg"] = [load0, _loads()]
        print(json.dumps({"paired": paired}), flush=True)

    load1 = _loads()
    info = {"corpus": str(corpus), "train_chars": corpus.train.numel(), "val_chars": corpus.val.numel(),
            "vocab": vocab.size, "tokens_per_run": tokens, "loadavg": [load0, load1]}
    saved = _load(out)
    if saved and saved.get("setup") != _setup(args):
        print(f"{out / 'results.json'} holds runs of another setup: replaced", flush=True)
        saved = {}
    saved = saved or {"setup": _setup(args), "runs": {}, "anytime": {}, "paired": None, "info": {}}
    saved["runs"].update(results)
    saved["anytime"].update(anytime)
    saved["paired"] = paired or saved.get("paired")
    saved["info"][" ".join(args.runs)] = info
    (out / "results.json").write_text(json.dumps(saved, indent=1))
    report(saved, args)
    return results


def _row_norms(model: DecoderLM) -> dict:
    """The 2-norm of the unknown id's embedding row (id 0: no training character maps to it,
    so it is never an input; the tied read-out trains it as an output row) and the median
    norm of the other rows."""
    w = model.embedding.weight.detach().norm(dim=1)
    return {"unknown": float(w[0]), "median_other": float(w[1:].median())}


def _setup(args) -> dict:
    """What must agree for runs of separate invocations to share one table."""
    keys = ("corpus", "context", "d_model", "heads", "layers", "steps", "batch", "lr", "weight_decay", "warmup",
            "min_lr_ratio", "multi", "seed", "split_seed", "eval_windows", "prompt", "gen", "temperature")
    return {k: getattr(args, k) for k in keys}


def _load(out: Path) -> dict | None:
    f = out / "results.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _store(out: Path, args, key: str, value) -> None:
    """``value`` as ``key`` of ``<out>/results.json`` when that holds runs of this setup, and
    the tables reprinted."""
    saved = _load(out)
    if saved is not None and saved.get("setup") == _setup(args):
        saved[key] = value
        (out / "results.json").write_text(json.dumps(saved, indent=1))
        report(saved, args)


def _loads() -> list[str] | None:
    """The 1-, 5- and 15-minute load averages as /proc/loadavg writes them (None elsewhere)."""
    f = Path("/proc/loadavg")
    return f.read_text().split()[:3] if f.is_file() else None


def report(saved: dict, args) -> None:
    """The Markdown tables, the samples and the figures of every run in ``results.json``."""
    st = saved["setup"]
    runs = [saved["runs"][r] for r in RUNS if r in saved["runs"]]
    print()
    for key, info in saved["info"].items():
        print(f"[{key}] {info['corpus']}; {info['tokens_per_run']} training tokens per run; loadavg "
              f"{info['loadavg'][0]} -> {info['loadavg'][1]}")
    print(f"context {st['context']}, d_model {st['d_model']}, {st['heads']} heads, {st['layers']} layers' controls; "
          f"{st['steps']} steps x {st['batch']} windows, AdamW lr {st['lr']} (warm-up {st['warmup']}, cosine to "
          f"{st['min_lr_ratio']} x), seed {st['seed']}; total training time "
          f"{sum(r['train_s'] for r in runs):.0f} s")
    print()
    print("| run | params | val bits/char | final train bits/char | train tokens/s | gen tokens/s (KV cache) | "
          "gen tokens/s (recompute) | training s |")
    print("|---|---|---|---|---|---|---|---|")

    def f(v, fmt):
        return "—" if v is None else format(v, fmt)

    for r in runs:
        print(f"| {r['run']} | {r['params']} | {r['val_bpc']:.3f} | {r['final_train_bpc']:.3f} | "
              f"{r['train_tok_s']:.0f} | {f(r['gen_tok_s_cache'], '.0f')} | {f(r['gen_tok_s_recompute'], '.0f')} | "
              f"{r['train_s']:.0f} |")
    anytime = saved["anytime"]
    if anytime:
        nts = [row["n_t"] for row in next(iter(anytime.values()))]
        print()
        print("| model | " + " | ".join(f"N_t = {n}" for n in nts) + " |")
        print("|---|" + "---|" * len(nts))
        for label, rows in anytime.items():
            print(f"| {label}: bits/char | " + " | ".join(f"{r['bpc']:.3f}" for r in rows) + " |")
        for label, rows in anytime.items():
            print(f"| {label}: gen tokens/s | " + " | ".join(f"{r['gen_tok_s']:.0f}" for r in rows) + " |")
    gt = saved.get("gen_timing")
    if gt:
        print()
        print(f"generation tokens/s, every architecture interleaved ({gt['reps']} rounds, medians; loadavg "
              f"{gt['loadavg'][0]} -> {gt['loadavg'][1]}):")
        print()
        print("| run | gen tokens/s (KV cache) | gen tokens/s (recompute) |")
        print("|---|---|---|")
        for run, v in gt["tok_s"].items():
            print(f"| {run} | {f(v.get('cache'), '.0f')} | {f(v.get('recompute'), '.0f')} |")
        at = {k.split("@")[1]: v for k, v in gt["tok_s"].get("softmax-lie", {}).items() if "@" in k}
        if at:
            print()
            print("| softmax-lie (either model): gen tokens/s (KV cache) | " + " | ".join(f"N_t = {n}" for n in at)
                  + " |")
            print("|---|" + "---|" * len(at))
            print("| | " + " | ".join(f"{v:.0f}" for v in at.values()) + " |")
    paired = saved.get("paired")
    if paired:
        print()
        print(f"paired step time (batch {paired['batch'][0]} x {paired['batch'][1]}, {paired['pairs']} rounds): peer "
              f"{paired['peer_median_s'] * 1e3:.0f} ms, opsplit softmax-lie {paired['opsplit_median_s'] * 1e3:.0f} ms, "
              f"median ratio {paired['ratio_median']:.3f} (min {paired['ratio_min']:.3f}, max {paired['ratio_max']:.3f}); "
              f"value checks off: {paired['unchecked_median_s'] * 1e3:.0f} ms, median ratio "
              f"{paired['ratio_unchecked_median']:.3f}; loadavg {paired.get('loadavg')}")
        if "faults_per_step" in paired:
            print("minor page faults per step (median / mean): " + ", ".join(
                f"{k} {v['median']:.0f} / {v['mean']}" for k, v in paired["faults_per_step"].items()))
    print()
    for r in runs:
        print(f"--- {r['run']} (seed {st['seed']}, temperature {st['temperature']}) ---")
        print(r["sample"])
        print()
    if args.figures:
        fig = Path(args.figures)
        title = f"pydoc topics, context {st['context']}, d_model {st['d_model']}, {st['steps']} steps x {st['batch']}"
        plot_loss(Path(args.out), [r["run"] for r in runs], fig / "text_loss.png", title)
        if anytime:
            plot_anytime(anytime, fig / "text_anytime.png", title)


if __name__ == "__main__":
    main()
