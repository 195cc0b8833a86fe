"""Self-speculative decoding (opsplit.models.speculative) on the continuous text model of
docs/continuity.md: tokens per second against plain ``generate``, and the acceptance rate of
each draft solve; beside it, Hugging Face's prompt-lookup decoding on the same weights.

    # the parallel-scheme model of docs/continuity.md (trained by benchmarks/continuity_text.py)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/speculative.py \\
        --weights benchmarks/out/ctext_doc_b64_l8_lr6e-3/par_splitw0.3_k0.01_2000_pydoc_docstrings.pt \\
        --scheme parallel
    # the same model trained with coarse N_t drawn and the pieces averaged over each coarse step
    # (benchmarks/multilevel.py text --variants frontier_w): its drafts read the averages
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/speculative.py \\
        --weights benchmarks/out/multilevel/text_frontier_w_2000.pt --scheme parallel \\
        --draft-controls average --targets 8 --drafts 2 4
    # a batch of one row: its Python-bookkept rounds against the batch loop (paired, the same tokens)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/speculative.py \\
        --weights benchmarks/out/multilevel/text_frontier_w_2000.pt --draft-controls average --drafts 2 --ks 4 \\
        --one-row --runs 3 --new 112
    # ... and where a generation's time goes (decode and prompt calls timed inside)
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/speculative.py \\
        --weights benchmarks/out/multilevel/text_frontier_w_2000.pt --draft-controls average --drafts 2 --ks 4 \\
        --phases --runs 3 --new 112
    # a Lie-scheme model trained the same way (to_hf takes only Lie models): trained once ...
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/speculative.py --train-lie \\
        --out benchmarks/out/ctext_doc_b64_l8_lr6e-3_lie [--train-steps 2000]
    # ... then measured, with Hugging Face's prompt lookup on the same weights
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/speculative.py \\
        --weights benchmarks/out/ctext_doc_b64_l8_lr6e-3_lie/lie_splitw0.3_k0.01_2000_pydoc_docstrings.pt \\
        --scheme lie --hf

The model: the character-level GPT of docs/continuity.md (8 control pieces x d_model 88, 4
heads, 128 learned positions, ``DecoderConfig`` of benchmarks/train_text.py, controls
piecewise constant in time), its weights loaded from ``--weights``.  Prompts: ``--prompts``
windows of ``--prompt-len`` characters of the validation split of ``pydoc_docstrings`` at
seeded offsets; every generation continues one prompt by ``--new`` characters (at most the
128 learned positions less the prompt), greedily (``--sample``: temperature 0.8, seeded).

For every setting — a target solve (``--targets``: ``N_t[:solver]``; 8 is the model's own),
a draft (``--drafts``: the draft's N_t, explicit Euler, those cheaper than the target) and
``--ks`` (draft tokens per round, or ``auto``) — the benchmark runs ``--runs`` pairs, each
pair one prompt: plain ``generate`` of the target solve (its key/value cache) then
``generate(draft=...)``, timed in one process, one thread, A B A B; reported: the median of
the per-pair time ratios (plain / speculative), both medians in tokens per second, the
acceptance rate (accepted over judged draft tokens over all pairs) and the mean new tokens
per round; greedy outputs are checked equal to plain ``generate`` (a mismatch is printed).

``--hf`` (``--hf-only``: without the rows above): the model rebuilt as Hugging Face's ``GPT2LMHeadModel`` (``from_hf`` of a GPT-2 of
the same shape, the weights loaded, ``to_hf``; refused for a parallel-scheme model), then
HF's ``generate`` with ``prompt_lookup_num_tokens`` (``--lookup``) against HF's plain
``generate``, paired the same way; HF's greedy output is checked equal to opsplit's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from opsplit.coarse import coarse_controls
from opsplit.data import load_text
from opsplit.models import DecoderConfig, DecoderLM, convert_time_controls, from_hf, to_hf
from opsplit.models.speculative import DraftSolve, speculative_generate


def text_model(vocab: int, args) -> DecoderLM:
    """The GPT-2 layout of benchmarks/train_text.py with piecewise-constant controls."""
    cfg = DecoderConfig(vocab_size=vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                        d_ff=4 * args.d_model, norm="layer", norm_eps=1e-5, norm_bias=True, mlp="plain",
                        activation="gelu", positions="learned", max_positions=args.context, qkv_bias=True,
                        out_bias=True, mlp_bias=True, tie_embeddings=True, scheme=args.scheme)
    model = DecoderLM(cfg)
    return convert_time_controls(model, "piecewise_constant", n_steps=args.layers, n_modes=args.layers)


def hf_twin(model: DecoderLM, args):
    """Hugging Face's GPT2LMHeadModel holding ``model``'s weights (from_hf of a GPT-2 of the
    same shape, the weights loaded, to_hf), and the opsplit model to_hf rebuilt it from."""
    import transformers

    cfg = transformers.GPT2Config(vocab_size=model.vocab_size, n_embd=args.d_model, n_layer=args.layers,
                                  n_head=args.heads, n_positions=args.context, activation_function="gelu",
                                  layer_norm_epsilon=1e-5, tie_word_embeddings=True, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    twin = from_hf(transformers.GPT2LMHeadModel(cfg).eval())
    twin = convert_time_controls(twin, "piecewise_constant", n_steps=args.layers, n_modes=args.layers)
    twin.load_state_dict(model.state_dict())
    return to_hf(twin).eval(), twin.eval()


def prompts(args):
    corpus = load_text("pydoc_docstrings", seed=0, val_fraction=0.1)
    val = corpus.val
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(val) - args.prompt_len, (args.prompts,), generator=g).tolist()
    return corpus.vocab, [val[s: s + args.prompt_len].view(1, -1).long() for s in starts]


def loaded(args):
    """One thread; the vocabulary, the prompts and the model of ``--weights`` in eval mode."""
    torch.set_num_threads(1)
    vocab, items = prompts(args)
    model = text_model(vocab.size, args)
    model.load_state_dict(torch.load(args.weights, weights_only=True))
    return vocab, items, model.eval()


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def pairs(fa, fb, items, runs, warm=1):
    """``runs`` pairs A B on ``items`` (cycled): times, outputs; ``warm`` unpaired calls first."""
    for i in range(warm):
        fa(items[i % len(items)])
        fb(items[i % len(items)])
    ta, tb, oa, ob = [], [], [], []
    for r in range(runs):
        x = items[r % len(items)]
        t, o = timed(lambda x=x: fa(x))
        ta.append(t)
        oa.append(o)
        t, o = timed(lambda x=x: fb(x))
        tb.append(t)
        ob.append(o)
    return ta, tb, oa, ob


def measure(args):
    vocab, items, model = loaded(args)
    new = min(args.new, args.context - args.prompt_len)
    kw = dict(do_sample=args.sample, temperature=0.8 if args.sample else 1.0, eos_token_id=None)
    print(f"# {args.weights}: scheme {args.scheme}, N_t = {args.layers}; {len(items)} prompts of {args.prompt_len} "
          f"characters, {new} new each ({'sampled, temperature 0.8' if args.sample else 'greedy'}); one thread, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, load {os.getloadavg()[0]:.1f}; "
          f"{args.runs} pairs per row, plain generate then speculative")
    rows = []
    print("\n| target | draft | k | speed-up (median of pairs) | min..max | plain tokens/s | speculative tokens/s | "
          "acceptance | tokens per round | equal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with torch.no_grad():
        for target, d, (k, conf) in ([] if args.hf_only else settings(model, args)):
            tkw = {"n_steps": target[0], "solver": target[1]}
            seeds = iter(range(10 ** 6))  # sampling: the pair's two calls draw with different seeds
            stats = []

            def plain(x, tkw=tkw, seeds=seeds):
                g = torch.Generator().manual_seed(next(seeds)) if args.sample else None
                return model.generate(x, new, generator=g, **tkw, **kw)

            def spec(x, d=d, k=k, conf=conf, tkw=tkw, seeds=seeds, stats=stats):
                g = torch.Generator().manual_seed(next(seeds)) if args.sample else None
                res = speculative_generate(model, x, new, draft=DraftSolve(n_steps=d, controls=args.draft_controls),
                                           num_draft_tokens=k, draft_confidence=conf,
                                           generator=g, **tkw, **kw)
                stats.append(res)
                return res.sequences

            ta, tb, oa, ob = pairs(plain, spec, items, args.runs)
            stats = stats[-args.runs:]
            ratios = [a / b for a, b in zip(ta, tb)]
            equal = all(torch.equal(a, b) for a, b in zip(oa, ob)) if not args.sample else None
            acc = sum(sum(s.accepted) for s in stats) / max(1, sum(sum(s.drafted) for s in stats))
            per_round = sum(new for _ in stats) / max(1, sum(s.rounds + 1 for s in stats))
            row = {"target_n_t": target[0], "target_solver": target[1] or "euler", "draft_n_t": d, "k": k,
                   "draft_confidence": conf,
                   "draft_controls": args.draft_controls,
                   "ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                   "plain_tok_s": new / statistics.median(ta), "spec_tok_s": new / statistics.median(tb),
                   "acceptance": acc, "tokens_per_round": per_round, "equal": equal}
            rows.append(row)
            tname = f"N_t = {target[0]}" + (f", {target[1]}" if target[1] else "")
            print(f"| {tname} | N_t = {d} | {k}{'' if conf is None else f', confidence {conf:g}'} | {row['ratio']:.2f}× | {row['min']:.2f}..{row['max']:.2f}× | "
                  f"{row['plain_tok_s']:.0f} | {row['spec_tok_s']:.0f} | {acc:.3f} | {per_round:.2f} | "
                  f"{'—' if equal is None else 'yes' if equal else 'NO'} |", flush=True)
    if args.hf:
        rows.append(measure_hf(model, items, new, args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {out}")


def settings(model, args):
    """(target (N_t, solver), draft N_t, k) of --targets x --drafts x --ks whose draft is
    cheaper than the target (DecoderLM.solve_cost)."""
    out = []
    for t in args.targets:
        nt, _, solver = t.partition(":")
        target = (int(nt), solver or None)
        for d in args.drafts:
            if model.solve_cost(d) >= model.solve_cost(target[0], target[1]):
                continue
            out += [(target, d, (k if k == "auto" else int(k), c)) for k in args.ks for c in args.confidences]
    return out


def measure_hf(model, items, new, args):
    hf, twin = hf_twin(model, args)
    # the verification pass feeds up to --lookup candidates past the last token: they need positions too
    new = min(new, args.context - args.prompt_len - args.lookup)
    print(f"\n# Hugging Face {type(hf).__name__} with the same weights: prompt-lookup decoding "
          f"(prompt_lookup_num_tokens = {args.lookup}) against plain generate, greedy, {new} new tokens, "
          f"{args.runs} pairs")
    with torch.no_grad():
        ours = model.generate(items[0], new, eos_token_id=None)
        theirs = hf.generate(items[0], attention_mask=torch.ones_like(items[0]), max_new_tokens=new,
                             do_sample=False, pad_token_id=0)
        same = torch.equal(ours, theirs)

        def plain(x):
            return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                               pad_token_id=0)

        def lookup(x):
            return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                               pad_token_id=0, prompt_lookup_num_tokens=args.lookup)

        ta, tb, oa, ob = pairs(plain, lookup, items, args.runs)
    ratios = [a / b for a, b in zip(ta, tb)]
    row = {"hf": "prompt_lookup", "lookup": args.lookup, "new": new, "ratio": statistics.median(ratios), "min": min(ratios),
           "max": max(ratios), "plain_tok_s": new / statistics.median(ta), "lookup_tok_s": new / statistics.median(tb),
           "equal": all(torch.equal(a, b) for a, b in zip(oa, ob)), "hf_equals_opsplit": same}
    print(f"HF prompt lookup: {row['ratio']:.2f}× (min..max {row['min']:.2f}..{row['max']:.2f}×), plain "
          f"{row['plain_tok_s']:.0f} tokens/s, lookup {row['lookup_tok_s']:.0f} tokens/s; lookup output equal to "
          f"plain: {row['equal']}; HF greedy equal to opsplit's: {same}")
    return row


def train_lie(args):
    """The Lie-scheme twin of the text recipe (variant par_splitw0.3_k0.01 of
    benchmarks/continuity_text.py with scheme 'lie'), trained by that script's own loop."""
    import sys

    import continuity_text as ct  # benchmarks/continuity_text.py, beside this script

    spec = dict(ct.VARIANTS["par_splitw0.3_k0.01"])
    spec.pop("scheme")
    ct.VARIANTS["lie_splitw0.3_k0.01"] = spec
    sys.argv = ["continuity_text.py", "--corpus", "pydoc_docstrings", "--variants", "lie_splitw0.3_k0.01", "--steps",
                str(args.train_steps), "--batch", "64", "--layers", "8", "--d-model", "88", "--eval-n", "4", "8", "16", "32", "64",
                "--levels", "8", "16", "32", "64", "128", "--lr", "6e-3", "--out", args.out]
    ct.main()


def step_times(args):
    """``--step-times``: one decode call of the model's cached decode steps (``decode_steps``)
    after the first prompt, per N_t of ``--drafts`` (one token; at the largest, also k + 1 =
    5 and 9 tokens: a verification), the median of 200 calls in ms; the cache rolled back
    after each call (not timed).  The cost model of a round: k draft calls and one
    verification for (1 - a^(k+1)) / (1 - a) tokens at acceptance a."""
    from opsplit.operators import KVCache  # noqa: PLC0415

    vocab, items, model = loaded(args)
    x = items[0]
    N = x.shape[1]
    mask, pos = torch.ones_like(x), torch.arange(N)[None]
    g = torch.Generator().manual_seed(args.seed)
    rows = []
    for n in sorted(set(args.drafts)):
        for m in ((1, 5, 9) if n == max(args.drafts) else (1,)):
            c = KVCache()
            swap = coarse_controls(model, n) if args.draft_controls == "average" and n < args.layers else \
                contextlib.nullcontext()
            with torch.no_grad(), swap:
                model.next_token_logits(x, mask, position_ids=pos, cache=c, n_steps=n)
                step = model.decode_steps(c, n_steps=n)
                ids = torch.randint(0, vocab.size, (1, m), generator=g)
                p = torch.arange(N, N + m)[None]
                ts = []
                for _ in range(200):
                    c.mark()
                    t0 = time.perf_counter()
                    step(ids, p, None, last=m == 1)
                    ts.append(time.perf_counter() - t0)
                    c.rollback(N)
            rows.append({"n_t": n, "tokens": m, "ms": 1e3 * statistics.median(ts)})
            print(f"N_t = {n}, {m} token(s): {rows[-1]['ms']:.3f} ms (median of 200; load {os.getloadavg()[0]:.1f})",
                  flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"step_times": rows, "weights": args.weights}, indent=1))


def one_row(args):
    """``--one-row``: speculative decoding of a batch of one row by its Python-bookkept rounds
    (``opsplit.models.speculative.ONE_ROW_PATH``, the default) against the batch loop, paired
    A B in one process over the prompts (``--runs`` rounds of all of them), greedy, the first
    ``--drafts`` N_t and ``--ks`` k; both outputs checked equal."""
    from opsplit.models import speculative as spec_mod  # noqa: PLC0415

    vocab, items, model = loaded(args)
    new = min(args.new, args.context - args.prompt_len)
    k = args.ks[0] if args.ks[0] == "auto" else int(args.ks[0])
    draft = DraftSolve(n_steps=args.drafts[0], controls=args.draft_controls)

    def run(x, fast):
        spec_mod.ONE_ROW_PATH = fast
        try:
            return speculative_generate(model, x, new, draft=draft, num_draft_tokens=k, eos_token_id=None).sequences
        finally:
            spec_mod.ONE_ROW_PATH = True

    with torch.no_grad():
        ta, tb, oa, ob = pairs(lambda x: run(x, False), lambda x: run(x, True), items, args.runs * len(items))
    assert all(torch.equal(a, b) for a, b in zip(oa, ob)), "the two paths gave different tokens"
    ratio = statistics.median(a / b for a, b in zip(ta, tb))
    print(f"draft N_t = {args.drafts[0]} ({args.draft_controls}), k = {k}, {new} new tokens, {len(ta)} pairs, load "
          f"{os.getloadavg()[0]:.1f}: batch loop {1e3 * statistics.median(ta):.1f} ms, one-row rounds "
          f"{1e3 * statistics.median(tb):.1f} ms a generation; median of the ratios {ratio:.3f}")


def phases(args):
    """``--phases``: where a generation's time goes — plain ``generate`` of the model's own
    solve and speculative decoding (the first ``--drafts`` N_t and ``--ks`` k), A B over the
    prompts ``--runs`` times, with every decode call (``decode_steps``) and prompt call
    (``next_token_logits``) timed inside; medians per generation."""
    vocab, items, model = loaded(args)
    new = min(args.new, args.context - args.prompt_len)
    k = args.ks[0] if args.ks[0] == "auto" else int(args.ks[0])
    draft = DraftSolve(n_steps=args.drafts[0], controls=args.draft_controls)
    acc = {}
    decode_steps, next_token_logits = model.decode_steps, model.next_token_logits

    def timed(key, f):
        def g(*a, **kw):
            t = time.perf_counter()
            r = f(*a, **kw)
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
            acc["n_" + key] = acc.get("n_" + key, 0) + 1
            return r
        return g

    model.decode_steps = lambda cache, **kw: timed("draft" if kw.get("n_steps") == draft.n_steps else "target",
                                                   decode_steps(cache, **kw))
    model.next_token_logits = timed("prompt", next_token_logits)
    rows = {"plain": [], "speculative": []}
    with torch.no_grad():
        for r in range(args.runs + 1):
            for x in items:
                for name in rows:
                    acc.clear()
                    t = time.perf_counter()
                    out = (model.generate(x, new, eos_token_id=None) if name == "plain" else
                           speculative_generate(model, x, new, draft=draft, num_draft_tokens=k, eos_token_id=None))
                    total = time.perf_counter() - t
                    if r:  # the first pass over the prompts warms up
                        rows[name].append(dict(acc, total=total, rounds=getattr(out, "rounds", 0)))
    med = {name: {key: statistics.median(row.get(key, 0) for row in rs) for key in set().union(*rs)}
           for name, rs in rows.items()}
    p, s_ = med["plain"], med["speculative"]
    print(f"# {args.weights}: {new} new tokens, draft N_t = {draft.n_steps} ({draft.controls}), k = {k}; "
          f"{len(rows['plain'])} generations each, load {os.getloadavg()[0]:.1f}; medians per generation")
    print(f"plain: {1e3 * p['total']:.1f} ms = {p['n_target']:.0f} decode calls x {1e3 * p['target'] / p['n_target']:.3f} ms "
          f"+ {1e3 * (p['total'] - p['target']):.1f} ms (prompt {1e3 * p['prompt']:.1f})")
    rest = s_["total"] - s_["target"] - s_["draft"]
    print(f"speculative: {1e3 * s_['total']:.1f} ms = {s_['n_draft']:.0f} draft calls x "
          f"{1e3 * s_['draft'] / s_['n_draft']:.3f} ms + {s_['n_target']:.0f} verifications x "
          f"{1e3 * s_['target'] / s_['n_target']:.3f} ms + {1e3 * rest:.1f} ms (prompts {1e3 * s_['prompt']:.1f}, "
          f"{1e3 * (rest - s_['prompt']) / max(1, s_['rounds']):.3f} ms a round over {s_['rounds']:.0f} rounds)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", help="the .pt of benchmarks/continuity_text.py")
    ap.add_argument("--scheme", default="parallel", choices=("parallel", "lie"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=88)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new", type=int, default=100, help="new characters (at most context - prompt length; "
                    "--hf: and less --lookup)")
    ap.add_argument("--targets", nargs="+", default=["8", "16", "32", "8:heun"],
                    help="the target solves: N_t[:solver] (8: the model's own)")
    ap.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4, 8], help="the drafts' N_t (Euler; those "
                    "cheaper than the target)")
    ap.add_argument("--draft-controls", default="point", choices=("point", "average"),
                    help="how a draft of fewer steps than the 8 pieces reads them: at its times, or averaged over "
                         "each step (a model trained with coarse_controls = 'average': benchmarks/multilevel.py's "
                         "frontier_w)")
    ap.add_argument("--ks", nargs="+", default=["4", "auto"], help="draft tokens per round")
    ap.add_argument("--confidences", type=lambda v: None if v == "none" else float(v), nargs="+", default=[None],
                    help="draft_confidence of each row: a probability, or none (default)")
    ap.add_argument("--runs", type=int, default=7, help="pairs per row (>= 7)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample", action="store_true", help="sample (temperature 0.8) instead of greedy")
    ap.add_argument("--hf", action="store_true", help="also Hugging Face's prompt lookup on the same weights")
    ap.add_argument("--hf-only", action="store_true", help="only Hugging Face's prompt lookup (implies --hf)")
    ap.add_argument("--lookup", type=int, default=10, help="prompt_lookup_num_tokens of --hf")
    ap.add_argument("--json", default="benchmarks/out/speculative.json")
    ap.add_argument("--step-times", action="store_true", help="time one decode call per N_t of --drafts (and a "
                    "verification of 5 and 9 tokens at the largest) instead of the pairs")
    ap.add_argument("--one-row", action="store_true", help="pair the one-row rounds of speculative decoding with "
                    "the batch loop (the first --drafts and --ks)")
    ap.add_argument("--phases", action="store_true", help="time the decode and prompt calls inside plain and "
                    "speculative generations (the first --drafts and --ks)")
    ap.add_argument("--train-lie", action="store_true", help="train the Lie-scheme twin (once) into --out")
    ap.add_argument("--out", default="benchmarks/out/ctext_doc_b64_l8_lr6e-3_lie")
    ap.add_argument("--train-steps", type=int, default=2000,
                    help="--train-lie: optimizer steps (2000: the parallel model's; fewer: a capped twin)")
    args = ap.parse_args()
    if args.train_lie:
        return train_lie(args)
    if not args.weights:
        ap.error("--weights: the .pt to measure (or --train-lie)")
    args.hf = args.hf or args.hf_only
    if args.step_times:
        return step_times(args)
    if args.one_row:
        return one_row(args)
    if args.phases:
        return phases(args)
    measure(args)


if __name__ == "__main__":
    main()
