"""Bad input to ``opsplit.data``: TensorData, the digits split, random_shift, the periodic
sequences (series, task, rollout, input noise) and the retrieval task (data, loss,
accuracy).  Every row must raise exactly the given type with a message naming the
argument, from opsplit's own checks, before any compute."""

import pytest
import torch

from opsplit.data import (
    TensorData,
    flag_retrieval,
    input_noise,
    load_digits,
    periodic_series,
    periodic_task,
    random_shift,
    retrieval_accuracy,
    retrieval_loss,
    rollout,
)

from ._table import INF, NAN, cases, run_case

X = torch.randn(4, 3)
IMG = torch.randn(2, 1, 8, 8)
LOGITS = torch.randn(2, 5, 4)
TGT = torch.tensor([[-100, -100, 1, 1, 1], [-100, 2, 2, 2, 2]])


def bad(shape, at=0, value=NAN):
    t = torch.randn(*shape)
    t.view(-1)[at] = value
    return t


def last(w):
    return w  # a predictor: the next value is the current one


TENSOR_DATA = cases(
    ("inputs-list", lambda: TensorData([1, 2], torch.zeros(2)), TypeError, r"data\.inputs: expected a torch\.Tensor"),
    ("targets-list", lambda: TensorData(X, [0, 1, 2, 3]), TypeError, r"data\.targets: expected a torch\.Tensor"),
    ("inputs-scalar", lambda: TensorData(torch.tensor(1.0), torch.zeros(1)), ValueError,
     r"data\.inputs: expected a leading sample dimension"),
    ("unequal", lambda: TensorData(X, torch.zeros(3)), ValueError, r"data: inputs have 4 samples, targets 3"),
    ("empty", lambda: TensorData(X[:0], torch.zeros(0)), ValueError, r"data: empty dataset"),
    ("nan-inputs", lambda: TensorData(bad((4, 3)), torch.zeros(4)), ValueError, r"data\.inputs: expected finite"),
    ("inf-targets", lambda: TensorData(X, bad((4,), value=INF)), ValueError, r"data\.targets: expected finite"),
    ("name-int", lambda: TensorData(X, torch.zeros(4), name=3), TypeError, r"TensorData\.name: expected a string"),
    ("info-list", lambda: TensorData(X, torch.zeros(4), info=[1]), TypeError, r"TensorData\.info: expected a dict"),
)

DIGITS = cases(
    ("test_fraction=0.999", lambda: load_digits(test_fraction=0.999), ValueError,
     r"load_digits\.test_fraction: .*leaves no training image of class"),
    ("test_fraction=0.001", lambda: load_digits(test_fraction=0.001), ValueError,
     r"load_digits\.test_fraction: .*puts no test image of class"),
    ("test_fraction=1.5", lambda: load_digits(test_fraction=1.5), ValueError,
     r"load_digits\.test_fraction: expected a number in \(0, 1\)"),
    ("test_fraction=0", lambda: load_digits(test_fraction=0.0), ValueError, r"load_digits\.test_fraction"),
    ("test_fraction=1", lambda: load_digits(test_fraction=1), ValueError, r"load_digits\.test_fraction"),
    ("test_fraction=nan", lambda: load_digits(test_fraction=NAN), ValueError, r"load_digits\.test_fraction"),
    ("test_fraction-str", lambda: load_digits(test_fraction="0.2"), TypeError,
     r"load_digits\.test_fraction: expected a number"),
    ("test_fraction=True", lambda: load_digits(test_fraction=True), TypeError, r"load_digits\.test_fraction"),
    ("seed=1.5", lambda: load_digits(seed=1.5), TypeError, r"load_digits\.seed: expected an integer"),
    ("seed<0", lambda: load_digits(seed=-1), ValueError, r"load_digits\.seed: expected an integer >= 0"),
    ("dtype-int", lambda: load_digits(dtype=torch.int64), TypeError, r"load_digits\.dtype: expected a floating"),
    ("dtype-str", lambda: load_digits(dtype="float32"), TypeError, r"load_digits\.dtype"),
    ("normalize-str", lambda: load_digits(normalize="yes"), TypeError, r"load_digits\.normalize: expected true or"),
)

SHIFT = cases(
    ("images-list", lambda: random_shift([[1.0]]), TypeError, r"random_shift\.images: expected a torch\.Tensor"),
    ("images-3d", lambda: random_shift(torch.randn(2, 8, 8)), ValueError,
     r"random_shift\.images: expected \(B, C, H, W\)"),
    ("images-int", lambda: random_shift(torch.zeros(2, 1, 8, 8, dtype=torch.int64)), TypeError,
     r"random_shift\.images: expected a floating"),
    ("max_shift<0", lambda: random_shift(IMG, max_shift=-1), ValueError, r"random_shift\.max_shift.*>= 0"),
    ("max_shift=1.5", lambda: random_shift(IMG, max_shift=1.5), TypeError, r"random_shift\.max_shift"),
    ("max_shift>=size", lambda: random_shift(IMG, max_shift=8), ValueError,
     r"random_shift\.max_shift: expected .*< 8"),
    ("fill=nan", lambda: random_shift(IMG, fill=NAN), ValueError, r"random_shift\.fill: expected a finite"),
    ("fill-str", lambda: random_shift(IMG, fill="0"), TypeError, r"random_shift\.fill"),
    ("generator-int", lambda: random_shift(IMG, 3), TypeError, r"random_shift\.generator: expected a torch\.Gen"),
)

PERIODIC = cases(
    ("series-name", lambda: periodic_series("cos", 10), ValueError, r"periodic_series\.name: expected one of"),
    ("series-name-int", lambda: periodic_series(3, 10), ValueError, r"periodic_series\.name"),
    ("series-n=0", lambda: periodic_series("sin", 0), ValueError, r"periodic_series\.n: expected an integer >= 1"),
    ("series-n=2.5", lambda: periodic_series("sin", 2.5), TypeError, r"periodic_series\.n: expected an integer"),
    ("series-dx=0", lambda: periodic_series("sin", 10, dx=0.0), ValueError, r"periodic_series\.dx.*> 0"),
    ("series-dx=nan", lambda: periodic_series("sin", 10, dx=NAN), ValueError, r"periodic_series\.dx.*finite"),
    ("series-dx-str", lambda: periodic_series("sin", 10, dx="0.1"), TypeError, r"periodic_series\.dx"),
    ("series-dtype-int", lambda: periodic_series("sin", 10, dtype=torch.int64), TypeError,
     r"periodic_series\.dtype: expected a floating"),
    ("task-window=0", lambda: periodic_task("sin", window=0), ValueError, r"periodic_task\.window.*>= 1"),
    ("task-horizon=0", lambda: periodic_task("sin", horizon=0), ValueError, r"periodic_task\.horizon.*>= 1"),
    ("task-horizon-float", lambda: periodic_task("sin", horizon=2.5), TypeError, r"periodic_task\.horizon"),
    ("task-n_train", lambda: periodic_task("sin", window=100, n_train=100), ValueError,
     r"periodic_task\.n_train: expected >= window \+ 1 = 101"),
    ("task-n_test=0", lambda: periodic_task("sin", n_test=0), ValueError, r"periodic_task\.n_test"),
    ("task-test_gap=0", lambda: periodic_task("sin", test_gap=0), ValueError, r"periodic_task\.test_gap"),
    ("task-name", lambda: periodic_task("cos"), ValueError, r"periodic_task\.name: expected one of"),
    ("task-dx<0", lambda: periodic_task("sin", dx=-0.1), ValueError, r"periodic_task\.dx.*> 0"),
    ("task-dtype-int", lambda: periodic_task("sin", dtype=torch.int32), TypeError,
     r"periodic_task\.dtype: expected a floating"),
    ("rollout-context-1d", lambda: rollout(last, torch.randn(10), 5), ValueError,
     r"rollout\.context: expected \(B, L\)"),
    ("rollout-context-list", lambda: rollout(last, [[1.0, 2.0]], 5), TypeError,
     r"rollout\.context: expected a torch\.Tensor"),
    ("rollout-horizon=0", lambda: rollout(last, torch.randn(2, 10), 0), ValueError,
     r"rollout\.horizon: expected an integer >= 1"),
    ("rollout-horizon=2.5", lambda: rollout(last, torch.randn(2, 10), 2.5), TypeError, r"rollout\.horizon"),
    ("rollout-predict", lambda: rollout(3, torch.randn(2, 10), 5), TypeError,
     r"rollout\.predict: expected a callable"),
    ("rollout-predict-shape", lambda: rollout(lambda w: w[:, 0], torch.randn(2, 10), 5), ValueError,
     r"rollout\.predict: expected next-value predictions \(B, L\) = \(2, 10\), got \(2,\)"),
    ("noise-std<0", lambda: input_noise(-0.1), ValueError, r"input_noise\.std: expected a finite number >= 0"),
    ("noise-std=nan", lambda: input_noise(NAN), ValueError, r"input_noise\.std"),
    ("noise-std-str", lambda: input_noise("0.1"), TypeError, r"input_noise\.std: expected a number"),
    ("noise-inputs-int", lambda: input_noise(0.1)(torch.zeros(3, dtype=torch.int64), None), TypeError,
     r"input_noise: expected a floating tensor of inputs"),
    ("noise-generator", lambda: input_noise(0.1)(torch.zeros(3), 3), TypeError,
     r"input_noise\.generator: expected a torch\.Generator"),
)

RETRIEVAL = cases(
    ("n_samples=0", lambda: flag_retrieval(0, 8), ValueError, r"flag_retrieval\.n_samples.*>= 1"),
    ("n_samples=2.5", lambda: flag_retrieval(2.5, 8), TypeError, r"flag_retrieval\.n_samples: expected an integer"),
    ("length=1", lambda: flag_retrieval(4, 1), ValueError, r"flag_retrieval\.length.*>= 2"),
    ("n_symbols=1", lambda: flag_retrieval(4, 8, n_symbols=1), ValueError, r"flag_retrieval\.n_symbols.*>= 2"),
    ("flag_span-reversed", lambda: flag_retrieval(4, 8, flag_span=(0.5, 0.2)), ValueError,
     r"flag_retrieval\.flag_span: expected 0 <= a < b <= 1"),
    ("flag_span>1", lambda: flag_retrieval(4, 8, flag_span=(0.0, 2.0)), ValueError, r"flag_retrieval\.flag_span"),
    ("flag_span-str", lambda: flag_retrieval(4, 8, flag_span="ab"), TypeError,
     r"flag_retrieval\.flag_span: expected a pair"),
    ("flag_span-nan", lambda: flag_retrieval(4, 8, flag_span=(0.0, NAN)), TypeError, r"flag_retrieval\.flag_span"),
    ("flag_length=0", lambda: flag_retrieval(4, 8, flag_length=0), ValueError, r"flag_retrieval\.flag_length"),
    ("flag_length=length", lambda: flag_retrieval(4, 8, flag_length=8), ValueError,
     r"flag_retrieval\.flag_length: expected an integer <= length - 1 = 7"),
    ("seed<0", lambda: flag_retrieval(4, 8, seed=-1), ValueError, r"flag_retrieval\.seed.*>= 0"),
    ("name-int", lambda: flag_retrieval(4, 8, name=3), TypeError, r"TensorData\.name: expected a string"),
    ("loss-logits-2d", lambda: retrieval_loss(torch.randn(2, 5), TGT), ValueError,
     r"retrieval_loss: expected logits \(B, N, C\)"),
    ("loss-targets-shape", lambda: retrieval_loss(LOGITS, TGT[:, :4]), ValueError,
     r"retrieval_loss: expected logits \(B, N, C\) and targets \(B, N\)"),
    ("loss-list", lambda: retrieval_loss([1.0], TGT), TypeError, r"retrieval_loss: expected tensors"),
    ("loss-float-targets", lambda: retrieval_loss(LOGITS, TGT.double()), TypeError,
     r"retrieval_loss: expected integer class targets"),
    ("loss-target-range", lambda: retrieval_loss(LOGITS, TGT + 10), ValueError,
     r"retrieval_loss: expected targets in \[0, 3\] or -100"),
    ("accuracy-min_distance=0", lambda: retrieval_accuracy(LOGITS, TGT, min_distance=0), ValueError,
     r"retrieval_accuracy\.min_distance: expected an integer >= 1"),
    ("accuracy-min_distance=1.5", lambda: retrieval_accuracy(LOGITS, TGT, min_distance=1.5), TypeError,
     r"retrieval_accuracy\.min_distance"),
    ("accuracy-logits-2d", lambda: retrieval_accuracy(torch.randn(2, 5), TGT), ValueError,
     r"retrieval_accuracy: expected logits"),
)


@pytest.mark.parametrize("case", TENSOR_DATA)
def test_tensor_data(case):
    run_case(case)


@pytest.mark.parametrize("case", DIGITS)
def test_digits(case):
    run_case(case)


@pytest.mark.parametrize("case", SHIFT)
def test_random_shift(case):
    run_case(case)


@pytest.mark.parametrize("case", PERIODIC)
def test_periodic(case):
    run_case(case)


@pytest.mark.parametrize("case", RETRIEVAL)
def test_retrieval(case):
    run_case(case)
