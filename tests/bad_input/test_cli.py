"""Bad input to the ``opsplit`` command (issue 17): flags, --out, config files, values,
keys that contradict each other, jobs too large for the machine, --resume, report folders.

Every row runs ``main(argv)`` in-process (a few also as ``python -m opsplit``) and asserts:
exit status 2; one line on stderr, ``opsplit ...: error: ...``, naming the flag, key or
file (``match``); no traceback; and nothing written: the files under the row's folder are
the same before and after (no output folder, no report, no checkpoint).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from opsplit.cli import main

ROOT = Path(__file__).resolve().parents[2]
HUGE = "1000000000000"  # 1e12: beyond any machine's memory or an hour of compute

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple  # "{tmp}" is the row's folder; "--out {tmp}/out" where a job would write
    match: str
    files: dict = field(default_factory=dict)  # name -> str | bytes | None (a folder)
    env: dict = field(default_factory=dict)


def rows(*specs) -> list:
    out = [Row(s[0], tuple(s[1]), s[2], *(s[3:])) for s in specs]
    ids = [r.id for r in out]
    assert len(ids) == len(set(ids)), "duplicate ids"
    return [pytest.param(r, id=r.id) for r in out]


def toml(text: str) -> dict:
    return {"c.toml": text}


OUT = ("--out", "{tmp}/out")
CFG = ("--config", "{tmp}/c.toml")
CKPT = {"run/train/checkpoints/step-00000002/meta.json": "{}", "run/config.toml": "[model]\n"}
SOLVE_DIR = {"s/manifest.json": json.dumps({"title": "opsplit solve", "blocks": []}),
             "s/config.toml": "[solve]\nn_t = [4]\n"}
TRAIN_DIR = {"t/manifest.json": json.dumps({"title": "opsplit train", "blocks": []}),
             "t/config.toml": "[model]\nd_model = 8\nheads = 2\n"}
CSV = {"r/t.csv": "a,b\n1,2\n"}


def manifest(obj) -> dict:
    return {**CSV, "r/manifest.json": obj if isinstance(obj, (str, bytes)) else json.dumps(obj)}


CASES = rows(
    # -- flags (argparse and the thread pre-scan) --------------------------------------------------
    ("flag-not-int", ["train", "--epochs", "1e3", *OUT], "argument --epochs: invalid int value: '1e3'"),
    ("flag-missing-value", ["solve", "--n-t", *OUT], "argument --n-t: expected at least one argument"),
    ("flag-unknown", ["solve", "--bogus", *OUT], "unrecognized arguments: --bogus"),
    ("flag-compare-nx-text", ["compare", "--n-x", "x", *OUT], "argument --n-x: invalid int value: 'x'"),
    ("command-unknown", ["frobnicate"], "argument command: invalid choice: 'frobnicate'"),
    ("threads-zero", ["--threads", "0", "solve", *OUT], "--threads: expected a number of threads from 1"),
    ("threads-text", ["train", "--threads", "x", *OUT], "--threads: expected a number of threads (an integer >= 1), got 'x'"),
    ("threads-missing", ["solve", *OUT, "--threads"], "--threads: expected a number of threads (an integer >= 1), got nothing"),
    ("threads-too-many", ["--threads=100000", "solve", *OUT], "--threads: expected a number of threads from 1 to 4096"),
    ("threads-env", ["solve", *OUT], "OPSPLIT_THREADS: expected a number of threads", {}, {"OPSPLIT_THREADS": "many"}),
    ("grid-seed-negative", ["grid", "--seed", "-1"], "--seed: expected a seed from 0 to 4294967295"),
    ("grid-steps-zero", ["grid", "--steps", "0"], "--steps: expected N_t >= 1, got 0"),
    ("grid-levels", ["grid", "--levels", "6"], "--levels: expected 1 to 5 levels"),
    ("grid-steps-int64", ["grid", "--steps", "99999999999999999999"], "--steps: expected an integer (64-bit)"),
    ("grid-steps-cost", ["grid", "--steps", "100000000"], "--steps = 100000000: the job needs an estimated"),
    ("convert-layers-zero", ["convert", "--layers", "0", *OUT], "torch.num_layers: expected a value >= 1, got 0"),
    # -- the output folder -------------------------------------------------------------------------
    ("out-is-file", ["solve", "--out", "{tmp}/f"], "--out: '{tmp}/f' is a file, expected a folder", {"f": "x"}),
    ("out-under-file", ["solve", "--out", "{tmp}/f/sub"], "--out: '{tmp}/f/sub' cannot be created: '{tmp}/f' is a file", {"f": "x"}),
    ("out-default-job-file", ["--quick", "--out", "{tmp}/f"], "--out: '{tmp}/f' is a file, expected a folder", {"f": "x"}),
    ("out-train-holds-run", ["train", "--out", "{tmp}/run"], "--out: '{tmp}/run' already holds a training run", CKPT),
    ("out-default-holds-run", ["--quick", "--out", "{tmp}/run"], "--out: '{tmp}/run' already holds a training run", CKPT),
    # -- config files --------------------------------------------------------------------------------
    ("config-missing", ["solve", "--config", "{tmp}/none.toml", *OUT], "config: no such file '{tmp}/none.toml'"),
    ("config-folder", ["solve", "--config", "{tmp}/d", *OUT], "config: expected a TOML file, '{tmp}/d' is a folder", {"d": None}),
    ("config-binary", ["solve", *CFG, *OUT], "is not a TOML file (not UTF-8 text: byte 0xff at offset 0)", {"c.toml": b"\xff\xfe\x00[model]"}),
    ("config-latin1", ["solve", *CFG, *OUT], "is not a TOML file (not UTF-8 text: byte 0xe9", {"c.toml": "# d\xe9j\xe0\n[model]\n".encode("latin-1")}),
    ("config-syntax", ["solve", *CFG, *OUT], "is not valid TOML", toml("[solve\n")),
    ("config-top-level-key", ["solve", *CFG, *OUT], "config: key 'seed' is outside any section", toml("seed = 3\n")),
    ("config-section-scalar", ["solve", *CFG, *OUT], "config: [model] must be a table of keys", toml("model = 3\n")),
    ("config-unknown-section", ["solve", *CFG, *OUT], "config: unknown section [solver]", toml("[solver]\nn_t = [4]\n")),
    ("config-unknown-key", ["solve", *CFG, *OUT], "solve.nt: unknown key", toml("[solve]\nnt = [4]\n")),
    ("config-nested-table", ["solve", *CFG, *OUT], "model.T: expected a finite number, got {'x': 1} (dict)", toml("[model.T]\nx = 1\n")),
    # -- values --------------------------------------------------------------------------------------
    ("int-too-large", ["solve", *CFG, *OUT], "model.seed: expected an integer (64-bit), got 99999999999999999999999", toml("[model]\nseed = 99999999999999999999999\n")),
    ("int-list-too-large", ["solve", *CFG, *OUT], "solve.n_t: expected a non-empty list of integers (64-bit)", toml("[solve]\nn_t = [4, 99999999999999999999]\n")),
    ("T-inf", ["solve", *CFG, *OUT], "model.T: expected a finite number, got inf", toml("[model]\nT = inf\n")),
    ("T-nan", ["solve", *CFG, *OUT], "model.T: expected a finite number, got nan", toml("[model]\nT = nan\n")),
    ("scale-inf", ["compare", *CFG, *OUT], "model.scale: expected a finite number, got inf", toml("[model]\nscale = inf\n")),
    ("lr-inf", ["train", *CFG, *OUT], "train.lr: expected a finite number, got inf", toml("[train]\nlr = inf\n")),
    ("lr-nan", ["train", *CFG, *OUT], "train.lr: expected a finite number, got nan", toml("[train]\nlr = nan\n")),
    ("weight-decay-minus-inf", ["train", *CFG, *OUT], "train.weight_decay: expected a finite number", toml("[train]\nweight_decay = -inf\n")),
    ("layer-norm-eps-inf", ["convert", *CFG, *OUT], "torch.layer_norm_eps: expected a finite number", toml("[torch]\nlayer_norm_eps = inf\n")),
    ("wrong-type-str", ["solve", *CFG, *OUT], "model.batch: expected an integer (64-bit), got '2' (str)", toml('[model]\nbatch = "2"\n')),
    ("wrong-type-bool", ["solve", *CFG, *OUT], "model.J: expected an integer (64-bit), got True (bool)", toml("[model]\nJ = true\n")),
    ("wrong-type-float-in-list", ["solve", *CFG, *OUT], "solve.n_t: expected a non-empty list of integers", toml("[solve]\nn_t = [4.5]\n")),
    ("empty-list", ["solve", *CFG, *OUT], "solve.schemes: expected a non-empty list of strings", toml("[solve]\nschemes = []\n")),
    ("bool-as-int", ["convert", *CFG, *OUT], "torch.norm_first: expected true or false, got 1", toml("[torch]\nnorm_first = 1\n")),
    ("choice", ["compare", *CFG, *OUT], "compare.solvers: expected each of one of 'euler', 'heun', 'rk4', 'odeint', got 'midpoint'", toml('[compare]\nsolvers = ["midpoint"]\n')),
    ("convert-dtype", ["convert", *CFG, *OUT], "convert.dtypes: expected each of one of 'float32', 'float64', got 'float16'", toml('[convert]\ndtypes = ["float16"]\n')),
    ("convert-model", ["convert", "--models", "bert", *OUT], "convert.models: expected each of one of 'torch', 'vit', 'cvt', 'gpt2', 'llama', 'qwen2', 'mistral', got 'bert'"),
    ("seed-negative", ["solve", "--seed", "-1", *OUT], "model.seed: expected a seed from 0 to 4294967295, got -1"),
    ("seed-2-32", ["train", *CFG, *OUT], "train.seed: expected an integer in [0, 2**32), got 4294967296", toml("[train]\nseed = 4294967296\n")),
    ("split-seed-large", ["train", *CFG, *OUT], "data.split_seed: expected a seed from 0 to 4294967295", toml("[data]\nsplit_seed = 1099511627776\n")),
    ("convert-seed-large", ["convert", *CFG, *OUT], "convert.seed: expected a seed from 0 to 4294967295", toml("[convert]\nseed = 1099511627776\n")),
    ("shift-past-image", ["train", *CFG, *OUT], "data.shift: expected a shift in pixels from 0 to 7, got 8", toml("[data]\nshift = 8\n")),
    ("test-fraction-one", ["train", *CFG, *OUT], "data.test_fraction: expected a number in (0, 1), got 1.0", toml("[data]\ntest_fraction = 1.0\n")),
    ("n-t-zero", ["solve", "--n-t", "0", "4", *OUT], "solve.n_t: expected values >= 1, got [0, 4]"),
    ("repeats-zero", ["compare", "--repeats", "0", *OUT], "compare.repeats: expected a value >= 1, got 0"),
    # -- keys against each other ----------------------------------------------------------------------
    ("test-fraction-high", ["train", *CFG, *OUT], "data.test_fraction: the stratified split puts 178 of the 178 images of digit 0 in the test set, leaving no training image", toml("[data]\ntest_fraction = 0.999\n")),
    ("test-fraction-low", ["train", *CFG, *OUT], "data.test_fraction: the stratified split puts 0 of the 178 images of digit 0 in the test set, leaving no test image", toml("[data]\ntest_fraction = 0.001\n")),
    ("train-n-steps-repeated", ["train", *CFG, *OUT], "train.n_steps: N_t = 4 is listed twice", toml("[train]\nn_steps = [2, 4, 4]\n")),
    ("train-n-steps-zero", ["train", *CFG, *OUT], "train.n_steps: expected an integer >= 1, got 0", toml("[train]\nn_steps = [0, 4]\n")),
    ("train-n-steps-negative", ["train", *CFG, *OUT], "train.n_steps: expected an integer >= 1, got -2", toml("[train]\nn_steps = [4, -2]\n")),
    ("eval-n-steps-repeated", ["train", *CFG, *OUT], "eval.n_steps: expected distinct values (8 given more than once), got [4, 8, 8]", toml("[eval]\nn_steps = [4, 8, 8]\n")),
    ("n-steps-weights", ["train", *CFG, *OUT], "train.n_steps_weights: expected None, 'uniform', 'cost' or a list of weights > 0, got 'harmonic'", toml("[train]\nn_steps_weights = \"harmonic\"\n")),
    ("kinetic-negative", ["train", *CFG, *OUT], "objective.kinetic: expected a finite weight >= 0, got -0.5", toml("[objective]\nkinetic = -0.5\n")),
    ("kinetic-nan", ["train", *CFG, *OUT], "objective.kinetic: expected a finite weight >= 0, got nan", toml("[objective]\nkinetic = nan\n")),
    ("acceleration-inf", ["train", *CFG, *OUT], "objective.acceleration: expected a finite weight >= 0, got inf", toml("[objective]\nacceleration = inf\n")),
    # issue 42, finding 11b: a cost weight whose term (or its gradient's norm) overflows float32 at the untrained model
    ("kinetic-1e308", ["train", *CFG, *OUT], "objective.kinetic: a weight of 1e+308 is beyond the largest float32 number (3.4e+38)", toml("[objective]\nkinetic = 1e308\n")),
    ("kinetic-gradient-overflow", ["train", *CFG, *OUT], "objective.kinetic: the weight 1e+37 times the gradient of the flow's kinetic energy", toml("[objective]\nkinetic = 1e37\n")),
    ("acceleration-gradient-overflow", ["train", *CFG, *OUT], "objective.acceleration: the weight 1e+30 times the gradient of the flow's acceleration", toml("[objective]\nacceleration = 1e30\n")),
    # issue 43: a key of an earlier version names its new name (the TrainConfig field, the Objective weight, ...)
    ("old-train-n-steps", ["train", *CFG, *OUT], "train.train_n_steps: renamed train.n_steps (the name of what it sets); expected n_steps = ... under [train]", toml("[train]\ntrain_n_steps = [2, 4]\n")),
    ("old-train-solvers", ["train", *CFG, *OUT], "train.train_solvers: renamed train.solvers", toml('[train]\ntrain_solvers = ["euler"]\n')),
    ("old-kinetic", ["train", *CFG, *OUT], "train.kinetic: renamed objective.kinetic (the name of what it sets); expected kinetic = ... under [objective]", toml("[train]\nkinetic = 0.1\n")),
    ("old-eval-n-steps", ["train", *CFG, *OUT], "train.eval_n_steps: renamed eval.n_steps", toml("[train]\neval_n_steps = [4]\n")),
    ("old-shift", ["train", *CFG, *OUT], "train.shift: renamed data.shift", toml("[train]\nshift = 1\n")),
    ("eval-solvers-unknown", ["train", *CFG, *OUT], "eval.solvers: expected each of one of 'euler', 'heun', 'rk4', got 'implicit'", toml("[eval]\nsolvers = [\"implicit\"]\n")),
    ("kinetic-checkpoint", ["train", "--gradient", "checkpoint", *OUT], "objective.kinetic: a flow cost reads every step of the forward solve, and the checkpointed time loop (gradient='checkpoint', or 'adjoint' with snapshots) recomputes steps"),
    ("adjoint-euler", ["train", "--gradient", "adjoint", *OUT], "train.gradient: gradient='adjoint': the model has no smooth ODE substep to solve by the continuous adjoint"),
    ("heads-divisor", ["train", *CFG, *OUT], "model.heads: expected a divisor of model.d_model = 32, got 3", toml("[model]\nheads = 3\n")),
    ("patch-divisor", ["train", *CFG, *OUT], "model.patch: expected a divisor of 8", toml("[model]\npatch = 3\n")),
    ("train-T-float32", ["train", *CFG, *OUT], "model.T: the model runs in float32, and its steps T / n_steps = 2.5e+299", toml("[model]\nT = 1e300\n")),
    ("solve-n-y-1", ["solve", "--n-x", "1", "--n-y", "1", *OUT], "solve.n_y: with model.constraint = true every token"),
    ("compare-n-y-1", ["compare", "--n-y", "1", *OUT], "compare.n_y: with model.constraint = true every token"),
    ("solve-grid-space-3-grids", ["solve", *CFG, *OUT], "solve.n_x / solve.n_y: model.space = 'grid' stores the controls", toml('[model]\nspace = "grid"\n')),
    ("solve-relu-unsplit", ["solve", *CFG, *OUT], "solve.reference: 'unsplit' needs a model without ReLU", toml("[model]\nrelu = true\n")),
    ("solve-finest-one-run", ["solve", *CFG, *OUT], "solve.reference: 'finest' compares each run with the finest one", toml('[solve]\nreference = "finest"\nn_t = [4]\nn_x = [8]\nn_y = [8]\n')),
    ("solve-zip-lengths", ["solve", "--n-x", "4", "8", "--n-y", "4", "8", "16", *OUT], "solve.n_x / solve.n_y: expected lists of equal length"),
    ("solve-spline-nodes", ["solve", "--n-x", "2", "3", "--n-y", "4", "4", *OUT], "solve.n_x: the finest grid is resampled"),
    ("compare-one-n-t", ["compare", "--n-t", "4", *OUT], "compare.n_t: expected at least two distinct values"),
    # the triple jump's substeps leave the step by 0.351 dt: at dt = T/4 the controls need 0.0878 T beyond [0, T]
    ("compare-triple-jump-margin", ["compare", "--schemes", "strang", "triple_jump", "blanes_moan", "--solvers", "rk4",
                                    "--rtol", "1e-5", *OUT],
     "opsplit compare: error: model.margin = 0: scheme 'triple_jump' runs substeps up to 0.351 dt outside each step "
     "(negative coefficients), so at the largest step dt = T / 4 the controls must extend 0.0878 T beyond [0, T]; "
     "expected model.margin >= 0.088"),
    ("solve-triple-jump-margin-short", ["solve", "--schemes", "triple_jump", "--solver", "rk4", "--n-t", "2", "8",
                                        "--n-x", "4", "--n-y", "4", "--margin", "0.17", *OUT],
     "opsplit solve: error: model.margin = 0.17: scheme 'triple_jump' runs substeps up to 0.351 dt outside each step "
     "(negative coefficients), so at the largest step dt = T / 2 the controls must extend 0.176 T beyond [0, T]; "
     "expected model.margin >= 0.176"),
    ("convert-nhead", ["convert", "--nhead", "3", *OUT], "torch.nhead: expected a divisor of torch.d_model = 16, got 3"),
    ("convert-vit-patch", ["convert", *CFG, *OUT], "vit.patch_size: expected a divisor of vit.image_size = 16", toml("[vit]\npatch_size = 5\n")),
    ("convert-vit-heads", ["convert", *CFG, *OUT], "vit.num_attention_heads: expected a divisor of vit.hidden_size = 24", toml("[vit]\nnum_attention_heads = 5\n")),
    ("convert-cvt-stages", ["convert", *CFG, *OUT], "cvt.depth/num_heads/embed_dim/patch_sizes/patch_stride: expected one entry per stage", toml('[convert]\nmodels = ["cvt"]\n[cvt]\ndepth = [1]\n')),
    ("convert-cvt-depth", ["convert", *CFG, *OUT], "cvt.depth: expected depth[k] > k", toml('[convert]\nmodels = ["cvt"]\n[cvt]\ndepth = [1, 1]\n')),
    ("convert-cvt-embed", ["convert", *CFG, *OUT], "cvt.embed_dim: expected multiples of cvt.num_heads", toml('[convert]\nmodels = ["cvt"]\n[cvt]\nembed_dim = [8, 15]\n')),
    ("convert-cvt-image", ["convert", *CFG, *OUT], "cvt.image_size: the stages' convolutional embeddings", toml('[convert]\nmodels = ["cvt"]\n[cvt]\npatch_sizes = [4, 4]\nimage_size = 1\n')),
    ("convert-gpt2-heads", ["convert", "--models", "gpt2", *CFG, *OUT], "gpt2.n_head: expected a divisor of gpt2.n_embd = 16, got 3", toml("[gpt2]\nn_head = 3\n")),
    ("convert-gpt2-positions", ["convert", "--models", "gpt2", *CFG, *OUT], "gpt2.new_tokens: a prompt of gpt2.seq_len = 8 tokens plus 60 new ones exceeds GPT-2's learned positions, gpt2.n_positions = 64", toml("[gpt2]\nnew_tokens = 60\n")),
    ("convert-gpt2-activation", ["convert", "--models", "gpt2", *CFG, *OUT], "gpt2.activation_function: expected one of 'gelu', 'gelu_new'", toml('[gpt2]\nactivation_function = "mish"\n')),
    ("convert-gpt2-n-inner", ["convert", "--models", "gpt2", *CFG, *OUT], "gpt2.n_inner: expected a value >= 0, got -1", toml("[gpt2]\nn_inner = -1\n")),
    ("convert-llama-kv-heads", ["convert", "--models", "llama", *CFG, *OUT], "llama.num_key_value_heads: expected a divisor of llama.num_attention_heads = 4 (groups of equal size), got 3", toml("[llama]\nnum_key_value_heads = 3\n")),
    ("convert-llama-heads", ["convert", "--models", "llama", *CFG, *OUT], "llama.num_attention_heads: expected a divisor of llama.hidden_size = 16 (or set llama.head_dim), got 3", toml("[llama]\nnum_attention_heads = 3\nnum_key_value_heads = 1\n")),
    ("convert-llama-odd-head", ["convert", "--models", "llama", *CFG, *OUT], "llama.head_dim: rotary positions turn pairs of features; expected an even head size, got 3", toml("[llama]\nhead_dim = 3\n")),
    ("convert-qwen2-odd-head", ["convert", "--models", "qwen2", *CFG, *OUT], "qwen2.hidden_size / qwen2.num_attention_heads: rotary positions turn pairs of features; expected an even head size, got 3", toml("[qwen2]\nhidden_size = 12\n")),
    ("convert-qwen2-head-dim", ["convert", "--models", "qwen2", *CFG, *OUT], "qwen2.head_dim: unknown key", toml("[qwen2]\nhead_dim = 4\n")),
    ("convert-mistral-sliding", ["convert", "--models", "mistral", *CFG, *OUT], "mistral.sliding_window: unknown key", toml("[mistral]\nsliding_window = 4\n")),
    ("convert-mistral-theta", ["convert", "--models", "mistral", *CFG, *OUT], "mistral.rope_theta: expected a value > 0, got 0.0", toml("[mistral]\nrope_theta = 0\n")),
    ("convert-llama-eps", ["convert", "--models", "llama", *CFG, *OUT], "llama.rms_norm_eps: expected a value > 0, got -1e-06", toml("[llama]\nrms_norm_eps = -1e-6\n")),
    ("convert-llama-bias-int", ["convert", "--models", "llama", *CFG, *OUT], "llama.attention_bias: expected true or false, got 1", toml("[llama]\nattention_bias = 1\n")),
    ("convert-llama-act", ["convert", "--models", "llama", *CFG, *OUT], "llama.hidden_act: expected one of", toml('[llama]\nhidden_act = "relu6"\n')),
    ("convert-llama-seq-len", ["convert", "--models", "llama", *CFG, *OUT], "llama.seq_len: expected a value >= 1, got 0", toml("[llama]\nseq_len = 0\n")),
    ("convert-llama-new-tokens", ["convert", "--models", "llama", *CFG, *OUT], "llama.new_tokens: expected a value >= 1, got -2", toml("[llama]\nnew_tokens = -2\n")),
    ("convert-llama-new-tokens-zero", ["convert", "--models", "llama", *CFG, "--print-config"], "llama.new_tokens: expected a value >= 1, got 0", toml("[llama]\nnew_tokens = 0\n")),
    ("convert-llama-vocab", ["convert", "--models", "llama", *CFG, *OUT], "llama.vocab_size: expected a value >= 2, got 1", toml("[llama]\nvocab_size = 1\n")),
    ("convert-llama-theta-str", ["convert", "--models", "llama", *CFG, *OUT], "llama.rope_theta: expected a finite number, got '1e4' (str)", toml('[llama]\nrope_theta = "1e4"\n')),
    # -- the size and cost guard (memory: beyond any machine; time: beyond an hour) ----------------------
    ("guard-solve-grid", ["solve", "--n-x", "1000000", "--n-y", "1000000", *OUT], "solve.n_x = [1000000], solve.n_y = [1000000]: the job needs an estimated"),
    ("guard-solve-n-x", ["solve", "--n-x", HUGE, "--n-y", "8", *OUT], f"solve.n_x = [{HUGE}]: the job needs an estimated"),
    ("guard-solve-n-y", ["solve", "--n-x", "8", "--n-y", HUGE, *OUT], f"solve.n_y = [{HUGE}]: the job needs an estimated"),
    ("guard-solve-n-t", ["solve", "--n-t", "4", HUGE, *OUT], f"solve.n_t = [4, {HUGE}]: the job needs an estimated"),
    ("guard-solve-T", ["solve", *CFG, *OUT], "model.T = 1e+300: the job needs an estimated", toml("[model]\nT = 1e300\n")),
    ("guard-solve-scale", ["solve", *CFG, *OUT], "model.scale = 1e+300: the job needs an estimated", toml("[model]\nscale = 1e300\n")),
    ("guard-solve-batch", ["solve", *CFG, *OUT], f"model.batch = {HUGE}: the job needs an estimated", toml(f"[model]\nbatch = {HUGE}\n")),
    ("guard-solve-J", ["solve", *CFG, *OUT], f"model.J = {HUGE}: the job needs an estimated", toml(f"[model]\nJ = {HUGE}\n")),
    ("guard-solve-n-modes", ["solve", *CFG, *OUT], f"model.n_modes = {HUGE}: the job needs an estimated", toml(f"[model]\nn_modes = {HUGE}\n")),
    ("guard-solve-n-time", ["solve", *CFG, *OUT], f"model.n_time = {HUGE}: the job needs an estimated", toml(f"[model]\nn_time = {HUGE}\n")),
    ("guard-compare-repeats", ["compare", "--repeats", HUGE, *OUT], f"compare.repeats = {HUGE}: the job needs an estimated"),
    ("guard-compare-n-x", ["compare", "--n-x", HUGE, *OUT], f"compare.n_x = {HUGE}: the job needs an estimated"),
    ("guard-compare-odeint-T", ["compare", *CFG, *OUT], "model.T = 1e+30: the job needs an estimated", toml('[model]\nT = 1e30\n[compare]\nsolvers = ["odeint"]\nreference = "finest"\n')),
    ("guard-train-epochs", ["train", "--epochs", HUGE, *OUT], f"train.epochs = {HUGE}: the job needs an estimated"),
    ("guard-train-d-model", ["train", *CFG, *OUT], "model.d_model = 4000000: the job needs an estimated", toml("[model]\nd_model = 4000000\n")),
    ("guard-train-d-ff", ["train", *CFG, *OUT], f"model.d_ff = {HUGE}: the job needs an estimated", toml(f"[model]\nd_ff = {HUGE}\n")),
    ("guard-train-n-steps", ["train", "--n-steps", HUGE, *OUT], f"model.n_steps = {HUGE}: the job needs an estimated"),
    ("guard-train-eval-n-steps", ["train", *CFG, *OUT], f"eval.n_steps = [4, {HUGE}]: the job needs an estimated", toml(f"[eval]\nn_steps = [4, {HUGE}]\n")),
    ("guard-convert-d-model", ["convert", "--d-model", "4000000", "--nhead", "4", *OUT], "torch.d_model = 4000000: the job needs an estimated"),
    ("guard-convert-seq-len", ["convert", *CFG, *OUT], f"torch.seq_len = {HUGE}: the job needs an estimated", toml(f"[torch]\nseq_len = {HUGE}\n")),
    ("guard-convert-batch", ["convert", *CFG, *OUT], f"convert.batch = {HUGE}: the job needs an estimated", toml(f"[convert]\nbatch = {HUGE}\n")),
    ("guard-convert-vit-image", ["convert", *CFG, *OUT], "vit.image_size = 4000000: the job needs an estimated", toml("[vit]\nimage_size = 4000000\n")),
    ("guard-convert-cvt-image", ["convert", *CFG, *OUT], "cvt.image_size = 4000000: the job needs an estimated", toml('[convert]\nmodels = ["cvt"]\n[cvt]\nimage_size = 4000000\n')),
    ("guard-convert-llama-width", ["convert", "--models", "llama", *CFG, *OUT], "llama.hidden_size = 4000000: the job needs an estimated", toml("[llama]\nhidden_size = 4000000\n")),
    ("guard-convert-llama-seq-len", ["convert", "--models", "llama", *CFG, *OUT], f"llama.seq_len = {HUGE}: the job needs an estimated", toml(f"[llama]\nseq_len = {HUGE}\n")),
    ("guard-convert-gpt2-vocab", ["convert", "--models", "gpt2", *CFG, *OUT], f"gpt2.vocab_size = {HUGE}: the job needs an estimated", toml(f"[gpt2]\nvocab_size = {HUGE}\n")),
    # -- --resume ------------------------------------------------------------------------------------
    ("resume-solve-folder", ["train", "--resume", "{tmp}/s"], "--resume: expected an opsplit train output folder (its config.toml and checkpoints), '{tmp}/s' holds the output of opsplit solve", SOLVE_DIR),
    ("resume-default-folder", ["train", "--resume", "{tmp}/d"], "'{tmp}/d' holds the output of the default job", {"d/manifest.json": json.dumps({"title": "opsplit: the default job", "blocks": []}), "d/train.toml": ""}),
    ("resume-with-epochs", ["train", "--resume", "{tmp}/t", "--epochs", "6"], "--epochs: cannot be combined with --resume", TRAIN_DIR),
    ("resume-with-scheme", ["train", "--resume", "{tmp}/t", "--scheme", "lie"], "--scheme: cannot be combined with --resume", TRAIN_DIR),
    ("resume-with-out", ["train", "--resume", "{tmp}/t", "--out", "{tmp}/y"], "--out: cannot be combined with --resume", TRAIN_DIR),
    ("resume-with-config", ["train", "--resume", "{tmp}/t", *CFG], "--config: cannot be combined with --resume", {**TRAIN_DIR, **toml("[train]\nepochs = 1\n")}),
    ("resume-missing", ["train", "--resume", "{tmp}/nothing"], "--resume: expected an opsplit train output folder (its config.toml and checkpoints), '{tmp}/nothing' is not a folder"),
    ("resume-no-config", ["train", "--resume", "{tmp}/e"], "--resume: expected an opsplit train output folder (its config.toml and checkpoints), '{tmp}/e' has no config.toml", {"e": None}),
    ("resume-binary-config", ["train", "--resume", "{tmp}/b"], "is not a TOML file (not UTF-8 text", {"b/config.toml": b"\x00\xff\x10"}),
    ("resume-bad-config", ["train", "--resume", "{tmp}/b"], "model.heads: expected a divisor of model.d_model = 8, got 3", {"b/config.toml": "[model]\nd_model = 8\nheads = 3\n"}),
    ("allow-changes-new-run", ["train", "--allow-changes", "train.lr", *OUT], "--allow-changes: only with --resume"),
    ("task-capitalised", ["train", *CFG, *OUT], "task: expected one of 'digits', 'text', 'burgers', got 'Digits' (task names are lower case: 'digits')", toml('task = "Digits"\n[model]\nd_model = 8\n')),
    ("task-list", ["train", *CFG, *OUT], "task: expected a string, one of 'digits', 'text', 'burgers', got ['text'] (list)", toml('task = ["text"]\n')),
    # -- opsplit report ---------------------------------------------------------------------------------
    ("report-missing", ["report", "{tmp}/none"], "folder: expected an existing folder, got '{tmp}/none'"),
    ("report-file", ["report", "{tmp}/f"], "folder: expected an existing folder, got '{tmp}/f'", {"f": "x"}),
    ("report-empty", ["report", "{tmp}/e"], "folder: expected a folder with CSV tables or PNG plots", {"e": None}),
    ("report-manifest-json", ["report", "{tmp}/r"], "r/manifest.json: expected a manifest (JSON), Expecting property name", manifest("{bad")),
    ("report-manifest-binary", ["report", "{tmp}/r"], "r/manifest.json: expected a manifest (UTF-8 JSON), found byte 0xff", manifest(b"\xff\xfe{}")),
    ("report-manifest-list", ["report", "{tmp}/r"], "r/manifest.json: expected a JSON object with 'title' and 'blocks', got list", manifest([1, 2])),
    ("report-manifest-blocks", ["report", "{tmp}/r"], "r/manifest.json: blocks: expected a list, got dict", manifest({"title": "t", "blocks": {}})),
    ("report-manifest-title", ["report", "{tmp}/r"], "r/manifest.json: title: expected a string, got 3", manifest({"title": 3, "blocks": []})),
    ("report-block-type", ["report", "{tmp}/r"], "r/manifest.json: blocks[0]: expected an object whose type is one of", manifest({"blocks": [{"type": "video"}]})),
    ("report-block-text", ["report", "{tmp}/r"], "r/manifest.json: blocks[1].text: expected a string, got None", manifest({"blocks": [{"type": "text", "text": "a"}, {"type": "heading"}]})),
    ("report-block-escapes", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].file: expected a path inside the folder, got '../x.csv'", manifest({"blocks": [{"type": "table", "file": "../x.csv"}]})),
    ("report-csv-binary", ["report", "{tmp}/r"], "r/t.csv: expected a CSV table (UTF-8 text), found byte 0xff", {"r/t.csv": b"a,b\n\xff,1\n"}),
    ("report-block-caption", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].caption: expected a string, got 7", manifest({"blocks": [{"type": "figure", "file": "p.png", "caption": 7}]})),
    ("report-block-kind", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].kind: expected a string, got 1", manifest({"blocks": [{"type": "table", "file": "t.csv", "kind": 1}]})),
    ("report-block-anchor", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].anchor: expected a name of letters, digits", manifest({"blocks": [{"type": "text", "text": "a", "anchor": "a b"}]})),
    ("report-block-notes", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].notes: expected an object of column -> sentence", manifest({"blocks": [{"type": "table", "file": "t.csv", "notes": ["x"]}]})),
    ("report-block-key", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].key: expected true or false, got 'yes'", manifest({"blocks": [{"type": "table", "file": "t.csv", "key": "yes"}]})),
    ("report-block-files", ["report", "{tmp}/r"], "r/manifest.json: blocks[0].files: expected a list of paths inside the folder", manifest({"blocks": [{"type": "files", "text": "", "files": ["/etc/passwd"]}]})),
)


def _setup(tmp: Path, files: dict):
    for name, content in files.items():
        p = tmp / name
        if content is None:
            p.mkdir(parents=True, exist_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def _tree(tmp: Path) -> dict:
    return {str(p.relative_to(tmp)): (p.stat().st_size if p.is_file() else None) for p in tmp.rglob("*")}


def _check(row: Row, tmp: Path, rc: int, err: str, before: dict):
    fill = str(tmp)
    assert rc == 2, f"{row.id}: exit status {rc}: {err}"
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{row.id}: expected one line on stderr, got {err!r}"
    assert lines[0].startswith("opsplit") and ": error: " in lines[0], lines[0]
    assert row.match.replace("{tmp}", fill) in lines[0], f"{row.id}: {lines[0]}"
    assert _tree(tmp) == before, f"{row.id}: files were written: {set(_tree(tmp)) ^ set(before)}"


@pytest.mark.parametrize("row", CASES)
def test_bad_cli_input(row: Row, tmp_path, capsys, monkeypatch):
    _setup(tmp_path, row.files)
    for k, v in row.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)  # a job without --out would write opsplit-runs/ here
    before = _tree(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in row.argv]
    rc = main(argv)
    _check(row, tmp_path, rc, capsys.readouterr().err, before)


UNWRITABLE = [pytest.param("/proc/opsplit-out", "--out: '/proc/opsplit-out' is not writable: cannot create entries in '/proc'", id="out-proc")]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")
@pytest.mark.parametrize("out, match", UNWRITABLE)
def test_unwritable_out(out, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["solve", "--out", out]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert not os.path.exists(out) and not any(tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True,
                    reason="root writes into read-only folders")
def test_read_only_out(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["solve", "--out", str(ro / "x")]) == 2
        assert f"--out: '{ro / 'x'}' is not writable: cannot create entries in '{ro}'" in capsys.readouterr().err
        assert not any(ro.iterdir())
        assert main(["report", str(ro)]) == 2  # report.md / report.html could not be written
    finally:
        ro.chmod(0o755)


def test_folder_refusing_entries_as_root_too(tmp_path, capsys, monkeypatch):
    """The read-only folder above with the probe of ``check_out_dir`` failing (EACCES), so
    that the refusal is checked when the suite runs as root: exit status 2, one line naming
    ``--out``, nothing written."""
    import errno

    import opsplit.control.paths as paths

    ro = tmp_path / "ro"
    ro.mkdir()

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(paths.tempfile, "mkdtemp", refuse)
    monkeypatch.chdir(tmp_path)
    assert main(["solve", "--out", str(ro / "x")]) == 2
    err = capsys.readouterr().err
    assert f"--out: '{ro / 'x'}' is not writable: cannot create entries in '{ro}'" in err and err.count("\n") == 1
    assert not any(ro.iterdir())


SUBPROCESS = [
    pytest.param(["solve", "--config", "{tmp}/c.toml", "--out", "{tmp}/out"], {"c.toml": b"\xff\xfe"},
                 "opsplit solve: error: config:", {}, id="console-binary-toml"),
    pytest.param(["solve", "--out", "{tmp}/out"], {}, "opsplit: error: OPSPLIT_THREADS: expected", {"OPSPLIT_THREADS": "0"},
                 id="console-threads-env"),
    pytest.param(["train", "--resume", "{tmp}/s"], SOLVE_DIR, "opsplit train: error: --resume:", {}, id="console-resume-solve"),
]


@pytest.mark.parametrize("argv, files, match, env", SUBPROCESS)
def test_bad_input_through_the_console_command(argv, files, match, env, tmp_path):
    """The same through ``python -m opsplit``: exit status 2 and one line, no traceback."""
    _setup(tmp_path, files)
    before = _tree(tmp_path)
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    r = subprocess.run([sys.executable, "-m", "opsplit", *[a.replace("{tmp}", str(tmp_path)) for a in argv]],
                       capture_output=True, text=True, cwd=tmp_path, env=e)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and match in r.stderr, r.stderr
    assert _tree(tmp_path) == before


# -- --resume of a real run: the checkpoint against the edited config.toml, before anything is written --
@dataclass(frozen=True)
class RunRow:
    id: str
    argv: tuple  # "{run}" is a copy of a finished run's folder
    match: str
    edit: object = None  # edit(folder) before the command


def run_rows(*specs) -> list:
    out = [RunRow(s[0], tuple(s[1]), s[2], *(s[3:])) for s in specs]
    ids = [r.id for r in out]
    assert len(ids) == len(set(ids)), "duplicate ids"
    return [pytest.param(r, id=r.id) for r in out]


def config_edit(old: str, new: str):
    """Replace ``old`` by ``new`` in the run's config.toml."""
    def edit(folder):
        p = folder / "config.toml"
        text = p.read_text()
        assert old in text, (old, text)
        p.write_text(text.replace(old, new))

    return edit


def checkpoint_edit(tensors=None, meta=None, size=None, seal=True):
    """Edit the run's latest checkpoint (``size``: truncate its tensor file; ``seal=False``:
    an edit of meta.json by hand, its digest in the tensor file left as it was)."""
    def edit(folder):
        sys.path.insert(0, str(ROOT / "tests"))
        from _train_helpers import rewrite_checkpoint

        from opsplit.control.checkpoint import latest_checkpoint

        ck = latest_checkpoint(folder / "train")
        if size is not None:
            with open(ck / "state.safetensors", "r+b") as fh:
                fh.truncate(size)
        else:
            rewrite_checkpoint(ck, tensors, meta, seal=seal)

    return edit


def first_weight(value):
    """The first element of the model's first floating weight set to ``value``."""
    def edit(t):
        k = next(k for k in sorted(t) if k.startswith("model.") and t[k].is_floating_point())
        t[k] = t[k].clone()
        t[k].view(-1)[0] = value
        return t

    return edit


def all_weights(fn):
    """Every floating tensor of the model's state as ``fn(tensor)``."""
    def edit(t):
        return {k: fn(v) if k.startswith("model.") and v.is_floating_point() else v for k, v in t.items()}

    return edit


def scaled_weights(factor):
    return all_weights(lambda v: v * factor)


def check_run_row(row: RunRow, run: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """Exit 2, one line naming the key, no traceback, and every file of the folder byte for
    byte as before (config.toml, vocab.json, manifest.json and the checkpoints included)."""
    import shutil

    folder = shutil.copytree(run, tmp_path / "run")
    if row.edit is not None:
        row.edit(folder)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    rc = main([a.replace("{run}", str(folder)) for a in row.argv])
    out, err = capsys.readouterr()
    assert rc == 2, f"{row.id}: exit status {rc}: {err}"
    assert "Traceback" not in err and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], f"{row.id}: {err!r}"
    assert row.match.replace("{run}", str(folder)) in lines[0], f"{row.id}: {lines[0]}"
    after = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    changed = [str(p) for p in sorted(set(after) | set(before)) if after.get(p) != before.get(p)]
    assert not changed, f"{row.id}: written: {changed}"


DIGITS = """[model]
d_model = 8
heads = 2
d_ff = 16
n_steps = 2
T = 2.0
[train]
epochs = 1
batch_size = 16
save_every = 2
warmup_steps = 0
[eval]
n_steps = [2]
[data]
limit = 48
"""

RESUME = ("train", "--resume", "{run}", "--no-progress")
DIGITS_ROWS = run_rows(
    ("digits-test-fraction", RESUME, "data.test_fraction = 0.2 in the checkpoint, 0.25 in config.toml",
     config_edit("test_fraction = 0.2", "test_fraction = 0.25")),
    ("digits-split-seed", RESUME, "data.split_seed = 0 in the checkpoint, 5 in config.toml",
     config_edit("split_seed = 0", "split_seed = 5")),
    ("digits-limit", RESUME, "data.limit = 48 in the checkpoint, 40 in config.toml",
     config_edit("limit = 48", "limit = 40")),
    ("digits-shift", RESUME, "data.shift = 0 in the checkpoint, 1 in config.toml",
     config_edit("shift = 0", "shift = 1")),
    ("digits-lr", RESUME, "train.lr = 0.01 in the checkpoint, 0.02 in config.toml. A resume continues that run: "
     "restore the value(s) in config.toml, or start a new run with --out, or pass --allow-changes train.lr",
     config_edit("lr = 0.01", "lr = 0.02")),
    ("digits-epochs", RESUME, "train.epochs/train.max_steps = 3 in the checkpoint, 6 in config.toml",
     config_edit("epochs = 1", "epochs = 2")),
    ("digits-T", RESUME, "the model ([model] edited): encoder.t1 (T) = 2.0 in the checkpoint, 3.0 now. A resume continues that run: "
     "restore the value(s) in config.toml, or start a new run with --out. Nothing was loaded or written",
     config_edit("T = 2.0", "T = 3.0")),
    ("digits-nan-weight", RESUME, "hold(s) NaN/inf; a diverged model is not loaded",
     checkpoint_edit(first_weight(float("nan")))),
    ("digits-truncated", RESUME, "state.safetensors has 100 bytes", checkpoint_edit(size=100)),
    # issue 42, 13d and 13h: an edited checkpoint is refused, by the digest of meta.json or by its contents
    ("digits-meta-edited", RESUME, "meta.json was changed after the checkpoint was written",
     checkpoint_edit(meta=lambda m: m["trainer"].update(step=1), seal=False)),
    ("digits-step-edited", RESUME, "scheduler.last_epoch = 3 and trainer.step = 1 differ",
     checkpoint_edit(meta=lambda m: m["trainer"].update(step=1))),
    ("digits-weight-decay-edited", RESUME,
     "optimizer.param_groups[0].weight_decay = 50 and the run's TrainConfig.weight_decay = 0.05 differ",
     checkpoint_edit(meta=lambda m: m["optimizer"]["param_groups"][0].update(weight_decay=50))),
    ("digits-nan-lr", RESUME, "optimizer.param_groups[0].lr = nan in meta.json; expected a finite number in [0, inf] "
     "(the learning rate): the checkpoint was edited or damaged",
     checkpoint_edit(meta=lambda m: m["optimizer"]["param_groups"][0].update(lr=float("nan")))),
    ("digits-adam-step", RESUME, "the optimizer's update counts (optimizer.<i>.step, largest -3) and trainer.step = 3",
     checkpoint_edit(lambda t: {k: (v.clone().fill_(-3.0) if k.endswith(".step") else v) for k, v in t.items()})),
    ("digits-allow-unknown", (*RESUME, "--allow-changes", "model.T"),
     "--allow-changes: expected keys that a resume compares (data.limit, data.shift, data.split_seed, "
     "data.test_fraction, train.batch_size, train.coarse_controls, train.epochs, train.levels, "
     "train.levels_prolongation, train.levels_schedule, train.lr, train.max_steps, train.n_steps, "
     "train.n_steps_distill, train.n_steps_weights, train.seed, train.solvers, train.solvers_split, train.solvers_split_weights, "
     "train.solvers_weights, train.warmup_steps, train.weight_decay), got 'model.T'", config_edit("T = 2.0", "T = 3.0")),
)


def finished_run(tmp_path_factory, config: str) -> Path:
    """The folder of a finished ``opsplit train`` run of ``config`` (for the rows to copy)."""
    tmp = tmp_path_factory.mktemp("run")
    (tmp / "c.toml").write_text(config)
    assert main(["train", "--config", str(tmp / "c.toml"), "--out", str(tmp / "run"), "--no-progress"]) == 0
    return tmp / "run"


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    return finished_run(tmp_path_factory, DIGITS)


@pytest.mark.parametrize("row", DIGITS_ROWS)
def test_resume_refused_before_anything_is_written(row, digits_run, tmp_path, capsys, monkeypatch):
    check_run_row(row, digits_run, tmp_path, capsys, monkeypatch)
