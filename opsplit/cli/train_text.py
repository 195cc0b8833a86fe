"""``opsplit train`` with ``task = "text"``: a character-level GPT (:class:`~opsplit.models.DecoderLM`,
learned positions, pre-LayerNorm, GELU feed-forward, tied read-out; softmax or causal sliced
ReLU attention, Lie or Strang splitting) trained as an optimal-control problem on text that
ships with Python (:func:`opsplit.data.load_text`), then evaluated at other N_t and sampled.

The run folder holds what ``opsplit generate`` needs: ``config.toml`` (``task = "text"``),
``vocab.json`` (the training split's characters) and the trainer's checkpoints under
``train/``.  Resumable like the digits task (``opsplit train --resume FOLDER``)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from . import train as _digits
from .budget import Estimate
from .config import TOP, ConfigError, Field, at_least, positive, seed_field

NAME = "train"
SUMMARY = _digits.SUMMARY
EXAMPLE = """\
examples:
  opsplit train --config text.toml --out runs/text
  opsplit generate runs/text --prompt "The " --n-t 8

text.toml:
  task = "text"           # a character-level GPT on pydoc_data.topics (data.corpus)
  [model]
  context = 256
  d_model = 128
  layers = 4              # control pieces on [0, T], T = layers; N_t = layers is GPT-2's stack
  attention = "softmax"   # softmax or sliced_relu
  scheme = "lie"          # lie, strang or parallel (both terms from the same state)
  [train]
  steps = 150
  n_steps = [2, 4, 8]     # N_t of training: one value, or several (one drawn per step)
  solvers = ["euler", "heun"]   # substep solvers of training (one drawn per step)
  solvers_weights = [3, 1]      # their weights ("cost": each the same compute; "uniform")
  solvers_split = true          # each batch shared between them by the weights (no draw)
  kinetic = 0.1                 # the flow's relative kinetic energy (docs/continuity.md)
"""

ATTENTIONS = ("softmax", "sliced_relu")
SCHEMES = ("lie", "strang", "parallel")
GRADIENTS = ("backprop", "checkpoint")
CORPORA = ("pydoc_topics", "stdlib", "pydoc_docstrings")
VOCAB = "vocab.json"
#: the smallest sampling temperature: below it the float32 logits divided by it leave one
#: character with all the probability (or overflow), i.e. the most likely one (--greedy)
MIN_TEMPERATURE = 1e-6
#: the keys that fix which characters a text run trains on (TrainConfig.extra: recorded in
#: the run's checkpoints; an edit is refused on --resume like one of train.lr)
DATA_KEYS = ("data.corpus", "data.val_fraction", "data.split_seed", "data.max_chars")
#: the TrainConfig fields a resume compares -> the config keys that set them
RUN_KEYS = {"lr": "train.lr", "weight_decay": "train.weight_decay", "warmup_steps": "train.warmup_steps",
            "seed": "train.seed", "batch_size": "train.batch_size", "epochs": "train.steps",
            "max_steps": "train.steps", "train_n_steps": "train.n_steps", "train_solvers": "train.solvers",
            "train_solvers_weights": "train.solvers_weights", "train_solvers_split": "train.solvers_split",
            "train_solvers_split_weights": "train.solvers_split_weights"}

SCHEMA = {
    TOP: {"task": Field("str", "text", "the training task: digits (a ViT on the bundled digits) or text "
                        "(a character-level GPT)", choices=_digits.TASKS)},
    "model": {
        "context": Field("int", 256, "characters per window (the learned positions)", at_least(2)),
        "d_model": Field("int", 128, "embedding size N_y", at_least(1)),
        "heads": Field("int", 4, "attention heads (softmax: a divisor of d_model)", at_least(1)),
        "layers": Field("int", 4, "control pieces on [0, T], T = layers (N_t = layers: dt = 1)", at_least(1)),
        "attention": Field("str", "softmax", "the attention term", choices=ATTENTIONS),
        "scheme": Field("str", "lie", "the splitting of attention and feed-forward", choices=SCHEMES),
        "seed": seed_field("seed of the initial weights"),
    },
    "train": {
        "steps": Field("int", 150, "optimizer steps (one window batch each)", at_least(1)),
        "batch_size": Field("int", 16, "windows per step", at_least(1)),
        "lr": Field("float", 3e-3, "peak learning rate (AdamW, warm-up then cosine to a tenth)", positive),
        "weight_decay": Field("float", 0.0, "AdamW weight decay", at_least(0)),
        "warmup_steps": Field("int", 15, "linear warm-up steps", at_least(0)),
        "n_steps": Field("int_list", [4], "N_t of training: one value, or several (each step draws one: "
                         "TrainConfig.train_n_steps)", at_least(1)),
        "solvers": Field("str_list", ["euler"], "substep solvers of training: ['euler'] (the model's own), or "
                         "several (each step draws one: TrainConfig.train_solvers)",
                         choices=("euler", "heun", "rk4")),
        "solvers_weights": Field("weights", "cost", "how train.solvers are drawn: cost (probability "
                                 "proportional to 1/stages: each solver the same compute), uniform, or one "
                                 "positive weight per solver"),
        "solvers_split": Field("bool", False, "share every batch between train.solvers (each its share of the "
                               "windows by train.solvers_weights, the objective the mean over all) instead of "
                               "drawing one per step: TrainConfig.train_solvers_split"),
        "solvers_split_weights": Field("split_weights", "shares", "with solvers_split, the objective's weight of "
                                       "each solver's part: shares (each its share of the windows: the mean over "
                                       "the batch) or one positive weight per solver, normalised "
                                       "(TrainConfig.train_solvers_split_weights)"),
        "kinetic": Field("float", 0.0, "weight of the flow's relative kinetic energy (a running cost that makes "
                         "the flow easy to solve; docs/continuity.md)", at_least(0)),
        "acceleration": Field("float", 0.0, "weight of the flow's relative acceleration", at_least(0)),
        "gradient": Field("str", "backprop", "how the gradient of J is computed", choices=GRADIENTS),
        "save_every": Field("int", 50, "checkpoint every this many steps (for --resume)", at_least(1)),
        "seed": seed_field("seed of the training windows and the trainer"),
        "eval_n_steps": Field("int_list", [1, 2, 4, 8, 16], "N_t at which the trained model is evaluated "
                              "on the validation split", at_least(1)),
    },
    "data": {
        "corpus": Field("str", "pydoc_topics", "text that ships with Python", choices=CORPORA),
        "val_fraction": Field("float", 0.1, "held-out share of the characters (whole documents)",
                              lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
        "split_seed": seed_field("seed of the split by document"),
        "max_chars": Field("int", 0, "use the first documents up to this many characters (0: all; "
                           "pydoc_docstrings: caps the docstrings, the topics stay whole)", at_least(0)),
        "eval_windows": Field("int", 0, "validation windows evaluated (0: all)", at_least(0)),
    },
    "generate": {
        "prompt": Field("str", "The ", "the prompt of the samples in the report", lambda v: None if v else
                        "a non-empty string"),
        "max_new_tokens": Field("int", 200, "characters sampled after the prompt", at_least(0)),
        "temperature": Field("float", 0.8, "sampling temperature", lambda v: None if v >= MIN_TEMPERATURE else
                             f"a temperature >= {MIN_TEMPERATURE:g} (smaller ones overflow the float32 logits or "
                             f"sample the most likely character)"),
        "seed": seed_field("seed of the sampling"),
    },
}


def add_arguments(p):  # the parser of `opsplit train` is the digits task's (same flags)
    _digits.add_arguments(p)


def overrides(a) -> dict:
    _digits.no_allow_changes(a)
    if a.epochs is not None:
        raise ConfigError(f"--epochs: the text task trains for train.steps optimizer steps (windows are drawn, "
                          f"not passed over); set train.steps in the config, got --epochs {a.epochs}")
    return {"train.n_steps": None if a.n_steps is None else [a.n_steps], "model.scheme": a.scheme,
            "train.gradient": a.gradient}


check_resume = _digits.check_resume
check_new_folder = _digits.check_new_folder


def check(cfg) -> None:
    """The cross-key checks (no corpus read, no model built)."""
    m, d, g, t = cfg["model"], cfg["data"], cfg["generate"], cfg["train"]
    if cfg[TOP]["task"] != "text":
        raise ConfigError(f"task: expected 'text' for this schema, got {cfg[TOP]['task']!r}")
    if m["attention"] == "softmax" and m["d_model"] % m["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.d_model = {m['d_model']} (softmax heads "
                          f"split the features), got {m['heads']}")
    _digits.check_distinct(t, ("n_steps", "solvers"))
    w = t["solvers_weights"]
    if isinstance(w, list) and len(w) != len(t["solvers"]):
        raise ConfigError(f"train.solvers_weights: expected 'cost', 'uniform' or one weight per solver of "
                          f"train.solvers = {t['solvers']}, got {w}")
    _digits.check_solvers_split(t, "solvers", "solvers_weights", t["batch_size"], ["euler"])
    _digits.check_flow_costs(t, ("kinetic", "acceleration"))
    if d["max_chars"] == 1:
        raise ConfigError("data.max_chars: expected 0 (all) or at least 2 characters, got 1")
    if len(g["prompt"]) + g["max_new_tokens"] > m["context"]:
        raise ConfigError(
            f"generate.max_new_tokens: the prompt ({len(g['prompt'])} characters) and {g['max_new_tokens']} new "
            f"characters exceed model.context = {m['context']} (the learned positions); expected at most "
            f"{max(0, m['context'] - len(g['prompt']))}")


# -- the cost guard -------------------------------------------------------------------------------
def forward_flops(m: dict, n_steps: int, tokens: int | None = None, vocab: int = 110) -> tuple[float, float]:
    """``(flops, calls)`` of one window's forward pass at N_t = ``n_steps``: per step the
    attention term (softmax: Q, K, V, output projections and the causal scores; sliced: the
    Q, K kernels, the MLP projection, one value kernel per head and the sorted prefix sums) —
    twice for Strang —
    and the feed-forward term (4 d_model hidden), then the tied read-out."""
    N, d, h = tokens or m["context"], m["d_model"], m["heads"]
    if m["attention"] == "softmax":
        attn = 8.0 * N * d * d + 2.0 * N * N * d  # causal: half of the N^2 scores and sums
    else:  # + the blocked prefix sums of the causal sliced kernel: ~200 N H d (FlopCounterMode, N = 32..1024)
        attn = 8.0 * N * d * d + 2.0 * N * h * d * d + 200.0 * N * h * d
    ffn = 16.0 * N * d * d
    twice = 2 if m["scheme"] == "strang" else 1
    per_step = twice * attn + ffn
    calls = twice + 1
    return n_steps * per_step + 2.0 * N * d * vocab, float(n_steps * calls)


def decode_flops(m: dict, n_steps: int, n: int, vocab: int = 110) -> tuple[float, float]:
    """``(flops, calls)`` of one decode step with the key/value cache holding up to ``n``
    tokens: the new token through every step, and its attention over the cache per
    attention substep (softmax: 4 n d; sliced: the sorted runs of
    :class:`~opsplit.functional.SlicedDecodeCache`, a search and a table row per run and the
    unsorted tail of at most 32 keys, ~(8 log2 n + 128) d per head)."""
    f, c = forward_flops(m, n_steps, tokens=1, vocab=vocab)
    twice, d = 2 if m["scheme"] == "strang" else 1, m["d_model"]
    per = 4.0 * n * d if m["attention"] == "softmax" else m["heads"] * (8.0 * math.log2(n + 2) + 128.0) * d
    return f + n_steps * twice * per, c


def cache_bytes(m: dict, n_steps: int, n: int) -> float:
    """Bytes of the key/value cache of ``n`` tokens at N_t = ``n_steps`` (float32; buffers
    of geometric capacity: twice the content): softmax keys and values, 8 d bytes per token
    and attention substep; sliced sorted runs, H (5 d + 22) (docs/sliced_causal.md)."""
    twice, d = 2 if m["scheme"] == "strang" else 1, m["d_model"]
    per = 8.0 * d if m["attention"] == "softmax" else m["heads"] * (5.0 * d + 22.0)
    return 2.0 * n_steps * twice * n * per


def _corpus_chars(corpus: str, max_chars: int) -> int:
    from ..data import corpus_chars

    return corpus_chars(corpus, max_chars or None)


def estimate(cfg) -> Estimate:
    """Training (forward and backward: 3 forward passes' flops), the evaluations at
    ``eval_n_steps`` on the validation windows of the corpus (its real size:
    :func:`opsplit.data.corpus_chars`), and the sampled characters (one decode step each
    with the key/value cache: :func:`decode_flops`); memory: the corpus (its string and ids
    while it is encoded), the training windows (``steps x batch_size`` of ``context + 1``
    ids, three int64 copies while they are cut), parameters with gradients and AdamW state,
    and the activations of a batch."""
    m, t, d, g = cfg["model"], cfg["train"], cfg["data"], cfg["generate"]
    N, dm = m["context"], m["d_model"]
    mean_n = sum(t["n_steps"]) / len(t["n_steps"])
    if t["solvers"] != ["euler"]:  # the mean field evaluations per substep of the drawn solvers
        from ..control.resolution import expected_stages

        mean_n *= expected_stages(t["solvers"], _digits.draw_weights(t["solvers_weights"]))
    fwd, calls = forward_flops(m, 1)
    work = Estimate(t["steps"] * t["batch_size"] * 3 * fwd * mean_n, t["steps"] * 3 * calls * mean_n)
    chars = _corpus_chars(d["corpus"], d["max_chars"])
    windows = max(1, int(chars * d["val_fraction"]) // N)
    if d["eval_windows"]:
        windows = min(windows, d["eval_windows"])
    for n in t["eval_n_steps"]:
        f_n, c_n = forward_flops(m, n)
        work += Estimate(windows * f_n, math.ceil(windows / 64) * c_n)
    for n in t["eval_n_steps"]:  # one sample per N_t
        per = decode_flops(m, n, len(g["prompt"]) + g["max_new_tokens"])
        work += Estimate(g["max_new_tokens"] * per[0], g["max_new_tokens"] * per[1])
    twice = 2 if m["scheme"] == "strang" else 1
    sliced = m["attention"] != "softmax"
    params = m["layers"] * ((2 + m["heads"] + 2) * dm * dm if sliced else 4 * dm * dm) + m["layers"] * 8 * dm * dm \
        + (N + 110) * dm
    act = t["batch_size"] * max(t["n_steps"]) * N * dm * (twice * (12 + (4 * m["heads"] if sliced else 0)) + 12)
    data = 24.0 * chars + 24.0 * t["steps"] * t["batch_size"] * (N + 1)
    return Estimate(work.flops, work.calls, data + 4.0 * (4.0 * params + act))


# -- the job --------------------------------------------------------------------------------------
def corpus_of(d: dict):
    from ..data import load_text

    try:
        return load_text(d["corpus"], val_fraction=d["val_fraction"], seed=d["split_seed"],
                         max_chars=d["max_chars"] or None)
    except RuntimeError as e:  # a Python without the corpus
        raise ConfigError(f"data.corpus: {e}") from None
    except ValueError as e:  # too small a corpus to split
        raise ConfigError(f"data: {e}") from None


def decoder_config(m: dict, vocab_size: int):
    from ..models import DecoderConfig

    softmax = m["attention"] == "softmax"
    try:
        return DecoderConfig(vocab_size=vocab_size, d_model=m["d_model"], n_layers=m["layers"], n_heads=m["heads"],
                             d_ff=4 * m["d_model"], norm="layer", norm_eps=1e-5, norm_bias=True, mlp="plain",
                             activation="gelu", positions="learned", max_positions=m["context"], qkv_bias=softmax,
                             out_bias=softmax, mlp_bias=True, tie_embeddings=True, attention=m["attention"],
                             scheme=m["scheme"])
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model: {e}") from None


def build_model(m: dict, vocab_size: int):
    import torch

    from ..models import DecoderLM

    return DecoderLM(decoder_config(m, vocab_size), generator=torch.Generator().manual_seed(m["seed"]))


def lm_loss(logits, targets):
    """Mean next-character cross-entropy (nats) over every position of every window."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def windows(cfg, corpus):
    from ..data import TensorData, text_windows

    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    for name, ids in (("training", corpus.train), ("validation", corpus.val)):
        if ids.numel() < m["context"] + 1:
            raise ConfigError(f"model.context: a window of {m['context']} characters and its targets need "
                              f"{m['context'] + 1} characters, but the {name} split of {d['corpus']} has "
                              f"{ids.numel()}; expected a shorter context (or more data: data.max_chars)")
    train = text_windows(corpus.train, m["context"], t["steps"] * t["batch_size"], seed=t["seed"], name="train")
    val = text_windows(corpus.val, m["context"], name="validation")
    if d["eval_windows"] and d["eval_windows"] < len(val):
        val = TensorData(val.inputs[: d["eval_windows"]], val.targets[: d["eval_windows"]], name="validation")
    return train, val


def train_config(cfg, progress: bool = True):
    from ..control import TrainConfig

    m, t = cfg["model"], cfg["train"]
    multi = None if t["n_steps"] == [m["layers"]] else tuple(t["n_steps"])
    sol = None if t["solvers"] == ["euler"] else tuple(t["solvers"])
    weights = _digits.draw_weights(t["solvers_weights"]) if sol else None
    return TrainConfig(epochs=1, batch_size=t["batch_size"], lr=t["lr"], weight_decay=t["weight_decay"],
                       betas=(0.9, 0.99), schedule="cosine", warmup_steps=t["warmup_steps"], min_lr_ratio=0.1,
                       grad_clip=1.0, gradient=t["gradient"], seed=t["seed"], shuffle=False,
                       train_n_steps=multi, train_solvers=sol, train_solvers_weights=weights,
                       train_solvers_split=bool(sol and t["solvers_split"]),
                       train_solvers_split_weights=_digits.split_weights(t) if sol else None, save_every=t["save_every"],
                       progress=progress,
                       extra=_digits.data_settings(cfg, DATA_KEYS))


def objective(cfg):
    """The objective: the next-character cross-entropy and the flow costs of ``train.kinetic``
    and ``train.acceleration``."""
    from ..control import Objective

    t = cfg["train"]
    return Objective(lm_loss, output="logits", kinetic=t["kinetic"], acceleration=t["acceleration"])


def check_resumed(cfg, plan, folder: Path, allow=None) -> None:
    """``--resume``: the folder's checkpoint against this config, before anything is
    written (:func:`opsplit.cli.train.check_checkpoint`); one step per ``batch_size``
    windows."""
    from ..control import Trainer

    trainer = Trainer(plan["model"], objective(cfg), train_config(cfg, progress=False))
    _digits.check_checkpoint(plan, folder, allow, trainer=trainer, total_steps=cfg["train"]["steps"],
                             run_keys=RUN_KEYS, data_keys=DATA_KEYS)


def prepare(cfg) -> dict:
    """The library's own checks: the corpus loads and splits, the prompt's characters are in
    the vocabulary, the windows fit, the model is built and gives finite logits."""
    import torch

    from ..control.gradients import restore_gradient_mode, set_gradient_mode

    corpus = corpus_of(cfg["data"])
    try:
        corpus.vocab.check(cfg["generate"]["prompt"], "generate.prompt")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    train, val = windows(cfg, corpus)
    model = build_model(cfg["model"], corpus.vocab.size)
    try:
        restore_gradient_mode(set_gradient_mode(model, cfg["train"]["gradient"]))
        train_config(cfg, progress=False)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"train: {e}") from None
    with torch.no_grad():
        out = model.eval()(train.inputs[:2]).logits
    model.train()
    if not bool(torch.isfinite(out).all()):
        raise ConfigError("model: the untrained model's logits on two windows are not finite")
    return {"model": model, "corpus": corpus, "train": train, "val": val}


class _BitsBar:
    """The progress bar of a text run: the training loss in bits per character (the unit of
    the report), from the trainer's history at the start of every step (the trainer's own
    bar shows the objective, in nats)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar, self.trainer = total, enabled, None, None

    def update(self) -> None:
        from ..data import bits_per_char

        if not self.enabled or self.trainer is None:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.trainer.step, desc="train", leave=False,
                            dynamic_ncols=True)
        self.bar.update(self.trainer.step - self.bar.n)
        steps = self.trainer.history.steps
        if steps:
            self.bar.set_postfix_str(f"loss={bits_per_char(steps[-1]['loss']):.4g} bits/char", refresh=False)

    def wrap(self, hook):
        def f(x, g):
            self.update()
            return hook(x, g)

        return f

    def close(self) -> None:
        if self.bar is not None:
            self.update()
            self.bar.close()


def fit(cfg, plan, folder: Path, progress: bool):
    from ..control import Trainer
    from ..control.checkpoint import latest_checkpoint

    stop = _digits._InterruptAtStepEnd()
    bar = _BitsBar(cfg["train"]["steps"], progress)
    trainer = Trainer(plan["model"], objective(cfg), train_config(cfg, False),
                      augment=bar.wrap(stop.wrap(None)))
    bar.trainer = trainer
    folder.mkdir(parents=True, exist_ok=True)
    resume = folder if latest_checkpoint(folder) is not None else None
    try:
        with stop:
            history = trainer.fit(plan["train"], None, out_dir=folder, resume=resume,
                                  allow_changes=plan.get("allow_changes", False))
    except _digits._StopHere:
        path = trainer.save(folder / "checkpoints" / f"step-{trainer.step:08d}")
        raise _digits.Interrupted(trainer.step, path) from None
    except KeyboardInterrupt:
        raise _digits.Interrupted(trainer.step, latest_checkpoint(folder), at_once=True) from None
    finally:
        bar.close()
    if stop.requested:
        raise _digits.Interrupted(trainer.step, latest_checkpoint(folder))
    return trainer, history, resume is not None


def run(cfg, plan, out, progress=True):
    import time

    import matplotlib.pyplot as plt
    import torch

    from ..data import bits_per_char

    m, t, g = cfg["model"], cfg["train"], cfg["generate"]
    corpus, model, val = plan["corpus"], plan["model"], plan["val"]
    (out.folder / VOCAB).write_text(json.dumps(corpus.vocab.to_dict()))
    try:
        trainer, history, resumed = fit(cfg, plan, out.folder / "train", progress)
    except _digits.Interrupted as e:
        e.folder = out.folder
        raise
    prompt = corpus.vocab.encode(g["prompt"], name="generate.prompt")[None]
    rows, samples = [], []
    with _digits.resumable_after_training(trainer, out.folder, "train"):
        for n in t["eval_n_steps"]:
            bpc = bits_per_char(trainer.evaluate(val, n_steps=n)["loss"])
            model.eval()
            gen = torch.Generator().manual_seed(g["seed"])
            t0 = time.perf_counter()
            ids = model.generate(prompt, g["max_new_tokens"], do_sample=True, temperature=g["temperature"],
                                 generator=gen, use_cache=True, n_steps=n)
            rate = g["max_new_tokens"] / max(time.perf_counter() - t0, 1e-9)
            rows.append({"n_t": n, "dt": m["layers"] / n, "val_bits_per_char": bpc, "gen_chars_per_s": rate,
                         "trained_at": "yes" if n in t["n_steps"] else ""})
            samples.append((n, corpus.vocab.decode(ids[0])))
    out.heading("Training a character-level GPT")
    out.text(
        f"A character-level GPT as an optimal-control problem: opsplit.models.DecoderLM (learned positions, "
        f"pre-LayerNorm, {m['attention']} attention, GELU feed-forward, tied read-out; {m['scheme']} splitting, "
        f"{m['layers']} control pieces on [0, {m['layers']}], d_model {m['d_model']}, {m['heads']} heads, context "
        f"{m['context']}) trained on {corpus.name} ({corpus.train.numel()} training characters in "
        f"{len(corpus.train_documents)} documents, {corpus.val.numel()} validation characters in "
        f"{len(corpus.val_documents)} documents, vocabulary {corpus.vocab.size}), AdamW, {trainer.step} steps of "
        f"{t['batch_size']} windows at N_t in {t['n_steps']}"
        + (f" with {'every batch shared between the substep solvers' if t['solvers_split'] else 'a substep solver drawn from'}"
           f" {t['solvers']} (weights: {t['solvers_weights']}"
           + (f"; the parts weighted {t['solvers_split_weights']} in the objective" if _digits.split_weights(t) else "")
           + ")" if t["solvers"] != ["euler"] else "")
        + "".join(f", {k} cost weight {t[k]:g}" for k in ("kinetic", "acceleration") if t[k])
        + (" (resumed from a checkpoint)" if resumed else "")
        + ". The controls are functions of t, so the model is evaluated and sampled at other N_t."
    )
    steps = history.steps
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    a1.plot([r["step"] for r in steps], [bits_per_char(r["loss"]) for r in steps], lw=0.8)
    a1.set_xlabel("optimizer step")
    a1.set_ylabel("training loss (bits / char)")
    a1.set_title("training curve")
    a2.semilogx([r["n_t"] for r in rows], [r["val_bits_per_char"] for r in rows], "o-", base=2)
    for n in t["n_steps"]:
        a2.axvline(n, color="gray", ls=":", lw=0.8)
    a2.set_xlabel("N_t at evaluation (dotted: trained at)")
    a2.set_ylabel("validation bits / char")
    a2.set_title("the trained model at other N_t")
    out.figure(fig, "text_training", "training loss per step; validation bits per character against N_t")
    out.table("eval_n_t", rows, title="validation bits per character and sampling speed at each N_t")
    out.link("train/curves.png", "the trainer's own plot of its history (opsplit.control)")
    for n, text in samples:
        out.text(f"Sample at N_t = {n} (seed {g['seed']}, temperature {g['temperature']:g}):")
        out.code(text)
    return trainer, history, rows


# -- `opsplit generate` reads a run folder -----------------------------------------------------
def run_config(folder):
    """``(cfg, vocab, checkpoint)`` of a finished or interrupted text training run in
    ``folder`` (its config.toml, vocab.json and the path of its latest checkpoint), checked;
    nothing is built or loaded."""
    from ..control.checkpoint import latest_checkpoint
    from ..data import CharVocab
    from .config import load, read_top

    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"folder: expected the output folder of an opsplit train run with task = \"text\", "
                          f"{str(folder)!r} is not a folder")
    kind = _digits.folder_kind(folder)
    if kind not in (None, _digits.NAME):
        what = "the default job" if kind == "default" else f"opsplit {kind}"
        raise ConfigError(f"folder: {str(folder)!r} holds the output of {what}; opsplit generate samples from a "
                          f"run of opsplit train with task = \"text\"")
    path = folder / "config.toml"
    if not path.is_file():
        raise ConfigError(f"folder: expected an opsplit train output folder (config.toml, vocab.json, "
                          f"checkpoints), {str(folder)!r} has no config.toml")
    task = read_top(path, "task", "digits")
    if task != "text":
        raise ConfigError(f"folder: {str(folder)!r} holds a training run with task = {task!r}; opsplit generate "
                          f"samples from a run with task = \"text\"")
    cfg = load(SCHEMA, path)
    try:
        vocab = CharVocab.from_dict(json.loads((folder / VOCAB).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"folder: {str(folder / VOCAB)!r} is missing or not a vocabulary ({e})") from None
    ckpt = latest_checkpoint(folder / "train")
    if ckpt is None:
        raise ConfigError(f"folder: {str(folder)!r} has no checkpoint under train/checkpoints (the run was "
                          f"stopped before its first one)")
    return cfg, vocab, ckpt


def load_model(cfg, vocab, ckpt):
    """The run's model with the weights of ``ckpt`` (every part checked: a checkpoint of
    another model, or with NaN/inf weights, is refused)."""
    from ..control.checkpoint import load_checkpoint

    model = build_model(cfg["model"], vocab.size)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_checkpoint(ckpt, model)
    except ValueError as e:
        raise ConfigError(f"folder: {_digits.without_api_advice(e)}") from None
    return model


def load_run(folder):
    """``(cfg, vocab, model)`` of a finished or interrupted text training run in ``folder``
    (its config.toml, vocab.json and latest checkpoint), every part checked."""
    cfg, vocab, ckpt = run_config(folder)
    return cfg, vocab, load_model(cfg, vocab, ckpt)


def check_n_t(n) -> int:
    if n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        return n
    raise ConfigError(f"--n-t: expected N_t >= 1 (time steps of the solve), got {n}")


def check_temperature(v, name: str = "--temperature") -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise ConfigError(f"{name}: expected a finite number > 0, got {v}")
    if v < MIN_TEMPERATURE:
        raise ConfigError(f"{name}: expected a temperature >= {MIN_TEMPERATURE:g}, got {v:g} (the float32 logits "
                          f"divided by it overflow or leave all the probability on the most likely character: "
                          f"for that, --greedy)")
    return float(v)


def generate_estimate(m: dict, vocab: int, prompt: int, new: int, n_t: int) -> Estimate:
    """``opsplit generate``: the prompt's forward pass (twice: the check of its logits and
    the generation's first step) and ``new`` decode steps with the key/value cache at N_t =
    ``n_t`` (:func:`decode_flops`); memory: the parameters, the controls evaluated at every
    step (the decode steps), the cache (keys and values of every attention substep) and
    the time grid."""
    d, n = m["d_model"], prompt + new
    f0, c0 = forward_flops(m, n_t, tokens=prompt, vocab=vocab)
    f0, c0 = 2 * f0, 2 * c0
    f1, c1 = decode_flops(m, n_t, n, vocab)
    params = m["layers"] * 14.0 * d * d + (m["context"] + vocab) * d
    held = 4.0 * (params + n_t * 14.0 * d * d) + cache_bytes(m, n_t, n)
    return Estimate(f0 + new * f1, c0 + new * c1, held + 32.0 * (n_t + 1))
