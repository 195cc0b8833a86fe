"""Adaptive depth: a continuous model trained at several N_t, solved with a tolerance
instead of an N_t; accuracy and substep calls per input, and the steps each input takes
against its difficulty.  Two tasks (``--task``):

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/adaptive_depth.py [--epochs 12]
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/adaptive_depth.py --task text

**digits** (default).  The ViT-style classifier of benchmarks/train_digits.py (patch
embedding, a SplitEncoder with 4 heads and a feed-forward term as 5 terms, class-token
read-out) with controls that are Legendre series in t (smooth: the solve can take any
step), Strang splitting with Heun substeps (order 2), T = 4, trained by opsplit's Trainer
with N_t drawn per optimizer step from --train-n-steps (TrainConfig.n_steps).  Then
on the 359 test images of ``load_digits(seed=0)``:

* fixed N_t = 1, 2, 4, 8, 16, 32: accuracy and substep calls per input;
* adaptive steps (step doubling, rtol = atol = --rtols, first step T/2), each input its
  own steps (per_sample=True): accuracy, substep calls per input (mean, min, max),
  accepted steps;
* the margin of each input (top logit minus the runner-up, at N_t = 32) against the steps
  it took (plot: docs/figures/adaptive_depth.png); Spearman's rank correlation printed.

**text**.  The character-level GPT of benchmarks/train_text.py (``opsplit.models.DecoderLM``,
softmax attention, Lie splitting with explicit-Euler substeps, controls piecewise constant
in t: one piece per layer on [0, T], T = --layers), built and trained by that script's own
functions (``opsplit_config``, the nanoGPT initial weights by ``copy_peer_weights``,
``train_config``, ``lm_loss``) on ``pydoc_data.topics`` (``opsplit.data.load_text``) at
N_t drawn from --multi, on a small budget (--steps x --batch windows of --context
characters).  Then on the validation windows (non-overlapping, the first --limit):

* fixed N_t = 1, 2, 4, 8, 16: bits/char and substep calls per sequence;
* adaptive steps (step doubling, rtol = atol = --rtols, first step T / layers: one piece),
  each sequence its own steps: bits/char, substep calls per sequence (mean, min, max);
* each solve's error: the mean per-sequence |bits/char - reference|, the reference being
  the continuous model (Richardson's extrapolation of the logits at N_t = 128 and 256,
  --reference-n-t);
* each sequence's loss at N_t = 16 (its difficulty) against the steps it took (plot:
  docs/figures/adaptive_depth_text.png), Spearman's rank correlation.

**Estimators and pieces** (both tasks): ``--estimator doubling`` (default; three steps an
attempt), ``euler-heun`` (the embedded Euler-Heun pair, ``opsplit.adaptive.EulerHeunPair``:
one step of the scheme an accepted step; a parallel scheme of explicit-Euler substeps, the
text recipe's) or ``lie-pair`` (a Strang scheme against Lie on the same substeps, two steps an
attempt); ``--cross`` lets steps cross the breakpoints of piecewise controls
(``PIController(stop_at_breakpoints=False)``).

The logits are composed here from DecoderLM's public pieces: ``embed``, ``decoder.solve``
(on the ContextGrid that ``DecoderLM.hidden`` uses), the maps of ``final_norm``, and the
read-out ``head_weight``; at a fixed N_t they are checked against ``model(ids, n_steps=N_t)``.
The controls are piecewise constant in t: an adaptive step ends at every layer boundary
t = 1, ..., T - 1 (the breakpoints, as for any piecewise control), so a solve takes at
least ``layers`` steps, and between two boundaries the field is autonomous.  A fixed
N_t < layers reads the controls at the start of each of its steps only (it skips layers):
another map than the continuous model that the adaptive solves approximate.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from opsplit.control import Objective, TrainConfig, Trainer
from opsplit.data import load_digits
from opsplit.models import ImageClassifier, SplitEncoder
from opsplit.solvers import Heun

ROOT = Path(__file__).resolve().parents[1]

FIXED = [1, 2, 4, 8, 16, 32]


def build(seed: int, T: float):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    enc = SplitEncoder(32, 4, 64, n_steps=4, T=T, scheme="strang", control="legendre", solver=Heun(), generator=g)
    return ImageClassifier(8, 2, 1, 10, enc)


def estimator(args, prop):
    """The error estimate of --estimator for the propagator ``prop``: step doubling, the
    embedded Euler-Heun pair (a scheme that is Euler on the sum of its terms), or the embedded
    pair of the scheme against Lie splitting of the same substeps (a Strang scheme)."""
    if args.estimator == "lie-pair":
        from opsplit.schemes import Lie

        return Lie(list(prop.scheme.substeps))
    return args.estimator


def classify(model, x, **solve):
    """Logits and the solve's statistics (``solve``: Propagator.solve's arguments)."""
    u0 = model.embedding(x)
    sol = model.encoder.solve(u0, **solve)
    u = sol.u if model.norm is None else model.norm(sol.u)
    return model.readout(u), sol.stats


def recipe_digits(path: str):
    """The classifier of the digits recipe (benchmarks/train_digits.py: hybrid scheme, explicit
    Euler, piecewise-constant controls, N_t = 4 on [0, 4]) with the weights saved at ``path`` by
    benchmarks/continuity.py (or train_digits.py's state dict)."""
    import train_digits as td  # benchmarks/train_digits.py, beside this script

    model = td.build(td.settings())
    model.load_state_dict(torch.load(path))
    return model


def digits(args):
    train, test = load_digits(seed=args.split_seed)
    if args.recipe:
        return digits_eval(args, recipe_digits(args.recipe), test, T=4.0)
    model = build(args.seed, args.T)
    cfg = TrainConfig(epochs=args.epochs, batch_size=64, lr=3e-3, weight_decay=0.05, schedule="cosine",
                      warmup_steps=50, grad_clip=1.0, seed=args.seed, eval_every=args.epochs, progress=False,
                      n_steps=args.train_n_steps)
    key = {"epochs": args.epochs, "train_n_steps": args.train_n_steps, "T": args.T, "seed": args.seed}
    path = Path(args.model)
    saved = torch.load(path) if path.is_file() else None
    if saved is not None and saved["key"] == key:
        model.load_state_dict(saved["state"])
        print(f"loaded the trained model from {path} ({key})", flush=True)
    else:
        t = time.perf_counter()
        Trainer(model, Objective("cross_entropy"), cfg).fit(train, test)
        print(f"trained {args.epochs} epochs at N_t in {args.train_n_steps} in {time.perf_counter() - t:.0f} s "
              f"(Strang / Heun, Legendre controls in t, T = {args.T:g})", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "state": model.state_dict()}, path)
    return digits_eval(args, model, test, T=args.T)


def digits_eval(args, model, test, T: float):
    model.eval()
    x, y = test.inputs, test.targets
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    n = len(y)
    rows = []
    print(f"\n{'solve':<24} {'accuracy':>8} {'calls/input':>12} {'min':>5} {'max':>5} {'steps/input':>11} {'s':>6}")
    with torch.no_grad():
        for nt in FIXED:
            t = time.perf_counter()
            logits, stats = classify(model, x, n_steps=nt)
            secs = time.perf_counter() - t
            acc = float((logits.argmax(-1) == y).float().mean())
            calls = stats.n_substep_calls  # the batch shares the steps: the same calls for every input
            rows.append({"solve": f"N_t = {nt}", "accuracy": acc, "calls_per_input": calls, "steps": nt, "seconds": secs})
            print(f"{'fixed N_t = ' + str(nt):<24} {acc:8.4f} {calls:12.1f} {calls:5d} {calls:5d} {nt:11.1f} {secs:6.1f}",
                  flush=True)
            if nt == FIXED[-1]:
                top2 = logits.topk(2, dim=-1).values
                margin = (top2[:, 0] - top2[:, 1]).numpy()
                fine_pred = logits.argmax(-1)
        per_input = {}
        for rtol in args.rtols:
            t = time.perf_counter()
            from opsplit.adaptive import PIController

            ctl = PIController(rtol=rtol, atol=rtol, first_step=args.first_step or T / 2,
                               stop_at_breakpoints=not args.cross)
            logits, stats = classify(model, x, controller=ctl, per_sample=True, estimator=estimator(args, model.encoder))
            secs = time.perf_counter() - t
            acc = float((logits.argmax(-1) == y).float().mean())
            calls = np.array([s.n_substep_calls for s in stats.per_sample])
            steps = np.array([s.n_accepted for s in stats.per_sample])
            agree = float((logits.argmax(-1) == fine_pred).float().mean())
            per_input[rtol] = {"calls": calls.tolist(), "steps": steps.tolist()}
            rows.append({"solve": f"rtol = {rtol:g}", "accuracy": acc, "calls_per_input": float(calls.mean()),
                         "calls_min": int(calls.min()), "calls_max": int(calls.max()), "steps": float(steps.mean()),
                         "agree_with_N_t_32": agree, "seconds": secs})
            print(f"{'adaptive rtol = ' + f'{rtol:g}':<24} {acc:8.4f} {calls.mean():12.1f} {calls.min():5d} "
                  f"{calls.max():5d} {steps.mean():11.1f} {secs:6.1f}   (same class as N_t = 32: {agree:.4f})",
                  flush=True)
    from scipy import stats as sps

    print("\nsteps against difficulty (margin at N_t = 32; small margin = hard):")
    for rtol in args.rtols:
        rho = sps.spearmanr(margin, per_input[rtol]["steps"]).statistic
        q = np.quantile(margin, [0.1, 0.9])
        hard = np.mean(np.array(per_input[rtol]["steps"])[margin <= q[0]])
        easy = np.mean(np.array(per_input[rtol]["steps"])[margin >= q[1]])
        print(f"  rtol = {rtol:g}: Spearman rho(margin, steps) = {rho:+.2f}; mean steps, hardest 10% {hard:.1f}, "
              f"easiest 10% {easy:.1f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    for rtol in args.rtols:
        a1.scatter(margin, per_input[rtol]["steps"], s=6, alpha=0.5, label=f"rtol = {rtol:g}")
    a1.set_xlabel("margin at N_t = 32 (top logit - runner-up)")
    a1.set_ylabel("accepted steps (each input its own)")
    a1.set_yscale("log")
    a1.legend(fontsize=7)
    a1.set_title("steps against difficulty")
    fx = [r for r in rows if r["solve"].startswith("N_t")]
    ad = [r for r in rows if r["solve"].startswith("rtol")]
    a2.semilogx([r["calls_per_input"] for r in fx], [r["accuracy"] for r in fx], "s-", label="fixed N_t (1..32)")
    a2.semilogx([r["calls_per_input"] for r in ad], [r["accuracy"] for r in ad], "o-", label="adaptive (rtol)")
    a2.set_xlabel("substep calls per input")
    a2.set_ylabel("test accuracy")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend()
    a2.set_title(f"digits test set ({n} images)")
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=110)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": rows, "margin": margin.tolist(),
                                           "per_input": {str(k): v for k, v in per_input.items()},
                                           "args": vars(args)}, indent=1))
    print(f"figure: {args.figure}")
    return rows


# -- text: the character-level GPT of benchmarks/train_text.py -------------------------------------
TEXT_FIXED = [1, 2, 4, 8, 16]


def text_logits(model, ids, **solve):
    """``DecoderLM``'s map composed from its public pieces, with ``decoder.solve``'s arguments
    (``solve``) in place of ``n_steps``: ``(logits, stats)``.  The same operations as
    ``DecoderLM.hidden`` and ``forward`` without a mask, positions or a cache."""
    from opsplit.operators.context import ContextGrid

    u = model.embed(ids)
    g = ContextGrid.of(model.decoder.grid).with_shape(ids.shape[1], model.config.d_model)
    sol = model.decoder.solve(u, grid=g, **solve)
    h, t1 = sol.u, model.decoder.t1
    for n in model.final_norm:
        h = n.flow(t1, 1.0, h, g) if n.has_flow else n.resolvent(t1, 1.0, h, g)
    return torch.nn.functional.linear(h, model.head_weight), sol.stats


def seq_bits(logits, y):
    """Per-sequence mean cross-entropy, bits/char ``(B,)``."""
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    return ce.view(y.shape).mean(1) / math.log(2.0)


def text(args):
    import train_text as tt  # benchmarks/train_text.py, beside this script

    from opsplit.data import load_text, text_windows
    from opsplit.models import DecoderLM

    if args.recipe:  # a model saved by benchmarks/continuity_text.py: that script's settings (--recipe-args)
        import shlex

        import continuity_text as ct

        # dropout: the weights' layout (off in evaluation); the shape, scheme and corpus of the run
        if args.recipe_variant not in ct.VARIANTS:
            raise SystemExit(f"--recipe-variant: expected one of continuity_text.py's variants "
                             f"{sorted(ct.VARIANTS)}, got {args.recipe_variant!r}")
        ns = ct.main_args(["--dropout", str(args.dropout), *shlex.split(args.recipe_args)])
        rc, _, _, _, val_dedup, _ = ct.data(ns)
        model, _ = ct.variant(ns, rc.vocab.size, ct.VARIANTS[args.recipe_variant])
        model.load_state_dict(torch.load(args.recipe))
        args.context, args.layers = ns.context, ns.layers
        return text_eval(args, model, text_windows(val_dedup, ns.context, name="val_dedup"), T=model.decoder.t1)
    corpus = load_text("pydoc_topics", seed=args.split_seed)
    vocab = corpus.vocab.size
    # train_text's functions read these names from its own argparse namespace
    ns = argparse.Namespace(context=args.context, d_model=args.d_model, heads=args.heads, layers=args.layers,
                            batch=args.batch, eval_batch=64, lr=args.lr, weight_decay=0.0, warmup=args.warmup,
                            min_lr_ratio=0.1, seed=args.seed)
    model = DecoderLM(tt.opsplit_config(vocab, ns, "softmax", "lie"), generator=torch.Generator().manual_seed(args.seed))
    key = {k: getattr(args, k) for k in ("context", "d_model", "heads", "layers", "steps", "batch", "lr", "warmup",
                                         "multi", "seed", "split_seed")}
    path = Path(args.model)
    saved = torch.load(path) if path.is_file() else None
    if saved is not None and saved["key"] == key:
        model.load_state_dict(saved["state"])
        print(f"loaded the trained model from {path} ({key})", flush=True)
    else:
        torch.manual_seed(args.seed)  # the peer's initial weights, as train_text's runs start from
        peer = tt.NanoGPT(vocab, args.context, args.d_model, args.layers, args.heads, 4 * args.d_model)
        tt.copy_peer_weights(peer, model)
        train = text_windows(corpus.train, args.context, args.steps * args.batch, seed=args.seed, name="train")
        tr = Trainer(model, Objective(tt.lm_loss, output="logits"), tt.train_config(ns, tuple(args.multi)))
        t = time.perf_counter()
        tr.fit(train, None, plot=False)
        print(f"trained {args.steps} steps x {args.batch} windows of {args.context} characters at N_t in "
              f"{tuple(args.multi)} in {time.perf_counter() - t:.0f} s (d_model {args.d_model}, {args.heads} heads, "
              f"{args.layers} layers' controls, Lie / explicit Euler; {corpus})", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "state": model.state_dict()}, path)
    return text_eval(args, model, text_windows(corpus.val, args.context, name="val"), T=model.decoder.t1)


def text_eval(args, model, val, T: float):
    from opsplit.adaptive import PIController

    model.eval()
    x, y = val.inputs, val.targets
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    n = len(y)
    rows = []
    print(f"\n{n} validation windows of {args.context} characters")
    print(f"{'solve':<24} {'bits/char':>9} {'calls/seq':>10} {'min':>5} {'max':>5} {'steps/seq':>9} {'rejected':>8} "
          f"{'s':>6}")
    with torch.no_grad():
        fixed_bits = {}
        for nt in TEXT_FIXED:
            t = time.perf_counter()
            parts = [text_logits(model, x[a: a + 64], n_steps=nt) for a in range(0, n, 64)]
            secs = time.perf_counter() - t
            logits = torch.cat([p[0] for p in parts])
            ref = model(x[:8], n_steps=nt).logits  # the composition above is DecoderLM's own map
            assert torch.equal(logits[:8], ref), "text_logits differs from DecoderLM.forward"
            bits = seq_bits(logits, y)
            fixed_bits[nt] = bits
            calls = parts[0][1].n_substep_calls  # the batch shares the steps: the same calls per sequence
            rows.append({"solve": f"N_t = {nt}", "bpc": float(bits.mean()), "calls_per_seq": calls,
                         "calls_min": calls, "calls_max": calls, "steps": nt, "rejected": 0, "seconds": secs})
            print(f"{'fixed N_t = ' + str(nt):<24} {float(bits.mean()):9.4f} {calls:10.1f} {calls:5d} {calls:5d} "
                  f"{nt:9.1f} {0:8d} {secs:6.1f}", flush=True)
        difficulty = fixed_bits[TEXT_FIXED[-1]].numpy()
        # the continuous model, for the solves' own error: Richardson's extrapolation of the logits
        # of N/2 and N fixed steps (explicit-Euler substeps: first order; the extrapolation is second)
        def richardson(a):
            nt = args.reference_n_t
            coarse, fine = (text_logits(model, x[a: a + 64], n_steps=k)[0] for k in (nt // 2, nt))
            return seq_bits(2 * fine - coarse, y[a: a + 64])

        ref_bits = torch.cat([richardson(a) for a in range(0, n, 64)])
        for r in rows:
            r["gap_to_reference"] = float((fixed_bits[r["steps"]] - ref_bits).abs().mean())
        print(f"reference (Richardson, N_t = {args.reference_n_t // 2} and {args.reference_n_t}): "
              f"{float(ref_bits.mean()):.4f} bits/char; mean |bits - reference| "
              "per sequence, fixed N_t: " + ", ".join(f"{r['gap_to_reference']:.1e}" for r in rows), flush=True)
        per_seq = {}
        for rtol in args.rtols:
            ctl = PIController(rtol=rtol, atol=rtol, first_step=args.first_step or T / args.layers,
                               stop_at_breakpoints=not args.cross)
            t = time.perf_counter()
            logits, stats = text_logits(model, x, controller=ctl, per_sample=True,
                                        estimator=estimator(args, model.decoder))
            secs = time.perf_counter() - t
            bits = seq_bits(logits, y)
            calls = np.array([s.n_substep_calls for s in stats.per_sample])
            steps = np.array([s.n_accepted for s in stats.per_sample])
            gap = float((bits - ref_bits).abs().mean())
            per_seq[rtol] = {"calls": calls.tolist(), "steps": steps.tolist(), "bits": bits.tolist()}
            rows.append({"solve": f"rtol = {rtol:g}", "bpc": float(bits.mean()), "calls_per_seq": float(calls.mean()),
                         "calls_min": int(calls.min()), "calls_max": int(calls.max()), "steps": float(steps.mean()),
                         "steps_min": int(steps.min()), "steps_max": int(steps.max()), "rejected": stats.n_rejected,
                         "gap_to_reference": gap, "seconds": secs})
            print(f"{'adaptive rtol = ' + f'{rtol:g}':<24} {float(bits.mean()):9.4f} {calls.mean():10.1f} "
                  f"{calls.min():5d} {calls.max():5d} {steps.mean():9.1f} {stats.n_rejected:8d} {secs:6.1f}   "
                  f"(steps {steps.min()}-{steps.max()}; mean |bits - reference| per sequence {gap:.1e})",
                  flush=True)
    from scipy import stats as sps

    print(f"\nsteps against difficulty (each sequence's bits/char at N_t = {TEXT_FIXED[-1]}; high = hard):")
    corr = {}
    q = np.quantile(difficulty, [0.1, 0.9])
    for rtol in args.rtols:
        st, ca = np.array(per_seq[rtol]["steps"]), np.array(per_seq[rtol]["calls"])
        # undefined (nan) where every sequence took the same steps
        rho = sps.spearmanr(difficulty, st).statistic if np.ptp(st) else float("nan")
        rho_c = sps.spearmanr(difficulty, ca).statistic if np.ptp(ca) else float("nan")
        hard, easy = st[difficulty >= q[1]].mean(), st[difficulty <= q[0]].mean()
        corr[rtol] = {"rho_steps": rho, "rho_calls": rho_c, "hard_steps": hard, "easy_steps": easy}
        print(f"  rtol = {rtol:g}: Spearman rho(loss, steps) = {rho:+.2f}, rho(loss, calls) = {rho_c:+.2f}; "
              f"mean steps, hardest 10% {hard:.2f}, easiest 10% {easy:.2f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    for rtol in args.rtols:
        a1.scatter(difficulty, per_seq[rtol]["steps"], s=6, alpha=0.5,
                   label=f"rtol = {rtol:g} (Spearman {corr[rtol]['rho_steps']:+.2f})")
    a1.set_xlabel(f"sequence loss at N_t = {TEXT_FIXED[-1]} (bits/char; high = hard)")
    a1.set_ylabel("accepted steps (each sequence its own)")
    a1.set_yscale("log")
    a1.legend(fontsize=7)
    a1.set_title("steps against difficulty")
    fx = [r for r in rows if r["solve"].startswith("N_t")]
    ad = [r for r in rows if r["solve"].startswith("rtol")]
    a2.semilogx([r["calls_per_seq"] for r in fx], [r["bpc"] for r in fx], "s-",
                label=f"fixed N_t ({', '.join(map(str, TEXT_FIXED))})")
    a2.semilogx([r["calls_per_seq"] for r in ad], [r["bpc"] for r in ad], "o-", label="adaptive (rtol)")
    for r in fx + ad:
        a2.annotate(r["solve"].replace("N_t = ", "").replace("rtol = ", ""), (r["calls_per_seq"], r["bpc"]),
                    fontsize=7, textcoords="offset points", xytext=(3, 3))
    a2.set_xlabel("substep calls per sequence")
    a2.set_ylabel("validation bits/char")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend()
    a2.set_title(f"pydoc topics, {n} validation windows of {args.context}")
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=110)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": rows, "difficulty": difficulty.tolist(),
                                           "per_sequence": {str(k): v for k, v in per_seq.items()},
                                           "spearman": {str(k): v for k, v in corr.items()}, "args": vars(args)},
                                          indent=1))
    print(f"figure: {args.figure}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=("digits", "text"), default="digits")
    ap.add_argument("--estimator", choices=("doubling", "euler-heun", "lie-pair"), default="doubling",
                    help="the local error estimate: step doubling (3 steps an attempt), the embedded Euler-Heun pair "
                         "(a parallel scheme of Euler substeps: one step an accepted step), or a Strang scheme "
                         "against Lie on the same substeps (2 steps an attempt)")
    ap.add_argument("--cross", action="store_true",
                    help="steps may cross the breakpoints of piecewise controls (PIController(stop_at_breakpoints=False))")
    ap.add_argument("--rtols", type=float, nargs="+", default=None,
                    help="adaptive tolerances (rtol = atol; default digits 1e-1 1e-2 1e-3, text also 1e-4)")
    ap.add_argument("--first-step", type=float, default=None,
                    help="the adaptive solves' first step (default digits T/2: loose tolerances may take two "
                    "steps; text T / layers: one layer)")
    ap.add_argument("--model", default=None, help="the trained weights: loaded if the file exists (same settings), "
                    "else trained and saved (default benchmarks/out/adaptive_depth[_text]_model.pt)")
    ap.add_argument("--recipe", default=None, help="measure the model saved at this path by benchmarks/continuity.py "
                    "(digits: the recipe's classifier) or benchmarks/continuity_text.py (text: on the deduplicated "
                    "validation text) instead of training one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="first test images / validation windows only")
    ap.add_argument("--figure", default=None, help="default docs/figures/adaptive_depth[_text].png")
    ap.add_argument("--json", default=None, help="default benchmarks/out/adaptive_depth[_text].json")
    d = ap.add_argument_group("digits")
    d.add_argument("--epochs", type=int, default=12)
    d.add_argument("--train-n-steps", type=int, nargs="+", default=[2, 4, 8])
    d.add_argument("--T", type=float, default=4.0)
    t = ap.add_argument_group("text (train_text.py's names)")
    t.add_argument("--context", type=int, default=64)
    t.add_argument("--d-model", type=int, default=64)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--layers", type=int, default=4, help="control pieces = T")
    t.add_argument("--steps", type=int, default=400, help="training steps")
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--multi", type=int, nargs="+", default=[2, 4, 8], help="train_n_steps")
    t.add_argument("--split-seed", type=int, default=0)
    t.add_argument("--dropout", type=float, default=0.0, help="--recipe: the residual dropout it was trained with")
    t.add_argument("--recipe-args", default="", help="--recipe: the continuity_text.py flags it was trained with "
                   "(shape and corpus, e.g. \"--layers 8 --d-model 88 --corpus pydoc_docstrings\")")
    t.add_argument("--recipe-variant", default="cont", help="--recipe: its continuity_text.py variant (the scheme, "
                   "the solver and the controls' kind of the saved weights)")
    t.add_argument("--reference-n-t", type=int, default=256,
                   help="the continuous model (each solve's error in bits/char): Richardson's extrapolation "
                   "of N_t / 2 and N_t fixed steps")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tag = "" if args.task == "digits" else "_text"
    out = ROOT / "benchmarks" / "out"
    args.rtols = args.rtols or ([1e-1, 1e-2, 1e-3] if args.task == "digits" else [1e-1, 1e-2, 1e-3, 1e-4])
    args.model = args.model or str(out / f"adaptive_depth{tag}_model.pt")
    args.figure = args.figure or str(ROOT / "docs" / "figures" / f"adaptive_depth{tag}.png")
    args.json = args.json or str(out / f"adaptive_depth{tag}.json")
    return digits(args) if args.task == "digits" else text(args)


if __name__ == "__main__":
    main()
