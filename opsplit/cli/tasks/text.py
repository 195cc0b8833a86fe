"""``opsplit train`` with ``task = "text"``: a character-level GPT (:class:`~opsplit.models.DecoderLM`,
learned positions, pre-LayerNorm, GELU feed-forward, tied read-out; softmax or causal sliced
ReLU attention, Lie, Strang or parallel splitting) trained as an optimal-control problem on
text that ships with Python (:func:`opsplit.data.load_text`), then evaluated at other N_t and
sampled.

The run folder holds what ``opsplit generate`` needs: ``config.toml`` (``task = "text"``),
``vocab.json`` (the training split's characters) and the trainer's checkpoints under
``train/``.  Resumable like the digits task (``opsplit train --resume FOLDER``)."""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ...analysis.ngram import NGram
from ...control import Callback, Trainer
from ...control.checkpoint import latest_checkpoint, load_checkpoint
from ...control.frontier import default_frontier_n_steps
from ...control.resolution import expected_stages
from ...data import CharVocab, TensorData, bits_per_char, corpus_chars, load_text, text_windows
from ...data.dedup import deduplicate
from ...models import DecoderConfig, DecoderLM
from ...models.decoder_lm import ATTENTION_KINDS, DECODER_SCHEMES
from ...models.nanogpt_init import INITS
from ...solvers import EXPLICIT_SOLVERS, solver_class
from .. import continuity_report, frontier_report
from ..budget import CALL_SECONDS, Estimate
from ..config import TOP, ConfigError, Field, at_least, both, distinct, load, read_top, seed_field
from . import base
from .base import Interrupted, check_new_folder, level_keys, objective_key, train_key

__all__ = ["SCHEMA", "RENAMED", "check", "estimate", "prepare", "run", "build_model", "forward_flops",
           "decode_flops", "cache_bytes", "lm_loss", "objective", "run_config", "load_model", "load_run",
           "check_n_t", "check_temperature", "generate_estimate", "VOCAB", "check_new_folder", "training_grid",
           "held_out", "DEDUP_K", "EVAL_BATCH"]

NAME = base.NAME
EXAMPLE = """\
text.toml:
  task = "text"           # a character-level GPT on pydoc_data.topics (data.corpus)
  [model]
  context = 256
  d_model = 128
  layers = 4              # control pieces on [0, T], T = layers; N_t = layers is GPT-2's stack
  attention = "softmax"   # softmax or sliced_relu
  scheme = "lie"          # lie, strang or parallel (both terms from the same state)
  [train]
  max_steps = 150
  n_steps = [2, 4, 8]     # N_t of training: one value, or several (one drawn per step)
  solvers = ["euler", "heun"]   # substep solvers of training (one drawn per step)
  solvers_weights = [3, 1]      # their weights ("cost": each the same compute; "uniform")
  solvers_split = true          # each batch shared between them by the weights (no draw)
  [objective]
  kinetic = 0.1                 # the flow's relative kinetic energy (docs/continuity.md)
"""

CORPORA = ("pydoc_topics", "stdlib", "pydoc_docstrings")
#: the gradient modes of the text model (it has no ODE substep for the adjoint to solve)
GRADIENTS = ("backprop", "checkpoint")
VOCAB = "vocab.json"
#: the smallest sampling temperature: below it the float32 logits divided by it leave one
#: character with all the probability (or overflow), i.e. the most likely one (--greedy)
MIN_TEMPERATURE = 1e-6
#: the characters sampled after the prompt when generate.max_new_tokens is not set, at most
#: the positions the prompt leaves (model.context - len(generate.prompt))
NEW_TOKENS = 200
#: the keys that fix which characters a text run trains on (TrainConfig.extra: recorded in
#: the run's checkpoints; an edit is refused on --resume like one of train.lr)
DATA_KEYS = ("data.corpus", "data.val_fraction", "data.split_seed", "data.max_chars")
#: the deduplicated validation text shares no substring of this many characters with the
#: training text (whole paragraphs removed: :func:`opsplit.data.dedup.deduplicate`)
DEDUP_K = 40
#: windows per forward call of the solver-swap table
EVAL_BATCH = 64
#: the n-gram baseline's fit: seconds per training character and order (Python counting;
#: 1.6 million characters at order 7 in 28 s on the 2-core development machine at load 6)
#: and bytes per training character and order (400 MB for the same fit)
NGRAM_SECONDS, NGRAM_BYTES = 2.5e-6, 40.0
#: the keys of an earlier version -> their names now (refused, naming the new one)
RENAMED = {"train.steps": "train.max_steps", "train.kinetic": "objective.kinetic",
           "train.acceleration": "objective.acceleration", "train.eval_n_steps": "eval.n_steps",
           "data.eval_windows": "eval.windows"}


def _new_tokens(cfg) -> int:
    return max(0, min(NEW_TOKENS, cfg["model"]["context"] - len(cfg["generate"]["prompt"])))


SCHEMA = {
    TOP: {"task": base.task_field("text", "the training task: digits (a ViT on the bundled digits), text "
                                  "(a character-level GPT) or burgers (a neural operator)")},
    "model": {
        "context": Field("int", 256, "characters per window (the learned positions)", at_least(2)),
        "d_model": Field("int", 128, "embedding size N_y", at_least(1)),
        "heads": Field("int", 4, "attention heads (softmax: a divisor of d_model)", at_least(1)),
        "layers": Field("int", 4, "control pieces on [0, T], T = layers (N_t = layers: dt = 1)", at_least(1)),
        "attention": Field("str", "softmax", "the attention term", choices=ATTENTION_KINDS),
        "scheme": Field("str", "lie", "the splitting of attention and feed-forward", choices=DECODER_SCHEMES),
        "init": Field("str", "gpt2", "initial weights: gpt2 (DecoderLM's: every weight normal with std 0.02) or "
                      "nanogpt (nanoGPT's: the residual projections' std 0.02 / sqrt(2 layers), drawn as "
                      "benchmarks/train_text.py's NanoGPT draws them; softmax attention)", choices=INITS),
        "seed": seed_field("seed of the initial weights"),
    },
    "train": {
        "max_steps": train_key("max_steps", 150, "optimizer steps (one window batch each)"),
        "batch_size": train_key("batch_size", 16, "windows per step"),
        "lr": train_key("lr", 3e-3, "peak learning rate (AdamW, warm-up then cosine to a tenth)"),
        "weight_decay": train_key("weight_decay", 0.0, "AdamW weight decay"),
        "warmup_steps": train_key("warmup_steps", 15),
        "n_steps": train_key("n_steps", [4], "N_t of training: one value, or several (each step draws one)"),
        "solvers": train_key("solvers", ["euler"], "substep solvers of training: ['euler'] (the model's own), or "
                             "several (each step draws one)"),
        "solvers_weights": train_key("solvers_weights", "cost", "how train.solvers are drawn: cost (probability "
                                     "proportional to 1/stages: each solver the same compute), uniform, or one "
                                     "positive weight per solver"),
        "solvers_split": train_key("solvers_split", False),
        "solvers_split_weights": train_key("solvers_split_weights", "shares"),
        **level_keys(),
        "gradient": train_key("gradient", "backprop", choices=GRADIENTS),
        "save_every": train_key("save_every", 50, "checkpoint every this many steps (for --resume)"),
        "seed": train_key("seed", 0, "seed of the training windows and the trainer"),
    },
    "objective": {
        "kinetic": objective_key("kinetic", 0.0, "weight of the flow's relative kinetic energy (a running cost "
                                 "that makes the flow easy to solve; docs/continuity.md)"),
        "acceleration": objective_key("acceleration", 0.0, "weight of the flow's relative acceleration"),
    },
    "eval": {
        "n_steps": Field("int_list", [1, 2, 4, 8, 16], "N_t at which the trained model is evaluated on the "
                         "validation split and on its deduplicated text (the solver-swap table)",
                         both(at_least(1), distinct)),
        "solvers": Field("str_list", ["heun", "rk4"], "substep solvers the trained model is also solved with on the "
                         "deduplicated validation text, at N_t >= the training grid (besides its own)", distinct,
                         choices=EXPLICIT_SOLVERS),
        "ngram_order": Field("int", 7, "order of the Kneser-Ney n-gram baseline fitted on the training text and "
                             "scored on the same validation texts (0: none)", at_least(0)),
        "windows": Field("int", 0, "validation windows evaluated, of the split and of its deduplicated text "
                         "(0: all)", at_least(0)),
    },
    "frontier": {
        "enabled": Field("bool", False, "after training, also solve the trained model at frontier.n_steps on the "
                         "deduplicated validation text (a step longer than a control piece reads the pieces' "
                         "average): bits per character against substep calls, the frontier table and plot "
                         "(docs/multilevel.md; models trained at one N_t alone: benchmarks/multilevel.py)"),
        "n_steps": Field("int_list", [2, 4, 8, 16], "N_t of the frontier (default: a quarter, half, one and two "
                         "times the training grid); those below model.layers divide it",
                         both(at_least(1), distinct),
                         derive=lambda cfg: _frontier_default(cfg)),
    },
    "data": {
        "corpus": Field("str", "pydoc_topics", "text that ships with Python", choices=CORPORA),
        "val_fraction": Field("float", 0.1, "held-out share of the characters (whole documents)",
                              lambda v: None if 0 < v < 1 else "a number in (0, 1)"),
        "split_seed": seed_field("seed of the split by document"),
        "max_chars": Field("int", 0, "use the first documents up to this many characters (0: all; "
                           "pydoc_docstrings: caps the docstrings, the topics stay whole)", at_least(0)),
    },
    "generate": {
        "prompt": Field("str", "The ", "the prompt of the samples in the report", lambda v: None if v else
                        "a non-empty string"),
        "max_new_tokens": Field("int", NEW_TOKENS, f"characters sampled after the prompt (default: {NEW_TOKENS}, "
                                "or the positions model.context leaves after the prompt when fewer)", at_least(0),
                                derive=_new_tokens),
        "temperature": Field("float", 0.8, "sampling temperature", lambda v: None if v >= MIN_TEMPERATURE else
                             f"a temperature >= {MIN_TEMPERATURE:g} (smaller ones overflow the float32 logits or "
                             f"sample the most likely character)"),
        "seed": seed_field("seed of the sampling"),
    },
}


def _frontier_default(cfg) -> list[int]:
    """frontier.n_steps when not given: a quarter, half, one and two times the training grid;
    ``[1]`` while train.n_steps is not yet a valid list (TrainConfig refuses it, naming the key)."""
    try:
        grid = training_grid(cfg)
    except (TypeError, IndexError, KeyError):
        grid = None
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        return [1]
    return default_frontier_n_steps(grid)


def overrides(a) -> dict:
    """The keys of ``opsplit train``'s flags."""
    if a.epochs is not None:
        raise ConfigError(f"--epochs: the text task trains for train.max_steps optimizer steps (windows are drawn, "
                          f"not passed over); set train.max_steps in the config, got --epochs {a.epochs}")
    return {"train.n_steps": None if a.n_steps is None else [a.n_steps], "model.scheme": a.scheme,
            "train.gradient": a.gradient}


def train_config(cfg, progress: bool = True):
    """The run's TrainConfig (:func:`opsplit.cli.tasks.base.train_config`): one pass over
    ``max_steps x batch_size`` drawn windows, AdamW (betas 0.9, 0.99) with a cosine schedule
    to a tenth, the gradient norm clipped to 1."""
    return base.train_config(cfg, SCHEMA, own={"n_steps": [cfg["model"]["layers"]], "solvers": ["euler"]},
                             fixed={"epochs": 1, "betas": (0.9, 0.99), "schedule": "cosine", "min_lr_ratio": 0.1,
                                    "grad_clip": 1.0, "shuffle": False},
                             progress=progress, extra=DATA_KEYS)


def lm_loss(logits, targets):
    """Mean next-character cross-entropy (nats) over every position of every window."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def objective(cfg):
    """The objective: the next-character cross-entropy and the flow costs of ``[objective]``
    (self-distillation, ``train.n_steps_distill``, by the KL divergence of the logits)."""
    return base.objective(cfg, lm_loss, output="logits", distill="kl")


def check(cfg) -> None:
    """The cross-key checks (no corpus read, no model built); the ``[train]`` and
    ``[objective]`` keys are checked by TrainConfig and Objective."""
    m, d, g = cfg["model"], cfg["data"], cfg["generate"]
    if cfg[TOP]["task"] != "text":
        raise ConfigError(f"task: expected 'text' for this schema, got {cfg[TOP]['task']!r}")
    if m["attention"] == "softmax" and m["d_model"] % m["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.d_model = {m['d_model']} (softmax heads "
                          f"split the features), got {m['heads']}")
    if m["init"] == "nanogpt" and m["attention"] != "softmax":
        raise ConfigError(f"model.init: 'nanogpt' initialises nanoGPT's softmax attention; with model.attention = "
                          f"{m['attention']!r} expected 'gpt2', got 'nanogpt'")
    train_config(cfg, progress=False)
    objective(cfg)
    if d["max_chars"] == 1:
        raise ConfigError("data.max_chars: expected 0 (all) or at least 2 characters, got 1")
    if len(g["prompt"]) > m["context"]:
        raise ConfigError(f"generate.prompt: a prompt of {len(g['prompt'])} characters exceeds model.context = "
                          f"{m['context']} (the learned positions); expected at most {m['context']} characters")
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


def estimate(cfg) -> Estimate:
    """Training (forward and backward: 3 forward passes' flops), the evaluations at
    ``eval.n_steps`` on the validation windows of the corpus (its real size:
    :func:`opsplit.data.corpus_chars`), and the sampled characters (one decode step each
    with the key/value cache: :func:`decode_flops`), the solver-swap table on the
    deduplicated validation text (bounded by the split's windows), the deduplication and the
    n-gram baseline's fit (Python work: :data:`NGRAM_SECONDS`); memory: the corpus (its
    string and ids while it is encoded), the training windows (``max_steps x batch_size`` of
    ``context + 1`` ids, three int64 copies while they are cut), parameters with gradients
    and AdamW state, and the activations of a batch — or, when larger, the training text's
    substrings of the deduplication or the n-gram's counts (:data:`NGRAM_BYTES`)."""
    m, t, e, d, g = cfg["model"], cfg["train"], cfg["eval"], cfg["data"], cfg["generate"]
    N, dm = m["context"], m["d_model"]
    mean_n = sum(t["n_steps"]) / len(t["n_steps"])
    if t["solvers"] != ["euler"]:  # the mean field evaluations per substep of the drawn solvers
        mean_n *= expected_stages(t["solvers"], t["solvers_weights"])
    fwd, calls = forward_flops(m, 1)
    work = Estimate(t["max_steps"] * t["batch_size"] * 3 * fwd * mean_n, t["max_steps"] * 3 * calls * mean_n)
    chars = corpus_chars(d["corpus"], d["max_chars"] or None)
    # the validation split: a share of the corpus (pydoc_docstrings: of its topics, the
    # docstrings join the training split only)
    val_chars = corpus_chars("pydoc_topics") if d["corpus"] == "pydoc_docstrings" else chars
    windows = max(1, int(val_chars * d["val_fraction"]) // N)
    if e["windows"]:
        windows = min(windows, e["windows"])
    for n in e["n_steps"]:
        f_n, c_n = forward_flops(m, n)
        work += Estimate(windows * f_n, math.ceil(windows / 64) * c_n)
    for n in e["n_steps"]:  # one sample per N_t
        per = decode_flops(m, n, len(g["prompt"]) + g["max_new_tokens"])
        work += Estimate(g["max_new_tokens"] * per[0], g["max_new_tokens"] * per[1])
    # the solver-swap table on the deduplicated text (at most the split's windows): the own
    # solver at eval.n_steps and at the outputs' levels (the training grid x 1 .. 16), each of
    # eval.solvers at the eval.n_steps from the training grid up
    ref = training_grid(cfg)
    own = set(e["n_steps"]) | {ref * k for k in (1, 2, 4, 8, 16)}
    runs = [(n, 1) for n in own] + [(n, solver_class(s).stages) for s in e["solvers"] for n in e["n_steps"]
                                    if n >= ref]
    if cfg["frontier"]["enabled"]:  # the trained model at every N_t of the frontier
        runs += [(n, 1) for n in cfg["frontier"]["n_steps"]]
    for n, k in runs:
        f_n, c_n = forward_flops(m, n)
        work += Estimate(k * windows * f_n, k * math.ceil(windows / EVAL_BATCH) * c_n)
    # the deduplication (a set of the training text's substrings) and the n-gram's counts:
    # Python work, counted in seconds as calls
    train_chars = chars * (1 - d["val_fraction"])
    held = 150.0 * train_chars
    work += Estimate(0.0, 1.5e-6 * train_chars / CALL_SECONDS)
    if e["ngram_order"]:
        work += Estimate(0.0, NGRAM_SECONDS * train_chars * e["ngram_order"] / CALL_SECONDS)
        held = max(held, NGRAM_BYTES * train_chars * e["ngram_order"])
    twice = 2 if m["scheme"] == "strang" else 1
    sliced = m["attention"] != "softmax"
    params = m["layers"] * ((2 + m["heads"] + 2) * dm * dm if sliced else 4 * dm * dm) + m["layers"] * 8 * dm * dm \
        + (N + 110) * dm
    act = t["batch_size"] * max(t["n_steps"]) * N * dm * (twice * (12 + (4 * m["heads"] if sliced else 0)) + 12)
    data = 24.0 * chars + 24.0 * t["max_steps"] * t["batch_size"] * (N + 1)
    return Estimate(work.flops, work.calls, max(data + 4.0 * (4.0 * params + act), 24.0 * chars + held))


# -- the job --------------------------------------------------------------------------------------
def corpus_of(d: dict):
    try:
        return load_text(d["corpus"], val_fraction=d["val_fraction"], seed=d["split_seed"],
                         max_chars=d["max_chars"] or None)
    except RuntimeError as e:  # a Python without the corpus
        raise ConfigError(f"data.corpus: {e}") from None
    except ValueError as e:  # too small a corpus to split
        raise ConfigError(f"data: {e}") from None


def decoder_config(m: dict, vocab_size: int):
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
    """The model of ``[model]``, its initial weights drawn from ``model.seed``: DecoderLM's
    own (``model.init = "gpt2"``) or nanoGPT's (``"nanogpt"``: ``DecoderLM.reset_parameters(
    init="nanogpt")``, the weights benchmarks/continuity_text.py starts from with ``--seed``
    equal to ``model.seed``)."""
    model = DecoderLM(decoder_config(m, vocab_size), generator=torch.Generator().manual_seed(m["seed"]))
    if m.get("init", "gpt2") != "gpt2":
        model.reset_parameters(torch.Generator().manual_seed(m["seed"]), init=m["init"])
    return model


def training_grid(cfg) -> int:
    """The training grid's N_t (the reference of the solver-swap table): ``model.layers``
    when ``train.n_steps`` holds it (the model's own), else the first of ``train.n_steps``."""
    m, t = cfg["model"], cfg["train"]
    return m["layers"] if m["layers"] in t["n_steps"] else t["n_steps"][0]


def held_out(cfg, corpus) -> dict:
    """The validation text the model has not seen repeated: the validation split without
    every paragraph that shares a :data:`DEDUP_K`-character substring with the training text
    (:func:`opsplit.data.dedup.deduplicate`, as benchmarks/continuity_text.py builds it), its
    windows of ``model.context`` characters (at most ``eval.windows``).  When no paragraph
    survives, or too few characters for one window, the whole validation split stands in
    (``"deduplicated": False``, ``"why"`` says so)."""
    m, k = cfg["model"], cfg["eval"]["windows"]
    train_text, val_text = corpus.vocab.decode(corpus.train), corpus.vocab.decode(corpus.val)
    try:
        text, info = deduplicate(val_text, train_text, k=DEDUP_K, unit="paragraph")
    except ValueError:
        text, info = None, None
    ids = None if text is None else corpus.vocab.encode(text, errors="replace")
    why = None
    if text is None:
        why = (f"every paragraph of the validation split shares a {DEDUP_K}-character substring with the training "
               f"text")
    elif ids.numel() < m["context"] + 1:
        why = (f"the {ids.numel()} characters of the validation split that share no {DEDUP_K}-character substring "
               f"with the training text are fewer than one window of model.context = {m['context']} and its targets")
    if why is not None:
        text, ids = val_text, corpus.val
    windows = text_windows(ids, m["context"], name="validation_dedup" if why is None else "validation")
    if k and k < len(windows):
        windows = TensorData(windows.inputs[:k], windows.targets[:k], name=windows.name)
    return {"text": text, "train_text": train_text, "val_text": val_text, "windows": windows, "info": info,
            "deduplicated": why is None, "why": why}


def windows(cfg, corpus):
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    for name, ids in (("training", corpus.train), ("validation", corpus.val)):
        if ids.numel() < m["context"] + 1:
            raise ConfigError(f"model.context: a window of {m['context']} characters and its targets need "
                              f"{m['context'] + 1} characters, but the {name} split of {d['corpus']} has "
                              f"{ids.numel()}; expected a shorter context (or more data: data.max_chars)")
    train = text_windows(corpus.train, m["context"], t["max_steps"] * t["batch_size"], seed=t["seed"], name="train")
    val = text_windows(corpus.val, m["context"], name="validation")
    k = cfg["eval"]["windows"]
    if k and k < len(val):
        val = TensorData(val.inputs[:k], val.targets[:k], name="validation")
    return train, val


def check_resumed(cfg, plan, folder: Path, allow=None) -> None:
    """``--resume``: the folder's checkpoint against this config, before anything is
    written (:func:`opsplit.cli.tasks.base.check_checkpoint`); one step per ``batch_size``
    windows."""
    trainer = Trainer(plan["model"], objective(cfg), train_config(cfg, progress=False))
    base.check_checkpoint(plan, folder, allow, trainer=trainer, total_steps=cfg["train"]["max_steps"],
                          keys=base.run_keys(cfg, epochs="train.max_steps"), data_keys=DATA_KEYS)


def prepare(cfg) -> dict:
    """The library's own checks: the corpus loads and splits, the prompt's characters are in
    the vocabulary, the windows fit, the model is built and gives finite logits, and the
    trainer's checks before its first step pass (the gradient mode, the objective's weights,
    the drawn solvers: :func:`~opsplit.cli.tasks.base.preflight`)."""
    corpus = corpus_of(cfg["data"])
    try:
        corpus.vocab.check(cfg["generate"]["prompt"], "generate.prompt")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    train, val = windows(cfg, corpus)
    model = build_model(cfg["model"], corpus.vocab.size)
    with torch.no_grad():
        out = model.eval()(train.inputs[:2]).logits
    model.train()
    if not bool(torch.isfinite(out).all()):
        raise ConfigError("model: the untrained model's logits on two windows are not finite")
    base.preflight(model, objective(cfg), train_config(cfg, progress=False), train.inputs[:2], train.targets[:2],
                   "windows")
    base.check_coarse_keys(model, cfg)
    return {"model": model, "corpus": corpus, "train": train, "val": val}


class _BitsBar(Callback):
    """The progress bar of a text run: the training loss in bits per character (the unit of
    the report), from the trainer's history at the start of every step (the trainer's own
    bar shows the objective, in nats)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar, self.trainer = total, enabled, None, None

    def on_step_start(self, trainer) -> None:
        self.trainer = trainer
        self.update()

    def update(self) -> None:
        if not self.enabled or self.trainer is None:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.total, initial=self.trainer.step, desc="train", leave=False,
                            dynamic_ncols=True)
        self.bar.update(self.trainer.step - self.bar.n)
        steps = self.trainer.history.steps
        if steps:
            self.bar.set_postfix_str(f"loss={bits_per_char(steps[-1]['loss']):.4g} bits/char", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.update()
            self.bar.close()


def fit(cfg, plan, folder: Path, progress: bool):
    """Train (:func:`~opsplit.cli.tasks.base.fit`: resumable, an interrupt saves a
    checkpoint), with a progress bar in bits per character; returns ``(trainer, history,
    resumed)``."""
    bar = _BitsBar(cfg["train"]["max_steps"], progress)
    try:
        return base.fit(lambda callbacks: Trainer(plan["model"], objective(cfg), train_config(cfg, False),
                                                  callbacks=callbacks),
                        folder, plan["train"], None, allow=plan.get("allow_changes", False), callbacks=[bar])
    finally:
        bar.close()


def _numbers(v):
    """A list of weights as the report shows it (floats)."""
    return [float(x) for x in v] if isinstance(v, list) else v


def run(cfg, plan, out, progress=True):
    # slow to import (about 1 s): loaded when the job draws
    import matplotlib.pyplot as plt

    m, t, o, e, g = cfg["model"], cfg["train"], cfg["objective"], cfg["eval"], cfg["generate"]
    corpus, model, val = plan["corpus"], plan["model"], plan["val"]
    (out.folder / VOCAB).write_text(json.dumps(corpus.vocab.to_dict()))
    try:
        trainer, history, resumed = fit(cfg, plan, out.folder / "train", progress)
    except Interrupted as err:
        err.folder = out.folder
        raise
    prompt = corpus.vocab.encode(g["prompt"], name="generate.prompt")[None]
    rows, samples = [], []
    with base.resumable_after_training(trainer, out.folder, "train"):
        for n in e["n_steps"]:
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
        held = held_out(cfg, corpus)
        ref = training_grid(cfg)
        cont = continuity_report.measure(model, held["windows"], n_steps=e["n_steps"], reference=ref,
                                         solvers=["trained", *e["solvers"]], batch_size=EVAL_BATCH, loss=lm_loss,
                                         output="logits", metric="bits_per_char",
                                         coarse=t["coarse_controls"] or "point")
        front = None
        if cfg["frontier"]["enabled"]:
            front = frontier_report.measure(model, held["windows"], n_steps=cfg["frontier"]["n_steps"],
                                            batch_size=EVAL_BATCH, loss=lm_loss, output="logits",
                                            metric="bits_per_char")
        whole = next((r["val_bits_per_char"] for r in rows if r["n_t"] == ref), None)
        if whole is None:
            whole = bits_per_char(trainer.evaluate(val, n_steps=ref)["loss"])
        ngram = None
        if e["ngram_order"]:
            ng = NGram(e["ngram_order"], "kneser_ney").fit(held["train_text"], corpus.vocab.size)
            ngram = {"held": ng.bits_per_char(held["text"]), "val": ng.bits_per_char(held["val_text"])}
    split_weighted = t["solvers_split"] and isinstance(t["solvers_split_weights"], list)
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
           f" {t['solvers']} (weights: {_numbers(t['solvers_weights'])}"
           + (f"; the parts weighted {_numbers(t['solvers_split_weights'])} in the objective" if split_weighted else "")
           + ")" if t["solvers"] != ["euler"] else "")
        + "".join(f", {k} cost weight {o[k]:g}" for k in ("kinetic", "acceleration") if o[k])
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
    what = _held_out_section(out, cfg, held, cont, ngram, whole)
    continuity_report.write(out, cont, what=what)
    if front is not None:
        out.heading("One model, every depth")
        frontier_report.write(out, front, grid=training_grid(cfg), what=what,
                              budget="Models trained at one N_t alone on the same budget are compared by "
                                     "benchmarks/multilevel.py (docs/multilevel.md).")
    return trainer, history, rows


def _held_out_section(out, cfg, held, cont, ngram, whole) -> str:
    """The report's part on the deduplicated validation text: what it is, and the model at
    its training grid beside the n-gram baseline (a table); returns the metric's name for
    the solver-swap table that follows."""
    ref, order = cont.reference, cfg["eval"]["ngram_order"]
    out.heading("The validation text without repeats")
    if held["deduplicated"]:
        info = held["info"]
        what = "bits/char on the deduplicated validation text"
        out.text(f"The validation paragraphs that share no {DEDUP_K}-character substring with the training text "
                 f"(opsplit.data.dedup): {info['chars_after']} of {info['chars_before']} characters, "
                 f"{info['units_kept']} of {info['units_before']} paragraphs, {len(held['windows'])} windows of "
                 f"{cfg['model']['context']} characters. Documents that quote each other flatter every model on the "
                 f"whole split, and a model that memorises the training text most.")
        name, col = "deduplicated validation text", "deduplicated validation bits/char"
    else:
        what = "validation bits/char"
        out.text(f"No deduplicated validation text: {held['why']}; the tables below use the whole validation split "
                 f"({len(held['windows'])} windows).")
        name, col = "validation split", "validation bits/char"
    table = [{"model": f"this model, training grid (N_t = {ref['n_steps']}, {ref['solver']} substeps)",
              col: ref[cont.metric], "whole validation split bits/char": whole}]
    if ngram is not None:
        table.append({"model": f"Kneser-Ney {order}-gram (opsplit.analysis.NGram) fitted on the training text",
                      col: ngram["held"], "whole validation split bits/char": ngram["val"]})
        gap = ref[cont.metric] - ngram["held"]
        out.text(f"On the {name} the model scores {ref[cont.metric]:.4f} bits/char at its training grid, "
                 f"{abs(gap):.4f} {'below' if gap < 0 else 'above'} the Kneser-Ney {order}-gram baseline fitted on "
                 f"the same {len(held['train_text'])} training characters ({ngram['held']:.4f}).")
    out.table("baseline", table, title=f"bits per character on the {name}, beside the n-gram baseline",
              kind="text_baseline")
    return what


# -- `opsplit generate` reads a run folder -----------------------------------------------------
def run_config(folder):
    """``(cfg, vocab, checkpoint)`` of a finished or interrupted text training run in
    ``folder`` (its config.toml, vocab.json and the path of its latest checkpoint), checked;
    nothing is built or loaded."""
    folder = Path(folder)
    path = base.run_folder(folder, "folder", "the output folder of an opsplit train run with task = \"text\" "
                           "(its config.toml, vocab.json and checkpoints)")
    task = read_top(path, "task", "digits")
    if task != "text":
        raise ConfigError(f"folder: {str(folder)!r} holds a training run with task = {task!r}; opsplit generate "
                          f"samples from a run with task = \"text\"")
    cfg = load(SCHEMA, path, renamed=RENAMED)
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
    model = build_model(cfg["model"], vocab.size)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_checkpoint(ckpt, model)
    except ValueError as e:
        raise ConfigError(f"folder: {base.without_api_advice(e)}") from None
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
