"""The character-level GPT of benchmarks/train_text.py trained to be a continuous-time model:
the training tools of benchmarks/continuity.py on text, measured on validation text that
shares no 40-character substring with the training text (``opsplit.data.dedup``), beside
n-gram baselines fitted on the training split (benchmarks/ngram.py).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/continuity_text.py --variants one kin --steps 2000
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/continuity_text.py --ngram      # the baselines only
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/continuity_text.py --report

Every run writes ``<out>/<variant>_<steps>.json`` (settings, training time, validation
bits/char on the deduplicated and on the whole validation split, the continuity table) and
the trained weights (``.pt``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import _common
import torch
import train_text as tt
from continuity import paired_steps
from ngram import best_baseline, dev_selected

from opsplit.control import Objective, TrainConfig, Trainer, continuity
from opsplit.control.swap import as_solver, field_substeps
from opsplit.data import bits_per_char, load_text, text_windows
from opsplit.data.dedup import deduplicate, shared_substrings
from opsplit.models import DecoderLM, convert_time_controls
from opsplit.schemes import Scheme

VARIANTS = {
    "one": {},
    "kin0.1": {"kinetic": 0.1},
    "kin0.3": {"kinetic": 0.3},
    "kin1": {"kinetic": 1.0},
    "mc248": {"train_n_steps": (2, 4, 8), "weights": "cost"},
    "mc216": {"train_n_steps": (2, 4, 8, 16), "weights": "cost"},
    "mc248_kin0.1": {"train_n_steps": (2, 4, 8), "weights": "cost", "kinetic": 0.1},
    "mc216_kin0.1": {"train_n_steps": (2, 4, 8, 16), "weights": "cost", "kinetic": 0.1},
    "kin0.03": {"kinetic": 0.03},
    "mc248_heun_kin0.1": {"train_n_steps": (2, 4, 8), "weights": "cost", "solvers": ("euler", "heun"),
                          "solver_weights": "cost", "kinetic": 0.1},
    "heun_kin0.1": {"solvers": ("euler", "heun"), "solver_weights": "cost", "kinetic": 0.1},
    # the text recipe: Heun drawn for a quarter of the steps (1.25 field evaluations per substep on average)
    "cont": {"solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0), "kinetic": 0.1},
    # controls smooth in t (Sander et al. 2022): the layer weights' L2 projection onto the
    # first 4 Legendre polynomials of t (as many coefficients as layers), then trained
    "leg": {"control": "legendre"},
    "leg_cont": {"control": "legendre", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0), "kinetic": 0.1},
    "leg_kin0.1": {"control": "legendre", "kinetic": 0.1},
    # smooth controls solved with Heun substeps at N_t = 2: as many field evaluations as
    # explicit Euler at N_t = 4 (the training grid is Heun at N_t = 2)
    "leg_heun2": {"control": "legendre", "own_solver": "heun", "reference": 2},
    "leg_heun2_kin0.1": {"control": "legendre", "own_solver": "heun", "reference": 2, "kinetic": 0.1},
    # the parallel (unsplit) scheme: u <- u + dt (A(u) + F(u)), one Euler step of the whole
    # field, so no splitting error between the training grid and the flow
    "par": {"scheme": "parallel"},
    "par_heun": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0)},
    "par_cont": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0), "kinetic": 0.1},
    "par_kin0.1": {"scheme": "parallel", "kinetic": 0.1},
    "par_cont8": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (7.0, 1.0), "kinetic": 0.1},
    # the steps' embedded local error estimate (flow_costs.FlowRecorder.defect) in the place of
    # the kinetic energy: with the parallel scheme, exactly explicit Euler's local error
    "par_def1": {"scheme": "parallel", "defect": 1.0},
    "par_heun_def1": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0), "defect": 1.0},
    # Heun for a quarter of the steps with a weaker kinetic energy
    "par_cont_k0.01": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0), "kinetic": 0.01},
    "par_cont_k0.03": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0), "kinetic": 0.03},
    # Heun for an eighth of the steps with a weak kinetic energy (about 1.2x the field evaluations)
    "par_cont8_k0.01": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (7.0, 1.0), "kinetic": 0.01},
    "par_cont8_k0.005": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (7.0, 1.0),
                         "kinetic": 0.005},
    # the kinetic energy's weight annealed from 0.1 to 0 over the run (cosine), Heun for a
    # quarter of the steps throughout
    "par_cont_anneal": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0),
                        "kinetic": 0.1, "anneal": True},
    # RK4 drawn for a few steps: the objective then holds a solve close to the flow itself
    # (RK4 at the training grid), beside the training grid's explicit Euler
    "par_rk4_8": {"scheme": "parallel", "solvers": ("euler", "rk4"), "solver_weights": (7.0, 1.0)},
    "par_rk4_16": {"scheme": "parallel", "solvers": ("euler", "rk4"), "solver_weights": (15.0, 1.0)},
    # Heun on a part of every batch instead of on a part of the steps, its loss weighted
    # apart from its share of the work: (fraction of the windows, weight of their loss), the
    # library's TrainConfig.solvers_split with solvers_split_weights (config())
    "par_split8_w0.5_k0.01": {"scheme": "parallel", "split": (0.125, 0.5), "kinetic": 0.01},
    "par_split8_w0.5": {"scheme": "parallel", "split": (0.125, 0.5)},
    # the weight equal to the share: Heun for a quarter of the steps in expectation, but
    # every step's gradient holds both solves (no draws)
    "par_split4_w0.25_k0.01": {"scheme": "parallel", "split": (0.25, 0.25), "kinetic": 0.01},
    "par_split4_w0.25": {"scheme": "parallel", "split": (0.25, 0.25)},
    # the same objective written as the library's split (TrainConfig.solvers_split: the
    # shares of the draw's weights, here 3 : 1, as parts of every batch, the Heun windows last)
    "par_split_k0.01": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0),
                        "solvers_split": True, "kinetic": 0.01},
    # the same weight on an eighth of the batch (the cost of Heun for an eighth of the steps)
    "par_split8_w0.25_k0.01": {"scheme": "parallel", "split": (0.125, 0.25), "kinetic": 0.01},
    "par_split8_w0.35_k0.01": {"scheme": "parallel", "split": (0.125, 0.35), "kinetic": 0.01},
    # a quarter of every batch with Heun, weighted 0.3 (the work of the quarter split, a stronger pull to the flow)
    "par_split4_w0.3_k0.01": {"scheme": "parallel", "split": (0.25, 0.3), "kinetic": 0.01},
    # the same through the library (TrainConfig.solvers_split_weights: Euler 0.7, Heun 0.3)
    "par_splitw0.3_k0.01": {"scheme": "parallel", "solvers": ("euler", "heun"), "solver_weights": (3.0, 1.0),
                            "solvers_split": True, "split_weights": (0.7, 0.3), "kinetic": 0.01},
    # each piece of [0, layers] solved with Heun with probability 1/4, drawn per step (the
    # same expected work as Heun for a quarter of the steps; every call on the whole batch)
    "par_pmix4_k0.01": {"scheme": "parallel", "piece_heun": 0.25, "kinetic": 0.01},
}


def data(args):
    corpus = load_text(args.corpus, seed=args.split_seed, val_fraction=args.val_fraction)
    tr = corpus.vocab.decode(corpus.train)
    va = corpus.vocab.decode(corpus.val)
    dd, info = deduplicate(va, tr, k=40, unit="paragraph")
    assert shared_substrings(dd, tr, 40) == 0
    val_dedup = corpus.vocab.encode(dd, errors="replace")
    return corpus, tr, va, dd, val_dedup, info


def config(args, v) -> TrainConfig:
    """The run's config; a variant's ``split = (fraction, weight)``: Heun on that fraction of
    every batch, its part weighted ``weight`` in the objective (``TrainConfig.solvers_split``
    with shares ``1 - fraction``, ``fraction`` and weights ``1 - weight``, ``weight``)."""
    if v.get("split"):
        f, w = v["split"]
        v = {**v, "solvers": ("euler", "heun"), "solver_weights": (1 - f, f), "solvers_split": True,
             "split_weights": (1 - w, w)}
    tns = tuple(v["train_n_steps"]) if v.get("train_n_steps") else None
    sol = tuple(v["solvers"]) if v.get("solvers") else None
    return TrainConfig(solvers=sol, solvers_weights=v.get("solver_weights") if sol else None,
                       solvers_split=bool(sol and v.get("solvers_split")),
                       solvers_split_weights=v.get("split_weights"), epochs=1, batch_size=args.batch, eval_batch_size=args.eval_batch, optimizer="adamw", lr=args.lr,
                       weight_decay=args.weight_decay, betas=(0.9, 0.99), schedule="cosine",
                       warmup_steps=args.warmup, min_lr_ratio=args.min_lr_ratio, grad_clip=1.0, seed=args.seed,
                       shuffle=False, n_steps=tns, n_steps_weights=v.get("weights") if tns else None,
                       progress=False)


def build(args, vocab_size, control: str = "piecewise_constant", solver: str = "euler", n_steps: int | None = None,
          scheme: str = "lie"):
    """The model, nanoGPT's initial weights (``DecoderLM.reset_parameters(init="nanogpt")``);
    ``control``: the layer weights' kind in time (``convert_time_controls``: their L2
    projection onto it, as many modes as layers);
    ``solver``: the substep solver of its own (``"euler"``: GPT's layer); ``scheme``:
    ``"lie"`` (GPT's layer at dt = 1) or ``"parallel"`` (both terms from the same state)."""
    cfg = tt.opsplit_config(vocab_size, args, scheme=scheme)
    if args.dropout:  # the residual (field) and embedding dropout of nanoGPT's small configurations
        cfg = dataclasses.replace(cfg, residual_dropout=args.dropout, embedding_dropout=args.dropout)
    model = DecoderLM(cfg, generator=torch.Generator().manual_seed(args.seed))
    # the weights of train_text.NanoGPT built after torch.manual_seed(args.seed) (what this
    # script copied before; opsplit train's model.init = "nanogpt")
    model.reset_parameters(torch.Generator().manual_seed(args.seed), init="nanogpt")
    if solver != "euler":
        for sub in field_substeps(model.decoder.scheme):
            sub.solver = as_solver(solver, "own_solver")
    if n_steps is not None:  # the model's own N_t (its controls still live on [0, layers])
        model.decoder.n_steps = n_steps
    return convert_time_controls(model, control, n_steps=args.layers, n_modes=args.layers)


class AnnealedKinetic(Objective):
    """The objective with the kinetic energy's weight decaying to 0 over the run:
    ``kinetic * (1 + cos(pi p)) / 2`` at the fraction p of the optimizer steps taken (each
    training call of the objective is one step); 0 from p = 1 on."""

    def __init__(self, *a, total_steps: int, **k):
        super().__init__(*a, **k)
        self.kinetic0, self.total_steps, self.calls = self.kinetic, total_steps, 0

    def forward(self, model, inputs, targets, **k):
        if model.training:
            p = min(1.0, self.calls / self.total_steps)
            self.kinetic = self.kinetic0 * 0.5 * (1.0 + math.cos(math.pi * p))
            self.calls += 1
        return super().forward(model, inputs, targets, **k)


class _PieceMix(Scheme):
    """A scheme that takes the steps starting at the times in ``other_at`` with ``other``
    (the trained scheme solved with other substeps, :func:`~opsplit.control.solved_with`:
    RK4 for ``--pieces``, Heun for :class:`PieceSolverObjective`) and every other step with
    the trained scheme ``own``.  The steps are the pieces of [0, layers] (N_t = layers).
    Its substeps are ``own``'s (what the propagator reports and counts)."""

    def __init__(self, own, other, other_at):
        super().__init__(list(own.substeps))
        self.own, self.other, self.other_at = own, other, set(other_at)

    def check(self, g):
        self.own.check(g)
        self.other.check(g)

    def scheme_at(self, t):
        return self.other if round(float(t)) in self.other_at else self.own

    def step(self, t, dt, u, g):
        return self.scheme_at(t).step(t, dt, u, g)

    def advance(self, t, dt, u, g):
        return self.scheme_at(t).advance(t, dt, u, g)


class PieceSolverObjective(Objective):
    """The objective of a solve that takes each piece of [0, layers] with Heun substeps with
    probability ``p`` (drawn per optimizer step, the same for every window) and with the
    model's own explicit Euler otherwise: 1 + p field evaluations per piece in expectation,
    every call on the whole batch.  A model trained on its Euler solve fits its pieces to
    each other's Euler errors (``--pieces``); mixing the pieces' solvers at random denies
    the fit a fixed neighbour.  At evaluation the model's own solve."""

    def __init__(self, *a, p: float, seed: int, **k):
        super().__init__(*a, **k)
        if not 0.0 < p < 1.0:
            raise ValueError(f"piece_heun: expected a probability in (0, 1), got {p!r}")
        self.p, self.gen = float(p), torch.Generator().manual_seed(seed)

    def forward(self, model, inputs, targets, **k):
        if not model.training:
            return super().forward(model, inputs, targets, **k)
        from opsplit.control import solved_with

        prop = model.decoder
        own = prop.scheme
        n = round(prop.t1 - prop.t0)
        heun_at = {i for i in range(n) if float(torch.rand((), generator=self.gen)) < self.p}
        if not heun_at:
            return super().forward(model, inputs, targets, **k)
        with solved_with(model, solver="heun"):
            heun = prop.scheme
            prop.scheme = _PieceMix(own, heun, heun_at)
            try:
                return super().forward(model, inputs, targets, **k)
            finally:
                prop.scheme = heun


def variant(args, vocab_size, v: dict):
    """The model (:func:`build`) and the training objective (the running costs) of a variant."""
    model = build(args, vocab_size, v.get("control", "piecewise_constant"), v.get("own_solver", "euler"),
                  v.get("reference"), v.get("scheme", "lie"))
    k = dict(output="logits", kinetic=v.get("kinetic", 0.0), acceleration=v.get("acceleration", 0.0),
             defect=v.get("defect", 0.0))
    if v.get("piece_heun"):
        obj = PieceSolverObjective(tt.lm_loss, p=v["piece_heun"], seed=args.seed, **k)
    else:
        obj = (AnnealedKinetic(tt.lm_loss, total_steps=args.steps, **k) if v.get("anneal") else
               Objective(tt.lm_loss, **k))
    return model, obj


def run_one(name, args, corpus, val_dedup):
    v = VARIANTS[name]
    train = text_windows(corpus.train, args.context, args.steps * args.batch, seed=args.seed, name="train")
    val_d = text_windows(val_dedup, args.context, name="val_dedup")
    val_full = text_windows(corpus.val, args.context, name="val")
    model, obj = variant(args, corpus.vocab.size, v)
    if args.init:  # continue from trained weights (a continuity phase after a one-N_t run)
        model.load_state_dict(torch.load(args.init, weights_only=True))
    tr = Trainer(model, obj, config(args, v))
    load0 = os.getloadavg()[0]
    tr.fit(train, None)
    res = {"variant": name, "corpus": corpus_info(corpus), "overrides": {k: list(x) if isinstance(x, tuple) else x for k, x in v.items()},
           "init": args.init, "steps": args.steps, "batch": args.batch, "context": args.context, "dropout": args.dropout,
           "train_s": tr.elapsed,
           "load": [load0, os.getloadavg()[0]],
           "final_train_bpc": bits_per_char(statistics.fmean(r["data"] for r in tr.history.steps[-50:]))}
    res["val_dedup_bpc"] = bits_per_char(tr.evaluate(val_d)["loss"])
    res["val_bpc"] = bits_per_char(tr.evaluate(val_full)["loss"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_{args.steps}" + (f"_d{args.dropout:g}" if args.dropout else "") + ("_from_" + Path(args.init).stem
                                                                                      if args.init else "")
    if args.corpus != "pydoc_topics":
        stem += f"_{args.corpus}"
    torch.save(model.state_dict(), out / f"{stem}.pt")
    print(json.dumps(res), flush=True)
    t = time.perf_counter()
    ref = v.get("reference", args.layers)  # the training grid's N_t
    scale = ref / args.layers
    c = continuity(model, val_d, loss=tt.lm_loss, output="logits", metric="bits", reference=ref,
                   n_steps=[max(1, round(n * scale)) for n in args.eval_n], solvers=("trained", "rk4"),
                   levels=[max(1, round(n * scale)) for n in args.levels], batch_size=args.eval_batch)
    res["continuity"] = c.to_dict()
    res["continuity"]["markdown"] = c.markdown()
    res["continuity"]["seconds"] = time.perf_counter() - t
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    return res


def pieces(args, corpus, val_dedup) -> list[dict]:
    """Where the RK4 gap of trained weights (``--init``, the first variant's model) lives:
    bits/char on the deduplicated validation text with RK4 on one piece of [0, layers] and
    the training grid's explicit Euler (N_t = layers) on the others, and with RK4 on all
    but one piece, as differences to the training grid."""
    from opsplit.control import solved_with

    if not args.init:
        raise SystemExit("--pieces: give the trained weights with --init")
    v = VARIANTS[args.variants[0]]
    model, obj = variant(args, corpus.vocab.size, v)
    model.load_state_dict(torch.load(args.init, weights_only=True))
    evaluator = Trainer(model, obj, config(args, v))
    val = text_windows(val_dedup, args.context, name="val_dedup")
    prop, own = model.decoder, model.decoder.scheme

    def bits(rk4, at):
        prop.scheme = _PieceMix(own, rk4, at)
        try:
            return bits_per_char(evaluator.evaluate(val)["loss"])
        finally:
            prop.scheme = rk4

    every = set(range(args.layers))
    with solved_with(model, solver="rk4"):
        rk4 = prop.scheme
        grid = bits(rk4, set())
        rows = [{"rk4_on": "none", "bits": grid}, {"rk4_on": "all", "bits": bits(rk4, every)}]
        for k in range(args.layers):
            rows.append({"rk4_on": f"piece {k}", "bits": bits(rk4, {k})})
            rows.append({"rk4_on": f"all but piece {k}", "bits": bits(rk4, every - {k})})
    for r in rows:
        r["delta"] = r["bits"] - grid
    return rows


def corpus_info(corpus) -> dict:
    """What identifies the training text: the corpus, the Python that shipped it, the
    SHA-256 of the training text (the standard library differs between versions)."""
    tr = corpus.vocab.decode(corpus.train)
    info = {k: v for k, v in corpus.info.items() if k != "docstrings_quoting_val"}
    info.update({"name": corpus.name, "python": platform.python_version(), "vocab": corpus.vocab.size,
                 "train_sha256": hashlib.sha256(tr.encode("utf-8")).hexdigest()})
    return info


def timing(args, names, rounds: int, chunk: int) -> dict:
    """Training cost of each variant against the first: each round runs ``chunk`` optimizer
    steps of every variant in turn (the same windows; each variant draws its own N_t), the
    median over ``rounds`` of the per-round time ratios to the first variant (one warm-up
    round not counted)."""
    corpus = load_text(args.corpus, seed=args.split_seed, val_fraction=args.val_fraction)
    train = text_windows(corpus.train, args.context, chunk * args.batch, seed=args.seed, name="train")
    runs = {}
    for name in names:
        v = VARIANTS[name]
        model, obj = variant(args, corpus.vocab.size, v)
        tr = Trainer(model, obj, config(args, v))
        tr.model.train()
        runs[name] = tr
    batches = [torch.arange(i * args.batch, (i + 1) * args.batch) for i in range(chunk)]
    return paired_steps(runs, train, batches, rounds)


def summary(res) -> str:
    c = res["continuity"]
    cells = " ".join(f"{r['solver']}@{r['n_steps']}:{r['bits']:.3f}" for r in c["rows"])
    return (f"{res['variant']:>14} {res['steps']} steps  train {res['train_s']:6.0f}s  val_dedup "
            f"{res['val_dedup_bpc']:.3f}  val {res['val_bpc']:.3f}  train {res['final_train_bpc']:.3f}  [{cells}]  "
            f"order {c['order']:.2f}")


def main_args(argv=None):
    """The settings (the defaults with ``argv``)."""
    return parser().parse_args(argv)


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["one"], choices=sorted(VARIANTS))
    _common.options(p, context=128, d_model=128, heads=4, layers=4, steps=2000, batch=32, lr=3e-3,
                    weight_decay=0.0, warmup=100, min_lr_ratio=0.1)
    p.add_argument("--dropout", type=float, default=0.0, help="residual and embedding dropout")
    _common.options(p, seed=0, split_seed=0, val_fraction=0.1, eval_batch=64, eval_n=[2, 4, 8, 16, 32],
                    levels=[4, 8, 16, 32, 64])
    p.add_argument("--init", default=None, help="start from these trained weights (a .pt the benchmark wrote for "
                   "the same shape) instead of nanoGPT's initialisation")
    p.add_argument("--out", default="benchmarks/out/continuity_text")
    p.add_argument("--corpus", default="pydoc_topics", choices=("pydoc_topics", "pydoc_docstrings"),
                   help="training text: the topics' training split, or it and the standard library's docstrings "
                   "(opsplit.data.load_text); the validation text is the same")
    p.add_argument("--ngram", action="store_true")
    p.add_argument("--orders", type=int, nargs="+", default=list(range(2, 9)), help="n-gram orders tried")
    p.add_argument("--report", action="store_true")
    p.add_argument("--timing", type=int, default=0, help="paired training cost of --variants against the first: "
                   "this many rounds")
    p.add_argument("--chunk", type=int, default=10, help="optimizer steps per variant per timing round")
    p.add_argument("--pieces", action="store_true", help="where the RK4 gap of the --init weights lives: RK4 "
                   "on one piece (and on all but one) of the training grid's explicit-Euler solve")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: every figure in docs/continuity.md "
                   "unless it says otherwise; 2: both cores of the 2-core machine)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.report:
        for f in sorted(Path(args.out).glob("*.json")):
            if not f.name.startswith("ngram"):
                print(summary(json.loads(f.read_text())))
        return
    if args.timing:
        print(json.dumps({"timing": timing(args, args.variants, args.timing, args.chunk),
                          "load": os.getloadavg()}, indent=1))
        return
    corpus, tr, va, dd, val_dedup, info = data(args)
    print(f"{corpus}; deduplicated validation text: {info}", flush=True)
    if args.ngram:
        t = time.perf_counter()
        if min(args.orders) < 1:
            raise SystemExit(f"--orders: expected orders >= 1, got {args.orders}")
        orders = sorted(set(args.orders))
        b = best_baseline(tr, dd, corpus.vocab.size, orders, others={"full_val_bpc": va})
        b["full_val"] = {"best": b.pop("best_full_val_bpc")}
        b["corpus"] = corpus_info(corpus)
        b["orders"] = orders
        # the development split from the topics' part of the training text (the text like the validation text)
        sel = dev_selected(tr, corpus.vocab.size, orders, within=corpus.info.get("topics_train_chars"))
        ch = sel["choice"]
        sel["val_dedup_bpc"] = next(r["val_bpc"] for r in b["rows"] if (r["method"], r["order"]) ==
                                    (ch["method"], ch["order"]))
        b["dev_selected"] = sel
        b["seconds"] = time.perf_counter() - t
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / ("ngram.json" if args.corpus == "pydoc_topics" else f"ngram_{args.corpus}.json")).write_text(
            json.dumps(b, indent=1))
        print(json.dumps(b["best"]), json.dumps(b["full_val"]["best"]), json.dumps(sel["choice"]),
              sel["val_dedup_bpc"])
        return
    if args.pieces:
        for r in pieces(args, corpus, val_dedup):
            print(f"RK4 on {r['rk4_on']:>18}: {r['bits']:.4f} ({r['delta']:+.4f})", flush=True)
        return
    for name in args.variants:
        print(summary(run_one(name, args, corpus, val_dedup)), flush=True)


if __name__ == "__main__":
    main()
