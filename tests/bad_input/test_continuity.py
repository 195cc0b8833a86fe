"""Bad input to the continuous-training tools and the continuity measurement: N_t lists with
zero, negative or repeated entries and their draw weights (``TrainConfig``), flow-cost
weights that are negative or not finite (``Objective``), a flow cost with the checkpointed
loop (refused by ``Trainer.fit`` before training, nothing written), a solver that cannot run
a term and a scheme that cannot be rebuilt (``opsplit.control.continuity``,
``solved_with``), and the deduplication of validation text (``opsplit.data.dedup``)."""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from opsplit import Propagator
from opsplit.control import Objective, TrainConfig, Trainer, continuity, solved_with
from opsplit.control.flow_costs import record_flow
from opsplit.data import TensorData
from opsplit.data.dedup import deduplicate, shared_substrings
from opsplit.operators import FFNIntegral, ProjectionS1
from opsplit.schemes import Lie
from opsplit.solvers import ExplicitEuler, Implicit, SemiImplicit, Substep

from ._table import INF, NAN, cases, run_case

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _train_helpers import TinyClassifier, tiny_data  # noqa: E402


def _prop():
    return Propagator(Lie([Substep(FFNIntegral(torch.eye(3) / 3), ExplicitEuler())]), 2, t1=1.0)


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = _prop()

    def forward(self, x, n_steps=None):
        return self.p(x, n_steps=n_steps).flatten(1)


class TwoTerms(nn.Module):
    """Tokens (B, 5, 8) -> one substep of two linear terms advanced together by Heun -> (B, 5, 8)."""

    def __init__(self):
        super().__init__()
        from opsplit.solvers import Heun

        W1, W2 = (nn.Parameter(torch.eye(8) / 8) for _ in range(2))
        self.p = Propagator(Lie([Substep((FFNIntegral(W1), FFNIntegral(W2)), Heun())]), 2, t1=1.0)

    def forward(self, x, n_steps=None):
        return self.p(x, n_steps=n_steps)


DATA = TensorData(torch.randn(4, 2, 3), torch.tensor([0, 1, 2, 3]))


class NoProp(nn.Module):
    """Tokens (B, 5, 8) -> mean -> linear (3 classes): no propagator."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x, n_steps=None):
        return self.lin(x.mean(1))


def fit_in_empty_dir(**kw):
    """``Trainer.fit`` into a fresh folder; re-raise its error after checking nothing was written."""
    d = Path(tempfile.mkdtemp())
    try:
        objective = kw.pop("objective")
        model = kw.pop("model", None) or TinyClassifier()
        tr = Trainer(model, objective, TrainConfig(epochs=1, batch_size=8, progress=False, **kw))
        data = tiny_data()
        if objective.loss == "mse":
            data = TensorData(data.inputs, data.inputs.clone())
        try:
            tr.fit(data, out_dir=d / "run")
        finally:
            assert not (d / "run").exists(), "a refused run wrote its folder"
            assert tr.step == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


CASES = cases(
    # N_t lists and their draw weights
    ("n_steps-repeated", lambda: TrainConfig(n_steps=[2, 4, 2]), ValueError,
     r"TrainConfig\.n_steps: N_t = 2 is listed twice"),
    ("n_steps-negative", lambda: TrainConfig(n_steps=[4, -2]), ValueError,
     r"TrainConfig\.n_steps: expected an integer >= 1, got -2"),
    ("n_steps-zero", lambda: TrainConfig(n_steps=[0, 4]), ValueError,
     r"TrainConfig\.n_steps: expected an integer >= 1, got 0"),
    ("n_steps-float", lambda: TrainConfig(n_steps=[2.5]), TypeError, r"TrainConfig\.n_steps"),
    ("weights-without-list", lambda: TrainConfig(n_steps_weights="cost"), ValueError,
     r"TrainConfig\.n_steps_weights: weights without n_steps"),
    ("weights-length", lambda: TrainConfig(n_steps=[2, 4], n_steps_weights=[1.0]), ValueError,
     r"TrainConfig\.n_steps_weights: expected one weight per entry of n_steps \(2\), got 1"),
    ("weights-negative", lambda: TrainConfig(n_steps=[2, 4], n_steps_weights=[1.0, -1.0]), ValueError,
     r"TrainConfig\.n_steps_weights: expected finite weights > 0, got -1"),
    ("weights-nan", lambda: TrainConfig(n_steps=[2, 4], n_steps_weights=[1.0, NAN]), ValueError,
     r"TrainConfig\.n_steps_weights: expected finite weights > 0, got nan"),
    ("weights-name", lambda: TrainConfig(n_steps=[2, 4], n_steps_weights="fast"), ValueError,
     r"TrainConfig\.n_steps_weights: expected None, 'uniform', 'cost'"),
    ("weights-int", lambda: TrainConfig(n_steps=[2, 4], n_steps_weights=3), TypeError,
     r"TrainConfig\.n_steps_weights"),
    ("solvers-unknown", lambda: TrainConfig(solvers=["euler", "midpoint"]), ValueError,
     r"TrainConfig\.solvers: expected solver names from \('euler', 'heun', 'rk4'\), got 'midpoint'"),
    ("solvers-repeated", lambda: TrainConfig(solvers=["heun", "heun"]), ValueError,
     r"TrainConfig\.solvers: solver 'heun' is listed twice"),
    ("solvers-str", lambda: TrainConfig(solvers="heun"), TypeError, r"TrainConfig\.solvers"),
    ("solvers-weights-alone", lambda: TrainConfig(solvers_weights="cost"), ValueError,
     r"TrainConfig\.solvers_weights: weights without solvers"),
    ("solvers-weights-nan", lambda: TrainConfig(solvers=["euler", "heun"],
                                                      solvers_weights=[1.0, NAN]), ValueError,
     r"TrainConfig\.solvers_weights: expected finite weights > 0"),
    # issue 42, finding 11c: the length error names the list the weights weigh
    ("solvers-weights-length", lambda: TrainConfig(solvers=["euler", "heun"], solvers_weights=[1.0]),
     ValueError, r"TrainConfig\.solvers_weights: expected one weight per entry of solvers \(2\), got 1$"),
    ("solvers-weights-length-config", lambda: TrainConfig(solvers=["euler", "heun", "rk4"]).replace(
        solvers_weights=[1.0, 2.0]), ValueError,
     r"TrainConfig\.solvers_weights: expected one weight per entry of solvers \(3\), got 2$"),
    ("solvers-cannot-run-fit", lambda: fit_in_empty_dir(objective=Objective("mse"), model=TwoTerms(),
                                                              solvers=["euler"]), ValueError,
     r"solved_with\.solver: 'euler' cannot run the term FFNIntegral: ExplicitEuler advances 1 operator"),
    # the split of every batch between the training solvers
    ("split-without-solvers", lambda: TrainConfig(solvers_split=True), ValueError,
     r"TrainConfig\.solvers_split: a split of every batch between solvers needs solvers"),
    ("split-batch-too-small", lambda: TrainConfig(batch_size=2, solvers=["euler", "heun"],
                                                  solvers_weights=[3, 1], solvers_split=True), ValueError,
     r"TrainConfig\.solvers_split: a batch of 2 gives 'heun' no window"),
    ("split-str", lambda: TrainConfig(solvers=["euler", "heun"], solvers_split="yes"), TypeError,
     r"TrainConfig\.solvers_split"),
    ("split-data-parallel", lambda: Trainer(TinyClassifier(), Objective("cross_entropy"),
                                            TrainConfig(solvers=["euler", "heun"], solvers_split=True),
                                            world_size=2, rank=0), ValueError,
     r"TrainConfig\.solvers_split: the split calls the model once per solver"),
    ("split-cannot-run-fit", lambda: fit_in_empty_dir(objective=Objective("mse"), model=TwoTerms(),
                                                      solvers=["euler", "heun"], solvers_split=True),
     ValueError, r"solved_with\.solver: 'euler' cannot run the term FFNIntegral"),
    ("split-weights-without-split", lambda: TrainConfig(solvers=["euler", "heun"],
                                                        solvers_split_weights=[0.7, 0.3]), ValueError,
     r"TrainConfig\.solvers_split_weights: weights of the split's parts without solvers_split"),
    ("split-weights-length", lambda: TrainConfig(solvers=["euler", "heun"], solvers_split=True,
                                                 solvers_split_weights=[0.7, 0.2, 0.1]), ValueError,
     r"TrainConfig\.solvers_split_weights: expected one weight per solver of solvers"),
    ("split-weights-negative", lambda: TrainConfig(solvers=["euler", "heun"], solvers_split=True,
                                                   solvers_split_weights=[0.7, -0.3]), ValueError,
     r"TrainConfig\.solvers_split_weights: expected finite weights > 0, got -0\.3"),
    ("split-weights-nan", lambda: TrainConfig(solvers=["euler", "heun"], solvers_split=True,
                                              solvers_split_weights=[0.7, NAN]), ValueError,
     r"TrainConfig\.solvers_split_weights: expected finite weights > 0"),
    ("split-weights-cost", lambda: TrainConfig(solvers=["euler", "heun"], solvers_split=True,
                                               solvers_split_weights="cost"), ValueError,
     r"TrainConfig\.solvers_split_weights: expected None or .shares. \(each part weighted by its share"),
    # flow-cost weights
    ("kinetic-negative", lambda: Objective("mse", kinetic=-0.1), ValueError,
     r"Objective\.kinetic: expected a finite weight >= 0, got -0\.1"),
    ("kinetic-nan", lambda: Objective("mse", kinetic=NAN), ValueError, r"Objective\.kinetic: expected a finite weight"),
    ("acceleration-inf", lambda: Objective("mse", acceleration=INF), ValueError,
     r"Objective\.acceleration: expected a finite weight"),
    ("defect-negative", lambda: Objective("mse", defect=-1.0), ValueError, r"Objective\.defect: expected a finite"),
    ("defect-str", lambda: Objective("mse", defect="1"), TypeError, r"Objective\.defect: expected a number"),
    ("defect_fraction-0", lambda: Objective("mse", defect=1.0, defect_fraction=0.0), ValueError,
     r"Objective\.defect_fraction: expected a number in \(0, 1\]"),
    ("flow_relative-str", lambda: Objective("mse", flow_relative="yes"), TypeError, r"Objective\.flow_relative"),
    ("flow-checkpoint-fit", lambda: fit_in_empty_dir(objective=Objective("cross_entropy", kinetic=0.1),
                                                     gradient="checkpoint"), ValueError,
     r"Objective\.kinetic: a flow cost reads every step .*gradient='backprop'"),
    ("flow-no-propagator-fit", lambda: fit_in_empty_dir(objective=Objective("cross_entropy", acceleration=0.1),
                                                        model=NoProp()), ValueError,
     r"Objective\.acceleration: the model holds no opsplit Propagator"),
    ("record_flow-no-propagator", lambda: record_flow(NoProp()).__enter__(), ValueError,
     r"flow costs .*no opsplit Propagator"),
    # the continuity measurement
    ("continuity-model-int", lambda: continuity(3, DATA), TypeError, r"continuity\.model: expected an nn\.Module"),
    ("continuity-no-propagator", lambda: continuity(NoProp(), tiny_data()), ValueError,
     r"continuity\.model: the model holds no opsplit Propagator"),
    ("continuity-n_steps-zero", lambda: continuity(Wrapped(), DATA, n_steps=[0, 2]), ValueError,
     r"continuity\.n_steps: expected integers >= 1, got 0"),
    ("continuity-n_steps-negative", lambda: continuity(Wrapped(), DATA, n_steps=[2, -4]), ValueError,
     r"continuity\.n_steps: expected integers >= 1, got -4"),
    ("continuity-n_steps-repeated", lambda: continuity(Wrapped(), DATA, n_steps=[2, 4, 4]), ValueError,
     r"continuity\.n_steps: N_t = 4 is listed twice"),
    ("continuity-n_steps-str", lambda: continuity(Wrapped(), DATA, n_steps="2,4"), TypeError, r"continuity\.n_steps"),
    ("continuity-levels-decreasing", lambda: continuity(Wrapped(), DATA, levels=[8, 4]), ValueError,
     r"continuity\.levels: expected at least two increasing N_t"),
    ("continuity-reference-0", lambda: continuity(Wrapped(), DATA, reference=0), ValueError,
     r"continuity\.reference"),
    ("continuity-solver-name", lambda: continuity(Wrapped(), DATA, solvers=["midpoint"]), ValueError,
     r"continuity\.solvers: expected one of \('euler', 'heun', 'rk4'\)"),
    ("continuity-solver-cannot-run", lambda: continuity(Wrapped(), DATA, solvers=[SemiImplicit()]), ValueError,
     r"solved_with\.solver: 'SemiImplicit' cannot run the term FFNIntegral"),
    ("continuity-scheme", lambda: continuity(Wrapped(), DATA, schemes=["yoshida"]), ValueError,
     r"continuity\.schemes: expected 'trained' or 'strang'"),
    ("continuity-metric", lambda: continuity(Wrapped(), DATA, metric="f1"), ValueError, r"continuity\.metric"),
    ("continuity-accuracy-mse", lambda: continuity(Wrapped(), DATA, loss="mse", metric="accuracy"), ValueError,
     r"continuity\.metric: 'accuracy' needs the cross-entropy loss"),
    ("continuity-data-empty", lambda: continuity(Wrapped(), (torch.zeros(0, 2, 3), torch.zeros(0).long())),
     ValueError, r"empty dataset|continuity\.data"),
    ("continuity-batch-0", lambda: continuity(Wrapped(), DATA, batch_size=0), ValueError,
     r"continuity\.batch_size"),
    ("solved_with-no-propagator", lambda: solved_with(NoProp(), solver="heun").__enter__(), ValueError,
     r"solved_with\.model: the model holds no opsplit Propagator"),
    ("solved_with-implicit-attention", lambda: solved_with(
        Propagator(Lie([Substep(ProjectionS1(0.0, 1.0))]), 2), solver="heun").__enter__(), ValueError,
     r"solved_with\.solver: no substep of the model integrates an explicit field"),
    ("solved_with-implicit-prenorm", lambda: solved_with(TinyClassifier(), solver=Implicit()).__enter__(),
     ValueError, r"solved_with\.solver: 'Implicit' cannot run the term PreNorm: Implicit needs an operator with a "
     r"resolvent"),
    ("solved_with-scheme", lambda: solved_with(_prop(), scheme="yoshida").__enter__(), ValueError,
     r"solved_with\.scheme: expected 'trained' or 'strang'"),
    # deduplicated validation text
    ("dedup-k-0", lambda: deduplicate("abc", "abc", k=0), ValueError, r"deduplicate\.k: expected an integer >= 1"),
    ("dedup-unit", lambda: deduplicate("abc", "abc", unit="word"), ValueError,
     r"deduplicate\.unit: expected one of \('paragraph', 'char'\)"),
    ("dedup-bytes", lambda: deduplicate(b"abc", "abc"), TypeError, r"deduplicate: expected two strings"),
    ("dedup-everything", lambda: deduplicate("the same text", "the same text", k=5), ValueError,
     r"deduplicate: every paragraph of the text contains a 5-character substring"),
    ("shared-k", lambda: shared_substrings("abc", "abc", k=-1), ValueError, r"shared_substrings\.k"),
)


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case):
    run_case(case)


# -- the continuity table of a language model: data, loss and output against the model's outputs --
# (opsplit.control.continuity checks the first sample's outputs against the loss, the metric and every
# target before the table is computed)
def _lm():
    from opsplit.models import DecoderConfig, DecoderLM

    cfg = DecoderConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, d_ff=16, norm="layer", mlp="plain",
                        activation="gelu", positions="learned", max_positions=16, tie_embeddings=True)
    return DecoderLM(cfg, generator=torch.Generator().manual_seed(0))


_IDS = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(0))
_X, _Y = _IDS[:, :-1], _IDS[:, 1:]


def _lm_cont(data, **kw):
    kw.setdefault("loss", "cross_entropy")
    kw.setdefault("output", "logits")
    return continuity(_lm(), data, n_steps=[2], solvers=["trained"], levels=[], **kw)


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = _prop()

    def forward(self, x, n_steps=None):
        return self.p(x, n_steps=n_steps).sum()


LM_CASES = cases(
    ("continuity-lm-targets-are-inputs", lambda: _lm_cont((_X, _X)), ValueError,
     r"continuity\.data: the targets are the inputs; the cross-entropy of sequence logits reads next-token "
     r"targets"),
    ("continuity-lm-targets-longer", lambda: _lm_cont((_X, _IDS)), ValueError,
     r"continuity\.data: loss 'cross_entropy' on the model's output 'logits' of shape \(B, 7, 11\) expects "
     r"targets \(B, 7\) of next-token ids .*got targets of shape \(4, 8\)"),
    ("continuity-lm-targets-one-per-window", lambda: _lm_cont((_X, _Y[:, -1])), ValueError,
     r"continuity\.data: .* expects targets \(B, 7\) .*got targets of shape \(4,\)"),
    ("continuity-lm-targets-float", lambda: _lm_cont((_X, _Y.double())), TypeError,
     r"continuity\.data: loss 'cross_entropy' expects integer targets"),
    ("continuity-lm-targets-out-of-vocab", lambda: _lm_cont((_X, _Y.clamp(max=9).index_fill(1, torch.tensor([3]),
                                                                                              11))), ValueError,
     r"continuity\.data: loss 'cross_entropy' on 11 classes expects targets in \[0, 10\], got range \[\d+, 11\]"),
    ("continuity-lm-no-output", lambda: _lm_cont((_X, _Y), output=None), TypeError,
     r"continuity\.output: the model returns a DecoderOutput, not a tensor; pass output="),
    ("continuity-lm-output-typo", lambda: _lm_cont((_X, _Y), output="logit"), ValueError,
     r"continuity\.output: the model's DecoderOutput has no field 'logit'; it has \['logits', "),
    ("continuity-lm-hidden-state", lambda: _lm_cont((_X, _Y.clamp(min=8)), output="last_hidden_state"), ValueError,
     r"continuity\.data: loss 'cross_entropy' on 8 classes expects targets in \[0, 7\]"),
    ("continuity-lm-mse-loss", lambda: _lm_cont((_X, _Y), loss="mse"), ValueError,
     r"continuity\.data: loss 'mse' expects targets of the shape of the model's output 'logits', \(B, 7, 11\); "
     r"got targets of shape \(4, 7\)"),
    ("continuity-lm-mse-metric", lambda: _lm_cont((_X, _Y), metric="mse"), ValueError,
     r"continuity\.metric: 'mse' compares the model's output 'logits', \(B, 7, 11\), with targets of that shape"),
    ("continuity-lm-unflattened-callable-loss", lambda: _lm_cont(
        (_X, _Y), loss=lambda o, y: torch.nn.functional.cross_entropy(o, y)), ValueError,
     r"continuity\.loss: it fails on the model's output 'logits' of shape \(1, 7, 11\) and targets of shape "
     r"\(1, 7\) \(the first sample\)"),
    ("continuity-lm-callable-loss-shape", lambda: _lm_cont((_X, _Y), loss=lambda o, y: o.sum((0, 1))), ValueError,
     r"continuity\.loss: it fails .*Objective\.loss: the callable returned shape \(11,\)"),
    ("continuity-lm-callable-metric", lambda: _lm_cont(
        (_X, _Y), metric=lambda o, y: torch.nn.functional.nll_loss(o, y)), ValueError,
     r"continuity\.metric: it fails on the model's output 'logits' of shape \(1, 7, 11\)"),
    ("continuity-lm-bits-name", lambda: _lm_cont((_X, _Y), metric="bpc"), ValueError,
     r"continuity\.metric: expected 'accuracy', 'loss', 'bits', 'bits_per_char', 'mse'"),
    ("continuity-class-targets-2d", lambda: continuity(Wrapped(), (DATA.inputs, torch.zeros(4, 2).long())),
     ValueError, r"continuity\.data: loss 'cross_entropy' on the model's output of shape \(B, 6\) expects targets "
     r"\(B\) of class indices; got targets of shape \(4, 2\)"),
    ("continuity-class-mse-targets", lambda: continuity(Wrapped(), (DATA.inputs, torch.zeros(4, 5)), loss="mse"),
     ValueError, r"continuity\.data: loss 'mse' expects targets of the shape of the model's output, \(B, 6\); got "
     r"targets of shape \(4, 5\)"),
    ("continuity-class-mse-int-targets", lambda: continuity(Wrapped(), (DATA.inputs, torch.zeros(4, 6).long()),
                                                            loss="mse"), TypeError,
     r"continuity\.data: loss 'mse' expects floating-point targets, got dtype torch\.int64"),
    ("continuity-scalar-output", lambda: continuity(Scalar(), DATA, loss="mse"), ValueError,
     r"continuity\.output: the model's output on one input has shape \(\); expected the batch first"),
)


@pytest.mark.parametrize("case", LM_CASES)
def test_bad_input_language_model(case):
    run_case(case)
