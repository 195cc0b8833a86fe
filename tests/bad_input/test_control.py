"""Bad input to ``opsplit.control``: TrainConfig (construction, ``from_dict``, assignment),
Trainer (constructor, ``fit``, ``evaluate``), Objective, the running costs, checkpoints,
the gradient modes and the data-parallel helpers.

Every row must raise exactly the given type with a message naming the argument, from
opsplit's own checks, before any training step; rows that take an output folder also
check that nothing was written there."""

import functools
import shutil
import sys
import tempfile
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch
from torch import nn

from opsplit.control import (
    Callback,
    CheckpointError,
    CPUTimeBudget,
    Objective,
    TrainConfig,
    Trainer,
    Unsplit,
    check_out_dir,
    checkpoint_differences,
    energy_cost,
    gradient_mode,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    set_gradient_mode,
    smoothness_cost,
)
from opsplit.control import distributed as od
from opsplit.control.schema import SchemaError
from opsplit.controls import Constant
from opsplit.data import TensorData
from opsplit.models import SplitEncoder

from ._table import INF, NAN, cases, run_case

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _train_helpers import TinyClassifier, rewrite_checkpoint, tiny_config, tiny_data  # noqa: E402


def tr(**kw):
    return Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(**kw))


def assign(obj, name, value):
    setattr(obj, name, value)


def in_empty_dir(fn):
    """Run ``fn(folder)`` in a fresh folder; re-raise its error after checking that nothing
    was written there (the traceback keeps the original frames)."""
    d = Path(tempfile.mkdtemp())
    try:
        fn(d)
    except BaseException:
        left = sorted(p.name for p in d.rglob("*") if p.name != "a_file")
        if left:
            raise AssertionError(f"written before the error: {left}") from None
        raise
    finally:
        shutil.rmtree(d, ignore_errors=True)


def with_file(fn):
    def run(d):
        (d / "a_file").write_text("x")
        fn(d)

    return lambda: in_empty_dir(run)


def fit_into(data=None, model=None, objective=None, **kw):
    """``fit`` with an output folder (which must stay empty)."""
    def run(d):
        t = Trainer(model or TinyClassifier(), objective or Objective("cross_entropy"), tiny_config(**kw))
        t.fit(data if data is not None else tiny_data(), out_dir=d / "run")

    return lambda: in_empty_dir(run)


class NoSteps(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x):
        return self.lin(x.mean(1))


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3).requires_grad_(False)

    def forward(self, x):
        return self.lin(x.mean(1))


class Pair(NoSteps):
    def forward(self, x):
        return self.lin(x.mean(1)), x


def nan_model():
    m = TinyClassifier()
    with torch.no_grad():
        m.head.bias[0] = NAN
    return m


def saved(tmp=None, **kw):
    d = Path(tempfile.mkdtemp())
    return save_checkpoint(d / "ck", SplitEncoder(8, 2, 16, n_steps=2, T=2.0, **kw))


def enc(**kw):
    return SplitEncoder(8, 2, 16, n_steps=2, T=2.0, **kw)


@functools.cache
def _trained() -> Path:
    """A finished run's checkpoint (model, AdamW state, counters; its data recorded in
    TrainConfig.extra)."""
    d = Path(tempfile.mkdtemp())
    Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(epochs=1, extra={"data.split_seed": 0})).fit(
        tiny_data(), out_dir=d / "run", plot=False)
    return latest_checkpoint(d / "run")


def forged(tensors=None, meta=None) -> Path:
    """A copy of :func:`_trained` edited consistently (its SHA-256 and index match)."""
    ck = Path(tempfile.mkdtemp()) / "ck"
    shutil.copytree(_trained(), ck)
    return rewrite_checkpoint(ck, tensors, meta)


def _set(key, value, like=None):
    def edit(t):
        if like is None:
            t[key] = t[key].clone()
            t[key].view(-1)[0] = value
        else:
            t[key] = t[key].to(like)
        return t

    return edit


def _opt(state):
    return lambda t: {**t, **{k: v.clone().fill_(float("inf")) for k, v in t.items() if k.endswith(state)}}


def _counter(key, value):
    def edit(m):
        m["trainer"][key] = value

    return edit


def save_inf_optimizer(d):
    """Save a trained model with its AdamW optimizer whose ``exp_avg_sq`` overflowed."""
    t = trainer_of()
    t.fit(tiny_data())
    for st in t.optimizer.state.values():
        st["exp_avg_sq"].fill_(INF)
    save_checkpoint(d / "ck", t.model, optimizer=t.optimizer)


def trainer_of(model=None, **kw):
    return Trainer(model or TinyClassifier(), Objective("cross_entropy"), tiny_config(epochs=1, **kw))


X = torch.randn(6, 5, 8)
Y = torch.tensor([0, 1, 2, 0, 1, 2])

CONFIG = cases(
    ("epochs=0", lambda: TrainConfig(epochs=0), ValueError, r"TrainConfig\.epochs: expected an integer >= 1"),
    ("epochs=2.5", lambda: TrainConfig(epochs=2.5), TypeError, r"TrainConfig\.epochs: expected an integer"),
    ("epochs-str", lambda: TrainConfig(epochs="10"), TypeError, r"TrainConfig\.epochs"),
    ("max_steps=0", lambda: TrainConfig(max_steps=0), ValueError, r"TrainConfig\.max_steps.*>= 1"),
    ("batch_size=0", lambda: TrainConfig(batch_size=0), ValueError, r"TrainConfig\.batch_size.*>= 1"),
    ("batch_size=True", lambda: TrainConfig(batch_size=True), TypeError, r"TrainConfig\.batch_size"),
    ("eval_batch_size<0", lambda: TrainConfig(eval_batch_size=-1), ValueError, r"TrainConfig\.eval_batch_size"),
    ("optimizer", lambda: TrainConfig(optimizer="rmsprop"), ValueError, r"TrainConfig\.optimizer: expected one of"),
    ("optimizer=None", lambda: TrainConfig(optimizer=None), ValueError, r"TrainConfig\.optimizer"),
    ("lr=0", lambda: TrainConfig(lr=0.0), ValueError, r"TrainConfig\.lr: expected a number > 0"),
    ("lr=inf", lambda: TrainConfig(lr=INF), ValueError, r"TrainConfig\.lr: expected a finite number"),
    ("lr=nan", lambda: TrainConfig(lr=NAN), ValueError, r"TrainConfig\.lr: expected a finite number"),
    ("lr-str", lambda: TrainConfig(lr="1e-3"), TypeError, r"TrainConfig\.lr: expected a number"),
    ("weight_decay<0", lambda: TrainConfig(weight_decay=-0.1), ValueError, r"TrainConfig\.weight_decay.*>= 0"),
    ("betas-one", lambda: TrainConfig(betas=(0.9,)), TypeError, r"TrainConfig\.betas: expected a pair"),
    ("betas-str", lambda: TrainConfig(betas="ab"), TypeError, r"TrainConfig\.betas: expected a pair"),
    ("betas=1", lambda: TrainConfig(betas=(0.9, 1.0)), ValueError, r"TrainConfig\.betas: expected a number < 1"),
    ("momentum=1", lambda: TrainConfig(momentum=1.0), ValueError, r"TrainConfig\.momentum.*< 1"),
    ("schedule", lambda: TrainConfig(schedule="step"), ValueError, r"TrainConfig\.schedule: expected one of"),
    ("warmup<0", lambda: TrainConfig(warmup_steps=-1), ValueError, r"TrainConfig\.warmup_steps.*>= 0"),
    ("min_lr_ratio>1", lambda: TrainConfig(min_lr_ratio=1.5), ValueError, r"TrainConfig\.min_lr_ratio.*\[0, 1\]"),
    ("grad_clip=0", lambda: TrainConfig(grad_clip=0.0), ValueError, r"TrainConfig\.grad_clip.*> 0"),
    ("grad_clip=inf", lambda: TrainConfig(grad_clip=INF), ValueError, r"TrainConfig\.grad_clip.*finite"),
    ("gradient", lambda: TrainConfig(gradient="forward"), ValueError, r"TrainConfig\.gradient: expected one of"),
    ("checkpoint_every=0", lambda: TrainConfig(checkpoint_every=0), ValueError, r"TrainConfig\.checkpoint_every"),
    ("snapshots=0", lambda: TrainConfig(checkpoint_snapshots=0), ValueError, r"TrainConfig\.checkpoint_snapshots"),
    ("n_steps=[]", lambda: TrainConfig(n_steps=[]), TypeError, r"TrainConfig\.n_steps"),
    ("n_steps=[0]", lambda: TrainConfig(n_steps=[0]), ValueError, r"TrainConfig\.n_steps.*>= 1"),
    ("seed<0", lambda: TrainConfig(seed=-1), ValueError, r"TrainConfig\.seed.*>= 0"),
    ("seed>=2**32", lambda: TrainConfig(seed=2**50), ValueError, r"TrainConfig\.seed.*2\*\*32"),
    ("shuffle-str", lambda: TrainConfig(shuffle="yes"), TypeError, r"TrainConfig\.shuffle: expected true or false"),
    ("eval_every=0", lambda: TrainConfig(eval_every=0), ValueError, r"TrainConfig\.eval_every"),
    ("save_every=0", lambda: TrainConfig(save_every=0), ValueError, r"TrainConfig\.save_every"),
    ("keep=0", lambda: TrainConfig(keep_checkpoints=0), ValueError, r"TrainConfig\.keep_checkpoints"),
    ("progress=1", lambda: TrainConfig(progress=1), TypeError, r"TrainConfig\.progress"),
    ("extra-list", lambda: TrainConfig(extra=[]), TypeError, r"TrainConfig\.extra: expected a dict"),
    ("from_dict-unknown", lambda: TrainConfig.from_dict({"learning_rate": 1e-3}), ValueError,
     r"TrainConfig: unknown key\(s\) \['learning_rate'\]"),
    ("from_dict-list", lambda: TrainConfig.from_dict([1]), TypeError, r"TrainConfig\.from_dict: expected a dict"),
    ("replace-unknown", lambda: TrainConfig().replace(learning_rate=1e-3), ValueError,
     r"TrainConfig: unknown key\(s\) \['learning_rate'\]"),
    ("assign-optimizer", lambda: assign(TrainConfig(), "optimizer", "rmsprop"), ValueError,
     r"TrainConfig\.optimizer: expected one of"),
    ("assign-lr", lambda: assign(TrainConfig(), "lr", -1), ValueError, r"TrainConfig\.lr"),
    ("assign-unknown", lambda: assign(TrainConfig(), "learning_rate", 1e-3), AttributeError,
     r"TrainConfig: unknown field 'learning_rate'"),
    ("assign-trainer-config", lambda: assign(tr().config, "lr", 0.1), FrozenInstanceError,
     r"TrainConfig\.lr: this config belongs to a Trainer"),
)

TRAINER = cases(
    ("model-int", lambda: Trainer(3, Objective()), TypeError, r"Trainer\.model: expected an nn\.Module"),
    ("objective-str", lambda: Trainer(TinyClassifier(), "mse"), TypeError, r"Trainer\.objective"),
    ("config-list", lambda: Trainer(TinyClassifier(), Objective(), [1]), TypeError, r"Trainer\.config"),
    ("config-dict-unknown", lambda: Trainer(TinyClassifier(), Objective(), {"rate": 1}), ValueError,
     r"TrainConfig: unknown key\(s\) \['rate'\]"),
    ("override-lr", lambda: Trainer(TinyClassifier(), Objective(), lr=-1.0), ValueError, r"TrainConfig\.lr"),
    ("override-unknown", lambda: Trainer(TinyClassifier(), Objective(), rate=1.0), ValueError,
     r"TrainConfig: unknown key\(s\) \['rate'\]"),
    ("no-trainable", lambda: Trainer(Frozen(), Objective()), ValueError, r"Trainer\.model: .*no trainable"),
    ("augment", lambda: Trainer(TinyClassifier(), Objective(), augment=3), TypeError, r"Trainer\.augment"),
    ("metrics-list", lambda: Trainer(TinyClassifier(), Objective(), metrics=[1]), TypeError,
     r"Trainer\.metrics: expected a dict"),
    ("metrics-not-callable", lambda: Trainer(TinyClassifier(), Objective(), metrics={"f1": 1}), TypeError,
     r"Trainer\.metrics\['f1'\]: expected a callable"),
    ("forward_model-int", lambda: Trainer(TinyClassifier(), Objective(), forward_model=3), TypeError,
     r"Trainer\.forward_model: expected an nn\.Module"),
    ("rank>=world", lambda: Trainer(TinyClassifier(), Objective(), rank=2, world_size=2), ValueError,
     r"0 <= rank < world_size"),
    ("world_size=0", lambda: Trainer(TinyClassifier(), Objective(), world_size=0), ValueError, r"world_size"),
    ("rank-float", lambda: Trainer(TinyClassifier(), Objective(), rank=1.0), TypeError, r"Trainer\.rank"),
)

FIT = cases(
    ("data-None", lambda: tr().fit(None), ValueError, r"train_data: expected a dataset, got None"),
    ("data-list", lambda: tr().fit([1, 2, 3]), TypeError, r"train_data: expected an opsplit\.data\.TensorData"),
    ("data-unequal", lambda: tr().fit((X, Y[:4])), ValueError, r"train_data: inputs have 6 samples, targets 4"),
    ("data-empty", lambda: tr().fit((X[:0], Y[:0])), ValueError, r"train_data: empty dataset"),
    ("data-nan", lambda: tr().fit((X.clone().fill_(NAN), Y)), ValueError, r"train_data\.inputs: expected finite"),
    ("eval-list", lambda: tr().fit(tiny_data(), [1]), TypeError, r"eval_data: expected"),
    ("mse-shape", fit_into(objective=Objective("mse")), ValueError, r"loss 'mse': model output shape"),
    ("ce-range", fit_into(TensorData(X, Y + 5)), ValueError, r"class indices in \[0, 2\]"),
    ("ce-float-targets", fit_into(TensorData(X, Y.double())), TypeError, r"integer class targets"),
    ("out_dir-file", with_file(lambda d: tr().fit(tiny_data(), out_dir=d / "a_file")), ValueError,
     r"Trainer\.fit\.out_dir: .* is a file"),
    ("out_dir-in-file", with_file(lambda d: tr().fit(tiny_data(), out_dir=d / "a_file" / "run")), ValueError,
     r"Trainer\.fit\.out_dir: .* cannot be created"),
    ("out_dir-int", lambda: tr().fit(tiny_data(), out_dir=3), TypeError, r"Trainer\.fit\.out_dir: expected a folder"),
    ("out_dir-empty", lambda: tr().fit(tiny_data(), out_dir=""), ValueError, r"Trainer\.fit\.out_dir: .*empty"),
    ("resume-missing", lambda: in_empty_dir(lambda d: tr().fit(tiny_data(), out_dir=d / "run", resume=d / "none")),
     FileNotFoundError, r"resume: no checkpoint found"),
    ("resume-int", lambda: tr().fit(tiny_data(), resume=3), TypeError, r"resume: expected a folder path"),
    ("resume-another-map", lambda: tr().fit(tiny_data(), resume=save_checkpoint(
        Path(tempfile.mkdtemp()) / "ck", TinyClassifier(T=4.0))), CheckpointError, r"t1 \(T\) = 4\.0"),
    ("plot-str", lambda: tr().fit(tiny_data(), plot="yes"), TypeError, r"Trainer\.fit\.plot"),
    ("allow_changes-int", lambda: tr().fit(tiny_data(), allow_changes=3), TypeError, r"Trainer\.fit\.allow_changes"),
    ("drop_last-ddp", lambda: Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config(), rank=0,
                                       world_size=2).fit(tiny_data()), ValueError, r"TrainConfig\.drop_last"),
    ("no-batch", fit_into(batch_size=64, drop_last=True), ValueError, r"train_data: 40 samples give no batch"),
    ("n_steps-model", fit_into(model=NoSteps(), n_steps=[2]), TypeError,
     r"TrainConfig\.n_steps: the model's forward must take n_steps"),
    ("adjoint-no-ode", fit_into(gradient="adjoint"), ValueError, r"gradient='adjoint': the model has no smooth ODE"),
    ("checkpoint-no-prop", fit_into(model=NoSteps(), gradient="checkpoint"), ValueError,
     r"gradient='checkpoint': the model holds no opsplit Propagator"),
    ("nan-parameter", fit_into(model=nan_model()), ValueError, r"parameters must be finite|loss of the untrained"),
    ("resume-nan-weight", lambda: trainer_of(extra={"data.split_seed": 0}).fit(
        tiny_data(), resume=forged(_set("model.head.bias", NAN))), CheckpointError,
     r"the weights head\.bias hold\(s\) NaN/inf"),
    ("resume-int-weight", lambda: trainer_of(extra={"data.split_seed": 0}).fit(
        tiny_data(), resume=forged(_set("model.head.weight", None, torch.int64))), CheckpointError,
     r"'head\.weight' is torch\.int64 in the checkpoint, torch\.float32 in the model"),
    ("resume-inf-exp_avg_sq", lambda: trainer_of(extra={"data.split_seed": 0}).fit(
        tiny_data(), resume=forged(_opt("exp_avg_sq"))), CheckpointError,
     r"optimizer state optimizer\.0\.exp_avg_sq, .* hold\(s\) NaN/inf"),
    ("resume-negative-step", lambda: trainer_of(extra={"data.split_seed": 0}).fit(
        tiny_data(), resume=forged(meta=_counter("step", -5))), CheckpointError,
     r"meta\.trainer\.step: expected >= 0, got -5"),
    ("resume-other-data", lambda: trainer_of(extra={"data.split_seed": 1}).fit(tiny_data(), resume=_trained()),
     CheckpointError, r"TrainConfig: data\.split_seed = 0 in the checkpoint, 1 now"),
    ("resume-data-dropped", lambda: trainer_of().fit(tiny_data(), resume=_trained()),
     CheckpointError, r"data\.split_seed = 0 in the checkpoint, '\(not set\)' now"),
)

EVALUATE = cases(
    ("batch_size=0", lambda: tr().evaluate(tiny_data(), batch_size=0), ValueError,
     r"Trainer\.evaluate\.batch_size: expected an integer >= 1"),
    ("batch_size<0", lambda: tr().evaluate(tiny_data(), batch_size=-1), ValueError, r"Trainer\.evaluate\.batch_size"),
    ("batch_size=2.5", lambda: tr().evaluate(tiny_data(), batch_size=2.5), TypeError,
     r"Trainer\.evaluate\.batch_size"),
    ("batch_size=True", lambda: tr().evaluate(tiny_data(), batch_size=True), TypeError,
     r"Trainer\.evaluate\.batch_size"),
    ("data-None", lambda: tr().evaluate(None), ValueError, r"eval_data: expected a dataset"),
    ("n_steps=0", lambda: tr().evaluate(tiny_data(), n_steps=0), ValueError, r"n_steps.*>= 1"),
    ("n_steps=1e12", lambda: tr().evaluate(tiny_data(), n_steps=10**12), ValueError,
     r"Trainer\.evaluate\.n_steps: N_t = 1000000000000 steps need a time grid of 1000000000001 times"),
    ("n_steps=2**62", lambda: tr().evaluate(tiny_data(), n_steps=2**62), ValueError, r"Trainer\.evaluate\.n_steps"),
    ("n_steps=1.5", lambda: tr().evaluate(tiny_data(), n_steps=1.5), TypeError,
     r"Trainer\.evaluate\.n_steps: expected an integer >= 1, got 1\.5"),
    ("n_steps=True", lambda: tr().evaluate(tiny_data(), n_steps=True), TypeError, r"Trainer\.evaluate\.n_steps"),
)

OBJECTIVE = cases(
    ("loss-name", lambda: Objective("l1"), ValueError, r"Objective\.loss: expected one of"),
    ("loss-int", lambda: Objective(3), TypeError, r"Objective\.loss"),
    ("smoothness<0", lambda: Objective(smoothness=-1.0), ValueError, r"Objective\.smoothness: expected a finite"),
    ("energy=nan", lambda: Objective(energy=NAN), ValueError, r"Objective\.energy: expected a finite"),
    ("energy=inf", lambda: Objective(energy=INF), ValueError, r"Objective\.energy: expected a finite"),
    ("smoothness-str", lambda: Objective(smoothness="0.1"), TypeError, r"Objective\.smoothness: expected a number"),
    ("output-int", lambda: Objective(output=3), TypeError, r"Objective\.output"),
    ("controls-int", lambda: Objective(controls=3), TypeError, r"Objective\.controls: expected"),
    ("controls-not-control", lambda: Objective(controls=[nn.Linear(2, 2)]), TypeError,
     r"Objective\.controls: expected opsplit controls"),
    ("check-targets", lambda: Objective().check(torch.zeros(2, 3), [0, 1]), TypeError, r"targets: expected a torch"),
    ("tuple-output", lambda: Objective("cross_entropy")(Pair(), X, Y), TypeError,
     r"model output: the model returned a tuple.*Objective\(output=\.\.\.\)"),
    ("output-attr", lambda: Objective("cross_entropy", output="logits")(NoSteps(), X, Y), ValueError,
     r"Objective\.output: the model output has no attribute 'logits'"),
    ("callable-shape", lambda: Objective(lambda o, t: o)(NoSteps(), X, Y), ValueError,
     r"Objective\.loss: the callable returned shape \(6, 3\)"),
    ("callable-float", lambda: Objective(lambda o, t: 1.0)(NoSteps(), X, Y), TypeError,
     r"Objective\.loss: the callable returned float"),
)

COSTS = cases(
    ("interval-reversed", lambda: energy_cost(enc(), default_interval=(1.0, 0.0)), ValueError,
     r"energy_cost\.default_interval: expected t0 < T"),
    ("interval-str", lambda: energy_cost(enc(), default_interval="ab"), TypeError,
     r"energy_cost\.default_interval: expected a pair"),
    ("interval-nan", lambda: energy_cost(enc(), default_interval=(0.0, NAN)), ValueError,
     r"energy_cost\.default_interval"),
    ("constant-no-interval", lambda: energy_cost(enc(), controls=[Constant(nn.Parameter(torch.ones(3)))]), ValueError,
     r"energy_cost: Constant carries no time interval"),
    ("smoothness-model-int", lambda: smoothness_cost(3), TypeError, r"smoothness_cost\.model: expected an nn\.Module"),
    ("energy-model-int", lambda: energy_cost(3), TypeError, r"energy_cost\.model: expected an nn\.Module"),
    ("smoothness-controls-int", lambda: smoothness_cost(enc(), controls=[3]), TypeError,
     r"smoothness_cost\.controls: expected opsplit controls"),
    ("energy-controls-int", lambda: energy_cost(enc(), controls=3), TypeError, r"energy_cost\.controls: expected"),
)

CHECKPOINTS = cases(
    ("save-model-int", lambda: in_empty_dir(lambda d: save_checkpoint(d / "ck", 3)), TypeError,
     r"save_checkpoint\.model: expected an nn\.Module"),
    ("save-path-int", lambda: save_checkpoint(3, enc()), TypeError, r"save_checkpoint\.path: expected a folder path"),
    ("save-nonfinite", lambda: in_empty_dir(lambda d: save_checkpoint(d / "ck", nan_model())), ValueError,
     r"save_checkpoint\.model: head\.bias hold\(s\) NaN/inf"),
    ("save-in-file", with_file(lambda d: save_checkpoint(d / "a_file" / "ck", enc())), ValueError,
     r"save_checkpoint\.path: .* cannot be created"),
    ("load-missing", lambda: load_checkpoint("/nonexistent/ck", enc()), CheckpointError, r"not a folder"),
    ("load-model-int", lambda: load_checkpoint(saved(), 3), TypeError, r"load_checkpoint\.model: expected an nn"),
    ("load-allow-int", lambda: load_checkpoint(saved(), enc(), allow_changes=3), TypeError,
     r"load_checkpoint\.allow_changes"),
    ("load-allow-ints", lambda: load_checkpoint(saved(), enc(), allow_changes=[1]), TypeError,
     r"load_checkpoint\.allow_changes: expected setting names"),
    ("load-another-T", lambda: load_checkpoint(saved(), SplitEncoder(8, 2, 16, n_steps=2, T=4.0)), CheckpointError,
     r"t1 \(T\) = 2\.0 in the checkpoint, 4\.0 in the model"),
    ("load-causal", lambda: load_checkpoint(saved(), enc(causal=True)), CheckpointError,
     r"causal = False in the checkpoint, True in the model"),
    ("load-scheme", lambda: load_checkpoint(saved(), enc(scheme="strang")), CheckpointError,
     r"scheme = 'Hybrid .* in the checkpoint, 'Strang"),
    ("load-shape", lambda: load_checkpoint(saved(), SplitEncoder(8, 2, 32, n_steps=2, T=2.0)), CheckpointError,
     r"has shape .*, the model's is"),
    ("read-file", with_file(lambda d: read_checkpoint(d / "a_file")), CheckpointError, r"not a folder"),
    ("read-int", lambda: read_checkpoint(3), TypeError, r"read_checkpoint\.path: expected a folder path"),
    ("differences-model-int", lambda: checkpoint_differences(saved(), 3), TypeError,
     r"checkpoint_differences\.model: expected an nn\.Module"),
    ("latest-int", lambda: latest_checkpoint(3), TypeError, r"latest_checkpoint\.folder: expected a folder path"),
    ("check_out_dir-None", lambda: check_out_dir(None), TypeError, r"out_dir: expected a folder path"),
    # reading refuses what writing refuses (a checkpoint edited with its SHA-256 made to match)
    ("load-nan-weight", lambda: load_checkpoint(forged(_set("model.head.weight", NAN)), TinyClassifier()),
     CheckpointError, r"the weights head\.weight hold\(s\) NaN/inf; a diverged model is not loaded"),
    ("load-inf-weight", lambda: load_checkpoint(forged(_set("model.head.bias", -INF)), TinyClassifier()),
     CheckpointError, r"the weights head\.bias hold\(s\) NaN/inf"),
    ("load-int-weight", lambda: load_checkpoint(forged(_set("model.head.weight", None, torch.int64)), TinyClassifier()),
     CheckpointError, r"a tensor of another kind \(integer for floating\) is not cast"),
    ("load-bool-weight", lambda: load_checkpoint(forged(_set("model.head.bias", None, torch.bool)), TinyClassifier()),
     CheckpointError, r"'head\.bias' is torch\.bool in the checkpoint, torch\.float32 in the model"),
    ("load-complex-weight", lambda: load_checkpoint(forged(_set("model.head.bias", None, torch.complex64)),
                                                    TinyClassifier()),
     CheckpointError, r"\(complex for floating\) is not cast"),
    ("load-negative-step", lambda: load_checkpoint(forged(meta=_counter("step", -5)), TinyClassifier()),
     CheckpointError, r"meta\.trainer\.step: expected >= 0, got -5"),
    ("load-float-step", lambda: load_checkpoint(forged(meta=_counter("step", 2.5)), TinyClassifier()),
     CheckpointError, r"meta\.trainer\.step: expected integer, got float"),
    ("load-negative-elapsed", lambda: load_checkpoint(forged(meta=_counter("elapsed", -1.0)), TinyClassifier()),
     CheckpointError, r"meta\.trainer\.elapsed: expected >= 0"),
    ("load-world-size-0", lambda: load_checkpoint(forged(meta=_counter("world_size", 0)), TinyClassifier()),
     CheckpointError, r"meta\.trainer\.world_size: expected >= 1"),
    ("load-inf-exp_avg_sq", lambda: load_checkpoint(forged(_opt("exp_avg_sq")), TinyClassifier(),
                                                    optimizer=trainer_of().optimizer),
     CheckpointError, r"the optimizer state optimizer\.0\.exp_avg_sq, .*hold\(s\) NaN/inf"),
    ("load-inf-exp_avg", lambda: load_checkpoint(forged(_opt(".exp_avg")), TinyClassifier(),
                                                 optimizer=trainer_of().optimizer),
     CheckpointError, r"optimizer state optimizer\.0\.exp_avg, "),
    ("load-int-exp_avg", lambda: load_checkpoint(forged(_set("optimizer.0.exp_avg", None, torch.int64)),
                                                 TinyClassifier(), optimizer=trainer_of().optimizer),
     CheckpointError, r"optimizer: state 'exp_avg' of parameter 0 is torch\.int64, the parameter torch\.float32"),
    ("load-allow_nonfinite-str", lambda: load_checkpoint(_trained(), TinyClassifier(), allow_nonfinite="yes"),
     TypeError, r"load_checkpoint\.allow_nonfinite: expected true or false"),
    ("save-negative-step", lambda: in_empty_dir(lambda d: save_checkpoint(d / "ck", enc(), trainer={"step": -5})),
     SchemaError, r"meta\.trainer\.step: expected >= 0, got -5"),
    ("save-inf-optimizer", lambda: in_empty_dir(save_inf_optimizer),
     ValueError, r"save_checkpoint\.optimizer: its state optimizer\.0\.exp_avg_sq"),
)

GRADIENTS = cases(
    ("mode", lambda: set_gradient_mode(enc(), "forward"), ValueError, r"gradient: expected one of"),
    ("checkpoint_every=0", lambda: set_gradient_mode(enc(), "checkpoint", checkpoint_every=0), ValueError,
     r"checkpoint_every: expected an integer >= 1"),
    ("snapshots=0", lambda: set_gradient_mode(enc(), "checkpoint", snapshots=0), ValueError,
     r"snapshots: expected an integer >= 1"),
    ("checkpoint-no-prop", lambda: set_gradient_mode(NoSteps(), "checkpoint"), ValueError,
     r"gradient='checkpoint': the model holds no opsplit Propagator"),
    ("adjoint-no-ode", lambda: set_gradient_mode(enc(), "adjoint"), ValueError, r"gradient='adjoint'"),
    ("model-int", lambda: set_gradient_mode(3, "backprop"), TypeError, r"set_gradient_mode\.model: expected an nn"),
    ("context-mode", lambda: gradient_mode(enc(), "x").__enter__(), ValueError, r"gradient: expected one of"),
    ("unsplit-int", lambda: Unsplit(3), TypeError, r"Unsplit\.propagator: expected an opsplit Propagator"),
    ("unsplit-method", lambda: Unsplit(enc(), method="nope"), ValueError, r"method"),
)

DISTRIBUTED = cases(
    ("env-rank-only", lambda: od.env_from_environ({"RANK": "0"}), ValueError, r"WORLD_SIZE: not set"),
    ("env-rank-str", lambda: od.env_from_environ({"RANK": "a", "WORLD_SIZE": "2"}), ValueError,
     r"RANK: expected an integer"),
    ("env-rank>=ws", lambda: od.env_from_environ({"RANK": "2", "WORLD_SIZE": "2"}), ValueError,
     r"RANK: expected 0 <= RANK < WORLD_SIZE"),
    ("init-timeout", lambda: od.init_from_env(environ={}, timeout=-1), ValueError, r"init_from_env\.timeout"),
    ("init-device", lambda: od.init_from_env(environ={}, device="tpu"), ValueError, r"init_from_env\.device"),
    ("wrap-model-int", lambda: od.wrap(3, od.DistEnv()), TypeError, r"wrap\.model"),
    ("wrap-env-int", lambda: od.wrap(enc(), 3), TypeError, r"wrap\.env"),
)


@pytest.mark.parametrize("case", CONFIG)
def test_train_config(case):
    run_case(case)


@pytest.mark.parametrize("case", TRAINER)
def test_trainer(case):
    run_case(case)


@pytest.mark.parametrize("case", FIT)
def test_fit(case):
    run_case(case)


@pytest.mark.parametrize("case", EVALUATE)
def test_evaluate(case):
    run_case(case)


@pytest.mark.parametrize("case", OBJECTIVE)
def test_objective(case):
    run_case(case)


@pytest.mark.parametrize("case", COSTS)
def test_costs(case):
    run_case(case)


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_checkpoints(case):
    run_case(case)


@pytest.mark.parametrize("case", GRADIENTS)
def test_gradient_modes(case):
    run_case(case)


@pytest.mark.parametrize("case", DISTRIBUTED)
def test_distributed(case):
    run_case(case)


# -- issue 42: the objective's weights (11b) ----------------------------------------------------------
# a weight whose term, or its gradient's norm, overflows float32 at the untrained model: refused by its
# name before anything is written (training used to stop at step 0, its folder created)
ISSUE42_WEIGHTS = cases(
    ("kinetic-1e308-trainer", lambda: Trainer(TinyClassifier(), Objective("cross_entropy", kinetic=1e308)), ValueError,
     r"^Objective\.kinetic: a weight of 1e\+308 is beyond the largest float32 number \(3\.4e\+38\), in which the "
     r"objective is computed"),
    ("kinetic-1e308-fit", fit_into(objective=Objective("cross_entropy", kinetic=1e308)), ValueError,
     r"^Objective\.kinetic: a weight of 1e\+308 is beyond the largest float32 number"),
    ("kinetic-gradient-overflow", fit_into(objective=Objective("cross_entropy", kinetic=1e38)), ValueError,
     r"^Objective\.kinetic: the weight 1e\+38 times the gradient of the flow's kinetic energy \(norm .*\) of the "
     r"untrained model on 2 training samples has a norm of .*, whose square overflows float32 .*; expected a weight "
     r"below .*e\+1[89]"),
    ("smoothness-term-overflow", fit_into(objective=Objective("cross_entropy", smoothness=1e37)), ValueError,
     r"^Objective\.smoothness: the weight 1e\+37 times the controls' smoothness cost .* is not finite in float32 .*"
     r"expected a weight below .*e\+36"),
    ("energy-gradient-overflow", fit_into(objective=Objective("cross_entropy", energy=1e19)), ValueError,
     r"^Objective\.energy: the weight 1e\+19 times the gradient of the controls' energy cost"),
    ("defect-1e39", lambda: Trainer(TinyClassifier(), Objective("cross_entropy", defect=1e39)), ValueError,
     r"^Objective\.defect: a weight of 1e\+39 is beyond the largest float32 number"),
)


@pytest.mark.parametrize("case", ISSUE42_WEIGHTS)
def test_issue42_objective_weights(case):
    run_case(case)


# -- issue 42: an edited checkpoint (13d, 13h) ---------------------------------------------------------
def _edited(seal=True, **edits):
    """A copy of the trained run's checkpoint with ``meta.json`` edited: ``edits`` maps a path
    ``"a.b.0.c"`` to its new value; ``seal=False`` leaves the digest the tensor file records
    (an edit by hand), ``seal=True`` makes it match (only the checks of the contents refuse)."""
    def edit(m):
        for path, value in edits.items():
            *head, last = path.split(".")
            node = m
            for k in head:
                node = node[int(k)] if isinstance(node, list) else node[k]
            node[int(last) if isinstance(node, list) else last] = value

    ck = Path(tempfile.mkdtemp()) / "ck"
    shutil.copytree(_trained(), ck)
    return rewrite_checkpoint(ck, meta=edit, seal=seal)


def _steps_to(value):
    return lambda t: {k: (torch.full_like(v, value) if k.endswith(".step") else v) for k, v in t.items()}


def resume_from(ck_fn):
    return lambda: trainer_of(extra={"data.split_seed": 0}).fit(tiny_data(), resume=ck_fn())


def load_into(ck_fn):
    """``load_checkpoint`` with the trainer's optimizer and scheduler (not through Trainer.load)."""
    def call():
        t = trainer_of(extra={"data.split_seed": 0})
        load_checkpoint(ck_fn(), t.model, optimizer=t.optimizer, scheduler=t.scheduler)

    return call


_EDITED = r"the checkpoint was edited or damaged"
ISSUE42_CHECKPOINTS = cases(
    # the digest: meta.json edited by hand (its SHA-256 in state.safetensors no longer matches)
    ("digest-step", resume_from(lambda: _edited(seal=False, **{"trainer.step": 2})), CheckpointError,
     r"meta\.json was changed after the checkpoint was written \(its contents do not match the SHA-256 recorded in "
     r"state\.safetensors\)"),
    ("digest-weight_decay", load_into(lambda: _edited(seal=False, **{"optimizer.param_groups.0.weight_decay": 50})),
     CheckpointError, r"meta\.json was changed after the checkpoint was written"),
    ("digest-created", load_into(lambda: _edited(seal=False, created="2020-01-01")), CheckpointError,
     r"meta\.json was changed after the checkpoint was written"),
    # the contents, with the digest made to match: the counters, optimizer and schedule against each other
    ("step-6-to-2", resume_from(lambda: _edited(**{"trainer.step": 2})), CheckpointError,
     r"scheduler\.last_epoch = 3 and trainer\.step = 2 differ \(the schedule steps once per optimizer step\) in its "
     r"metadata; " + _EDITED),
    ("step-1e6", resume_from(lambda: _edited(**{"trainer.step": 10**6})), CheckpointError,
     r"trainer\.step = 1000000 is beyond trainer\.total_steps = 3 \(a run stops at its total\)"),
    ("step-1e6-total-1e6", resume_from(lambda: _edited(**{"trainer.step": 10**6, "trainer.total_steps": 10**6})),
     CheckpointError, r"scheduler\.last_epoch = 3 and trainer\.step = 1000000 differ"),
    ("step-and-schedule", resume_from(lambda: _edited(**{"trainer.step": 2, "scheduler.state.last_epoch": 2,
                                                          "scheduler.state._step_count": 3})), CheckpointError,
     r"the optimizer's update counts \(optimizer\.<i>\.step, largest 3\) and trainer\.step = 2 differ"),
    ("weight_decay-50", resume_from(lambda: _edited(**{"optimizer.param_groups.0.weight_decay": 50})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.weight_decay = 50 and the run's TrainConfig\.weight_decay = 0\.01 differ"),
    ("betas-2", resume_from(lambda: _edited(**{"optimizer.param_groups.0.betas": [2.0, 0.999]})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.betas = \[2\.0, 0\.999\] and the run's TrainConfig\.betas = \[0\.9, 0\.999\] differ"),
    ("betas-2-load", load_into(lambda: _edited(**{"optimizer.param_groups.0.betas": [2.0, 0.999]})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.betas\[0\] = 2\.0 in meta\.json; expected a finite number in \[0, 1\) \(Adam's "
     r"averaging factors\): " + _EDITED),
    ("base_lrs-30", resume_from(lambda: _edited(**{"scheduler.state.base_lrs": [30]})), CheckpointError,
     r"scheduler\.base_lrs\[0\] = 30 but optimizer\.param_groups\[0\]\.initial_lr = 0\.01 in meta\.json; expected "
     r"equal rates"),
    ("base_lrs-negative", resume_from(lambda: _edited(**{"scheduler.state.base_lrs": [-1]})), CheckpointError,
     r"scheduler\.base_lrs\[0\] = -1 in meta\.json; expected a finite number in \[0, inf\] \(a learning rate\)"),
    ("initial_lr-and-base_lrs-30", resume_from(lambda: _edited(**{"scheduler.state.base_lrs": [30],
                                                                   "optimizer.param_groups.0.initial_lr": 30})),
     CheckpointError, r"optimizer\.param_groups\[0\]\.initial_lr = 30 and the run's TrainConfig\.lr = 0\.01 differ"),
    ("lr-above-base", resume_from(lambda: _edited(**{"optimizer.param_groups.0.lr": 5.0,
                                                     "scheduler.state._last_lr": [5.0]})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.lr = 5\.0 is above its base rate initial_lr = 0\.01"),
    ("last_epoch-negative", resume_from(lambda: _edited(**{"scheduler.state.last_epoch": -50})), CheckpointError,
     r"scheduler\.last_epoch = -50 and trainer\.step = 3 differ"),
    ("last_epoch-negative-load", load_into(lambda: _edited(**{"scheduler.state.last_epoch": -50})), CheckpointError,
     r"scheduler\.last_epoch = -50 in meta\.json; expected an integer >= 0"),
    ("adam-step-0", resume_from(lambda: forged(_steps_to(0.0))), CheckpointError,
     r"the optimizer's update counts \(optimizer\.<i>\.step, largest 0\) and trainer\.step = 3 differ"),
    ("adam-step-0-load", load_into(lambda: forged(_steps_to(0.0))), CheckpointError,
     r"the optimizer state optimizer\.0\.step = 0\.0; expected an integer >= 1 \(the updates the parameter received\)"),
    ("adam-step-minus-3-load", load_into(lambda: forged(_steps_to(-3.0))), CheckpointError,
     r"the optimizer state optimizer\.0\.step = -3\.0; expected an integer >= 1"),
    ("adam-step-fraction-load", load_into(lambda: forged(_steps_to(2.5))), CheckpointError,
     r"the optimizer state optimizer\.0\.step = 2\.5; expected an integer >= 1"),
    ("exp_avg_sq-negative", resume_from(lambda: forged(lambda t: {k: (-v.abs() - 1 if k.endswith("exp_avg_sq") else v)
                                                                  for k, v in t.items()})), CheckpointError,
     r"the optimizer state optimizer\.0\.exp_avg_sq holds negative values; expected values >= 0"),
    # issue 42, 13h: a NaN rate edited into meta.json blames the checkpoint, not "parameters must be finite"
    ("lr-nan", resume_from(lambda: _edited(**{"optimizer.param_groups.0.lr": float("nan")})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.lr = nan in meta\.json; expected a finite number in \[0, inf\] \(the learning "
     r"rate\): " + _EDITED),
    ("eps-nan", resume_from(lambda: _edited(**{"optimizer.param_groups.0.eps": float("nan")})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.eps = nan in meta\.json; expected a finite number in \(0, inf\]"),
    ("eps-zero", load_into(lambda: _edited(**{"optimizer.param_groups.0.eps": 0.0})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.eps = 0\.0 in meta\.json; expected a finite number in \(0, inf\]"),
    ("lr-string", load_into(lambda: _edited(**{"optimizer.param_groups.0.lr": "nan"})), CheckpointError,
     r"optimizer\.param_groups\[0\]\.lr = 'nan' in meta\.json; expected a finite number"),
    ("weight_decay-inf", load_into(lambda: _edited(**{"optimizer.param_groups.0.weight_decay": float("inf")})),
     CheckpointError, r"optimizer\.param_groups\[0\]\.weight_decay = inf in meta\.json"),
)


@pytest.mark.parametrize("case", ISSUE42_CHECKPOINTS)
def test_issue42_edited_checkpoint(case):
    run_case(case)


# -- issue 42: the size guard of n_steps (13f) --------------------------------------------------
ISSUE42_SIZE = cases(
    ("n_steps-1e9", fit_into(n_steps=[2, 10**9]), ValueError,
     r"^TrainConfig\.n_steps: N_t = 1000000000 in a training step of batch_size 16 \(backprop gradients\): at "
     r"least .* of memory \(a time grid of 1000000001 times: 32 GB; 3e\+09 states of 2\.56 kB kept for the backward "
     r"pass: 7\.68 TB\) and 3e\+09 substep calls per step before the first step, more than the .* available; expected "
     r"smaller N_t in n_steps$"),
    ("n_steps-1e12-checkpoint", fit_into(n_steps=[10**12], gradient="checkpoint"), ValueError,
     r"^TrainConfig\.n_steps: N_t = 1000000000000 in a training step of batch_size 16 \(checkpoint gradients\): "
     r"at least 32 TB of memory \(a time grid of 1000000000001 times: 32 TB\)"),
)


@pytest.mark.parametrize("case", ISSUE42_SIZE)
def test_issue42_size_guard(case):
    run_case(case)


# -- issue 43: the trainer's extension points and the config's former names -------------------------
class _BadProgress(Callback):
    def progress(self, trainer):
        return float("nan")


def _trained_step():
    t = Trainer(TinyClassifier(), Objective("cross_entropy"), tiny_config())
    return t


def _replace(mapping, state_map=None):
    t = _trained_step()
    t.replace_parameters(mapping(t), state_map=state_map)


ISSUE43 = cases(
    ("callbacks-one", lambda: Trainer(TinyClassifier(), Objective("cross_entropy"), callbacks=CPUTimeBudget(1.0)),
     TypeError, r"^Trainer\.callbacks: expected a list of opsplit\.control\.Callback"),
    ("callbacks-function", lambda: Trainer(TinyClassifier(), Objective("cross_entropy"), callbacks=[print]),
     TypeError, r"^Trainer\.callbacks\[0\]: expected an opsplit\.control\.Callback \(subclass it"),
    ("callback-progress-nan", lambda: Trainer(TinyClassifier(), Objective("cross_entropy"),
                                              tiny_config(schedule="cosine", warmup_steps=0),
                                              callbacks=[_BadProgress()]),
     TypeError, r"^_BadProgress\.progress: expected a finite number in \[0, 1\] or None, got nan"),
    ("budget-zero", lambda: CPUTimeBudget(0), ValueError, r"^CPUTimeBudget\.seconds: expected a finite number of "
     r"seconds > 0, got 0"),
    ("budget-nan", lambda: CPUTimeBudget(NAN), ValueError, r"^CPUTimeBudget\.seconds"),
    ("budget-str", lambda: CPUTimeBudget("60"), TypeError, r"^CPUTimeBudget\.seconds: expected a number"),
    ("budget-clock", lambda: CPUTimeBudget(1.0, clock=3.0), TypeError, r"^CPUTimeBudget\.clock: expected a callable"),
    ("budget-state", lambda: CPUTimeBudget(1.0).load_state_dict({"spent": -1.0}), ValueError,
     r"^CPUTimeBudget\.load_state_dict: expected \{'spent': seconds >= 0\}"),
    ("train_step-float-indices", lambda: _trained_step().train_step(tiny_data(), torch.tensor([0.0, 1.0])),
     TypeError, r"^Trainer\.train_step\.indices: expected a non-empty 1-D integer tensor"),
    ("train_step-out-of-range", lambda: _trained_step().train_step(tiny_data(), [0, 40]), ValueError,
     r"^Trainer\.train_step\.indices: expected indices in \[0, 39\] \(data has 40 samples\), got range \[0, 40\]"),
    ("train_step-empty", lambda: _trained_step().train_step(tiny_data(), []), TypeError,
     r"^Trainer\.train_step\.indices"),
    ("train_step-data", lambda: _trained_step().train_step([1, 2, 3]), TypeError, r"^Trainer\.train_step\.data"),
    ("replace-not-dict", lambda: _trained_step().replace_parameters([]), TypeError,
     r"^Trainer\.replace_parameters\.old_to_new: expected a non-empty dict"),
    ("replace-foreign", lambda: _replace(lambda t: {nn.Parameter(torch.zeros(2)): nn.Parameter(torch.zeros(3))}),
     ValueError, r"^Trainer\.replace_parameters\.old_to_new: a key is not a parameter this trainer trains"),
    ("replace-tensor", lambda: _replace(lambda t: {t.params[0]: torch.zeros(3)}), TypeError,
     r"^Trainer\.replace_parameters\.old_to_new\[.*\]: expected an nn\.Parameter that requires a gradient"),
    ("replace-twice", lambda: _replace(lambda t: {t.params[0]: t.params[1]}), ValueError,
     r"^Trainer\.replace_parameters\.old_to_new\[.*\]: the new parameter is already trained"),
    ("replace-state-map", lambda: _replace(lambda t: {t.params[0]: nn.Parameter(torch.zeros(3))}, state_map=3),
     TypeError, r"^Trainer\.replace_parameters\.state_map: expected None or a callable"),
    ("config-both-names", lambda: TrainConfig(n_steps=[2], train_n_steps=[4]), ValueError,
     r"^TrainConfig\.n_steps: given twice \(as 'n_steps' and its former name\)"),
    ("config-former-name-bad", lambda: TrainConfig(train_n_steps=[0]), ValueError,
     r"^TrainConfig\.n_steps: expected an integer >= 1, got 0"),
    ("config-shares-elsewhere", lambda: TrainConfig(n_steps=[2, 4], n_steps_weights="shares"), ValueError,
     r"^TrainConfig\.n_steps_weights: expected None, 'uniform', 'cost' or a list"),
    ("objective-relative_l2-shape", lambda: Objective("relative_l2").check(torch.ones(2, 3), torch.ones(2, 4)),
     ValueError, r"^loss 'relative_l2': model output shape \(2, 3\) and targets shape \(2, 4\) differ"),
    ("objective-ce-sequence-targets", lambda: Objective("cross_entropy").check(torch.ones(2, 5, 7),
                                                                               torch.zeros(2, 4, dtype=torch.long)),
     ValueError, r"^loss 'cross_entropy': expected targets \(2, 5\) of token ids, one per position"),
)


@pytest.mark.parametrize("case", ISSUE43)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_issue43_extension_points(case):
    run_case(case)
