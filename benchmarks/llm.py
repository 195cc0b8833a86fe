"""Speed of the converted decoder-only LLMs against Hugging Face on the same model.

A Llama-family model (``LlamaForCausalLM``: hidden 256, 4 layers, 8 query / 4 key-value
heads, intermediate 688, vocab 2048) and a GPT-2 model (``GPT2LMHeadModel``: n_embd 256,
4 layers, 4 heads, vocab 2048, dropout 0) are built from configs with seeded random weights
(no download) and converted with ``opsplit.models.from_hf``; then, in one process,
interleaved A B A B and paired (the ratio of each opsplit run to the Hugging Face run next
to it), over ``--repeats`` pairs after ``--warmup`` pairs:

* ``forward``: eval mode, ``torch.no_grad()``, batch ``--B`` x ``--N`` tokens (8 x 256),
  logits of every position;
* ``forward+backward``: train mode (dropout 0), the mean square of the logits, backward to
  every parameter (gradients reset between runs);
* ``generate``: greedy, ``--gen-B`` prompts of ``--prompt`` tokens, ``--new`` new tokens with
  the key/value cache (no eos), reported as generated tokens per second.

The targets (forward and forward+backward <= 1.05x HF's time, generation >= 0.95x HF's
tokens/s) are judged on the median of the paired ratios.

``--exactness`` prints instead the worst differences to Hugging Face (logits and every
parameter's gradient, float32 and float64) over the configurations of ``tests/test_llm_hf.py``
(``opsplit.analysis.hf_cases``).

``--copy-cost`` measures instead what the copy of the q/k/v and gate/up kernels side by side,
made at every call without autograd, costs the forward: the forward as it runs, paired with
the same forward followed by the same copies once more (``torch.cat`` of every layer's
kernels, read from the model's controls).

``--decode-cost`` measures instead the time of one decode step (one new token, key/value
cache of ``n`` tokens) against the context length ``n`` for opsplit's own causal decoders
(``AttentionDecoder`` + ``TokenClassifier``: d_model 64, 4 heads, 2 layers, with softmax,
causal sliced ReLU and causal sliced ReLU-bump attention) and the converted Llama model, and
fits the exponent of time against ``n`` (a step as ``generate`` runs it after the prompt:
``DecoderLM.decode_steps``, else ``next_token_logits`` without the value checks).  Before timing, the script checks
that both sides compute the same thing (logits within 1e-4 relative, the same generated
tokens).

Usage::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/llm.py [--repeats 9] [--threads 2] [--models llama gpt2]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/llm.py --threads 1 --cpu-time --skip forward backward
    OMP_WAIT_POLICY=PASSIVE python benchmarks/llm.py --decode-cost [--sizes 1024 4096 16384 65536]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/llm.py --copy-cost --threads 1 --cpu-time --repeats 15
    python benchmarks/llm.py --exactness
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import _common  # noqa: E402
import torch  # noqa: E402

from opsplit.models import from_hf  # noqa: E402


def build(kind: str, vocab: int, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
        hf = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=256, n_layer=4, n_head=4, n_positions=1024,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
        hf = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return hf.eval()


CLOCK = time.perf_counter


def paired(fa, fb, repeats: int, warmup: int):
    """Interleaved runs A B A B ...; returns (times A, times B, ratios A/B per pair)."""
    t = _common.interleaved({"a": fa, "b": fb}, repeats, warmup=warmup, clock=CLOCK)
    return t["a"], t["b"], _common.ratios(t["a"], t["b"])


def copy_cost(args):
    """What making the q/k/v and gate/up kernels side by side at every call costs a forward
    without autograd (eval, ``--B`` x ``--N`` tokens): the forward as it runs (which copies
    them once), paired with the same forward followed by the same copies once more; the
    ratio less 1 is the copies' share of the forward."""
    print("\n| model | forward (median) | forward + the copies again (median) | paired ratio (median) |")
    print("|---|---|---|---|")
    for kind in args.models:
        ta, tb, rat = _copy_cost_one(kind, args)
        print(f"| {kind} | {statistics.median(ta) * 1e3:.1f} ms | {statistics.median(tb) * 1e3:.1f} ms | "
              f"{statistics.median(rat):.3f} |")


def side_by_side_copies(model):
    """A function making, for every layer, the copies the no-grad forward makes: the q/k/v
    kernels side by side and their biases, and the gate and up kernels (and biases) where the
    feed-forward is gated; from the controls' pieces (one per layer)."""
    a, f = model.attention, model.ffn
    kernels, biases = [(a.WQ, a.WK, a.WV)], [(a.bQ, a.bK, a.bV)]
    if getattr(f, "W_up", None) is not None:
        kernels.append((f.W1, f.W_up))
        biases.append((getattr(f, "b1", None), getattr(f, "b_up", None)))
    biases = [tuple(c for c in g if c is not None) for g in biases]
    layers = len(a.WQ.pieces)

    def copies():
        for i in range(layers):
            for g in kernels:
                rows = g[0].pieces[i].shape[0]
                torch.cat([c.pieces[i].reshape(rows, -1) for c in g], 1)
            for g in biases:
                if g:
                    torch.cat([c.pieces[i].reshape(-1) for c in g])

    return copies


def _copy_cost_one(kind: str, args):
    model = from_hf(build(kind, args.vocab))
    ids = torch.randint(0, args.vocab, (args.B, args.N), generator=torch.Generator().manual_seed(1))
    copies = side_by_side_copies(model)

    def forward(again=False):
        with torch.no_grad():
            model(ids)
            if again:
                copies()

    return paired(forward, lambda: forward(True), args.repeats, args.warmup)


def decode_cost(sizes, repeats: int, vocab: int):
    """Median time of one decode step against the cached context length."""
    import math

    from opsplit.models import AttentionDecoder, TokenClassifier
    from opsplit.operators import KVCache

    models = {}
    for att in ("softmax", "sliced_relu", "sliced_bump"):
        gen = torch.Generator().manual_seed(0)
        enc = AttentionDecoder(64, 4, 128, attention=att, n_steps=2, causal=True, generator=gen)
        models[f"AttentionDecoder {att}"] = TokenClassifier(256, 256, enc, generator=gen).eval()
    models["converted Llama (benchmark model)"] = from_hf(build("llama", vocab))
    print("\n| model | " + " | ".join(f"n = {n}" for n in sizes) + " | exponent (fit) | exponent (last two) |")
    print("|---|" + "---|" * (len(sizes) + 2))
    for name, m in models.items():
        V = 256 if "Attention" in name else vocab
        ms = []
        for n in sizes:
            ids = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(n))
            small = KVCache()
            with torch.no_grad():
                m.next_token_logits(ids, cache=small)
                # a cache of n tokens: every entry of the 8-token prompt repeated (the step's cost does
                # not depend on the cached values; an n-token prompt through softmax attention costs n^2)
                cache = KVCache()
                cache.begin()
                for op, t, tensors, dim in small.entries():
                    cache.update(op, t, *(x.repeat(*[n // 8 if i == dim else 1 for i in range(x.dim())])
                                          for x in tensors), dim=dim)
                tok = ids[:, -1:]
                # what generate runs after the prompt: DecoderLM.decode_steps (controls evaluated
                # once, no per-step checks), else next_token_logits without the value checks
                if hasattr(m, "decode_steps"):
                    step = m.decode_steps(cache)
                else:
                    def step(t, p, _, m=m, cache=cache):
                        return m.next_token_logits(t, position_ids=p, cache=cache, check_values=False)
                times = []
                for k in range(repeats + 1):
                    pos = torch.tensor([[n + k]])
                    t0 = time.perf_counter()
                    step(tok, pos, None)
                    times.append(time.perf_counter() - t0)
            ms.append(statistics.median(times[1:]) * 1e3)
        slope = _common.loglog_slope(sizes, ms)
        last = math.log(ms[-1] / ms[-2]) / math.log(sizes[-1] / sizes[-2])
        print(f"| {name} | " + " | ".join(f"{t:.2f} ms" for t in ms) + f" | {slope:.2f} | {last:.2f} |")


def measure(kind: str, args) -> list:
    """The paired timings of one model (rows of the table)."""
    rows = []
    hf = build(kind, args.vocab)
    ours = from_hf(hf)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.B, args.N), generator=g)
    with torch.no_grad():
        r, o = hf(input_ids=ids).logits, ours(ids).logits
    err = float((r - o).abs().max() / r.abs().max())
    assert err < 1e-4, f"{kind}: the two models differ by {err}"

    if "forward" not in args.skip:
        def fwd_hf():
            with torch.no_grad():
                hf(input_ids=ids)

        def fwd_ours():
            with torch.no_grad():
                ours(ids)

        ta, tb, rat = paired(fwd_ours, fwd_hf, args.repeats, args.warmup)
        rows.append((kind, f"forward {args.B}x{args.N}", ta, tb, rat, "time", 1.05))

    if "backward" not in args.skip:
        hf.train()
        ours.train()

        def fb(model, call):
            def run():
                model.zero_grad(set_to_none=True)
                call().square().mean().backward()
            return run

        ta, tb, rat = paired(fb(ours, lambda: ours(ids).logits), fb(hf, lambda: hf(input_ids=ids).logits),
                             args.repeats, args.warmup)
        rows.append((kind, f"forward+backward {args.B}x{args.N}", ta, tb, rat, "time", 1.05))
        hf.eval()
        ours.eval()

    if "generate" not in args.skip:
        prompt = torch.randint(3, args.vocab, (args.gen_B, args.prompt), generator=g)
        a = ours.generate(prompt, args.new, eos_token_id=None)
        b = hf.generate(prompt, max_new_tokens=args.new, do_sample=False, eos_token_id=None, pad_token_id=0)
        same = torch.equal(a, b)
        n_tok = args.gen_B * args.new
        ta, tb, rat = paired(lambda: ours.generate(prompt, args.new, eos_token_id=None),
                             lambda: hf.generate(prompt, max_new_tokens=args.new, do_sample=False,
                                                 eos_token_id=None, pad_token_id=0),
                             args.repeats, args.warmup)
        rows.append((kind, f"generate B={args.gen_B}, {args.prompt}+{args.new} tokens"
                     + ("" if same else " (tokens differ!)"), [n_tok / t for t in ta], [n_tok / t for t in tb],
                     [b_ / a_ for a_, b_ in zip(ta, tb)], "tokens/s", 0.95))
    return rows


def exactness() -> None:
    """The worst differences to HF over the configurations of ``tests/test_llm_hf.py`` (its
    ``CASES``: 8 GPT-2, 8 Llama, 3 Qwen2, 1 Mistral; batch 3 x 9 with a left-padded mask; eval
    mode): logits relative to the largest logit, and gradients of the test's seeded linear
    functional relative to the largest entry of each parameter's gradient, in float32 and
    float64.  In float32 it prints too how far HF's and opsplit's float32 gradients lie from
    HF's float64 gradient of the same model (the test's referee where opsplit and HF differ by
    more than 1e-5)."""
    from opsplit.analysis.hf_cases import build, left_padded
    from opsplit.models import hf_state_dict

    cases = ([("gpt2", s) for s in range(8)] + [("llama", s) for s in range(8)] + [("qwen2", s) for s in range(3)]
             + [("mistral", 0)])

    def grads(model, ids, mask, w, ours):
        out = model(ids, mask) if ours else model(input_ids=ids, attention_mask=mask)
        (out.logits * w.to(out.logits.dtype)).sum().backward()
        if ours:
            return out.logits.detach(), hf_state_dict(model, grads=True)
        return out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}

    def rel(a, b, scale):
        return float((a.double() - b.double()).abs().max()) / scale if scale else 0.0

    worst: dict = {}
    for fam, seed in cases:
        truth = None
        for dtype in (torch.float64, torch.float32):
            hf = build(fam, seed, dtype=dtype)
            ours = from_hf(hf)
            ids, mask = left_padded(hf.config.vocab_size, 3, 9, seed)
            w = torch.randn((3, 9, hf.config.vocab_size), generator=torch.Generator().manual_seed(seed),
                            dtype=torch.float64)
            r, g_hf = grads(hf, ids, mask, w, False)
            o, g_ours = grads(ours, ids, mask, w, True)
            e_logits = rel(o, r, float(r.abs().max()))
            e_grad = max(rel(g_ours[n], g, float(g.abs().max())) for n, g in g_hf.items())
            if dtype == torch.float64:
                truth = g_hf
                e_hf = e_own = 0.0
            else:
                e_hf = max(rel(g, truth[n], float(truth[n].abs().max())) for n, g in g_hf.items())
                e_own = max(rel(g_ours[n], truth[n], float(truth[n].abs().max())) for n in g_hf)
            key = (fam, str(dtype).replace("torch.", ""))
            old = worst.get(key, (0.0, 0.0, 0.0, 0.0, None, None))
            worst[key] = (max(old[0], e_logits), max(old[1], e_grad), max(old[2], e_hf), max(old[3], e_own),
                          seed if e_logits >= old[0] else old[4], seed if e_grad >= old[1] else old[5])
    n = {f: sum(1 for c, _ in cases if c == f) for f, _ in cases}
    print("| model (configs) | dtype | logits (worst seed) | gradients (worst seed) | float32 gradients vs "
          "float64: HF / opsplit | tolerance |")
    print("|---|---|---|---|---|---|")
    for (fam, dt), (el, eg, eh, eo, sl, sg) in worst.items():
        tol = "1e-5" if dt == "float32" else "1e-10"
        ref = f"{eh:.1e} / {eo:.1e}" if dt == "float32" else "-"
        print(f"| {fam} ({n[fam]}) | {dt} | {el:.1e} ({sl}) | {eg:.1e} ({sg}) | {ref} | {tol} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--models", nargs="+", default=["llama", "gpt2"], choices=["llama", "gpt2"])
    _common.options(ap, repeats=9, warmup=2, B=8, N=256, vocab=2048, gen_B=1, prompt=32, new=64,
                    sizes=[1024, 4096, 16384, 65536])
    ap.add_argument("--skip", nargs="*", default=[], choices=["forward", "backward", "generate"])
    _common.switches(
        ap, decode_cost="time one decode step against the cached context length (--sizes) instead",
        copy_cost="time the no-grad forward (which copies the kernels side by side) against the same forward "
                  "followed by the same copies once more",
        exactness="print the worst differences to HF (logits, gradients) over the configurations of "
                  "tests/test_llm_hf.py instead of timing",
        cpu_time="time with the process's CPU time (time.process_time) instead of the wall clock: on a loaded "
                 "machine, the work each side does, without the time spent waiting for a core")
    args = ap.parse_args(argv)
    import transformers

    _common.threads(args.threads)
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, repeats {args.repeats}, "
          f"{'CPU time' if args.cpu_time else 'wall clock'}")
    if args.decode_cost:
        decode_cost(args.sizes, args.repeats, args.vocab)
        return
    if args.exactness:
        exactness()
        return
    if args.copy_cost:
        copy_cost(args)
        return
    rows = []
    for kind in args.models:
        rows += measure(kind, args)
    print()
    print("| model | measurement | opsplit (median) | HF (median) | paired ratio opsplit/HF (median) | target | met |")
    print("|---|---|---|---|---|---|---|")
    for kind, what, ta, tb, rat, unit, target in rows:
        ma, mb, mr = statistics.median(ta), statistics.median(tb), statistics.median(rat)
        if unit == "time":
            fa, fb_, tgt, ok = f"{ma * 1e3:.1f} ms", f"{mb * 1e3:.1f} ms", f"<= {target}", mr <= target
        else:
            fa, fb_, tgt, ok = f"{ma:.0f} tok/s", f"{mb:.0f} tok/s", f">= {target}", mr >= target
        print(f"| {kind} | {what} | {fa} | {fb_} | {mr:.3f} | {tgt} | {'yes' if ok else 'MISSED'} |")


if __name__ == "__main__":
    main()
