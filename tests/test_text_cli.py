"""``opsplit train`` with ``task = "text"`` and ``opsplit generate`` on a tiny config: the run
folder, sampling at a chosen N_t, resuming, the config's task picking the schema, and the
cost estimate against torch's flop counter.  Bad input: tests/bad_input/test_text.py."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from opsplit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = """\
task = "text"
[model]
context = 24
d_model = 16
heads = 2
layers = 2
[train]
steps = 6
batch_size = 4
warmup_steps = 2
n_steps = [1, 2]
save_every = 3
eval_n_steps = [1, 2, 4]
[data]
max_chars = 20000
eval_windows = 8
[generate]
max_new_tokens = 12
"""


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text")
    cfg = tmp / "text.toml"
    cfg.write_text(TEXT)
    assert main(["train", "--config", str(cfg), "--out", str(tmp / "run"), "--no-progress"]) == 0
    return tmp / "run"


def test_text_run_folder(run):
    from opsplit.cli.config import read_top

    assert read_top(run / "config.toml", "task") == "text"
    for f in ("vocab.json", "report.md", "report.html", "eval_n_t.csv", "text_training.png", "train/steps.csv"):
        assert (run / f).is_file(), f
    rows = _rows(run / "eval_n_t.csv")
    assert [int(r["n_t"]) for r in rows] == [1, 2, 4]
    assert [r["trained_at"] for r in rows] == ["yes", "yes", ""]
    assert all(math.isfinite(float(r["val_bits_per_char"])) for r in rows)
    losses = [float(r["loss"]) for r in _rows(run / "train" / "steps.csv")]
    assert len(losses) == 6 and {int(r["n_steps"]) for r in _rows(run / "train" / "steps.csv")} <= {1, 2}
    report = (run / "report.md").read_text()
    assert "Sample at N_t = 4" in report and "character-level GPT" in report


def test_generate_at_a_chosen_n_t(run, capsys):
    from opsplit.cli.train_text import load_run

    assert main(["generate", str(run), "--prompt", "The ", "--n-t", "4", "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    text = out.rstrip("\n")
    assert text.startswith("The ") and len(text) == 4 + 12 and "N_t = 4" in err
    cfg, vocab, model = load_run(run)
    assert all(c in vocab for c in text)
    assert main(["generate", str(run), "--prompt", "The ", "--n-t", "4", "--seed", "1"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == text  # seeded
    # --greedy at N_t = 4: the argmax loop over the trained model solved with 4 steps
    assert main(["generate", str(run), "--prompt", "The ", "--n-t", "4", "--greedy", "--max-new-tokens", "6"]) == 0
    greedy = capsys.readouterr().out.rstrip("\n")
    ids = vocab.encode("The ")[None]
    model.eval()
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids, n_steps=4).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert greedy == vocab.decode(ids[0])


def test_resume_a_text_run(tmp_path, monkeypatch, capsys):
    """Interrupted after the step-3 checkpoint, --resume finishes the text run with the
    losses of an uninterrupted one."""
    from opsplit.cli import train_text

    cfg = tmp_path / "text.toml"
    cfg.write_text(TEXT)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["train", "--config", str(cfg), "--out", str(full), "--no-progress"]) == 0
    real, calls = train_text.lm_loss, {"n": 0}

    def interrupting(logits, targets):
        calls["n"] += 1
        if calls["n"] == 5:  # during step 5, after the checkpoint of step 3
            raise KeyboardInterrupt
        return real(logits, targets)

    monkeypatch.setattr(train_text, "lm_loss", interrupting)
    assert main(["train", "--config", str(cfg), "--out", str(cut), "--no-progress"]) == 130
    assert "opsplit train --resume" in capsys.readouterr().err
    monkeypatch.setattr(train_text, "lm_loss", real)
    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0
    a = [r["loss"] for r in _rows(full / "train" / "steps.csv")]
    b = [r["loss"] for r in _rows(cut / "train" / "steps.csv")]
    assert a == b and len(a) == 6


def test_task_picks_the_schema(tmp_path, capsys):
    p = tmp_path / "t.toml"
    p.write_text('task = "text"\n[model]\nd_model = 24\nheads = 3\n')
    assert main(["train", "--config", str(p), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith('task = "text"\n') and "attention = " in printed and "[generate]" in printed
    assert main(["train", "--print-config"]) == 0  # no config: the digits task, as before
    printed = capsys.readouterr().out
    assert printed.startswith('task = "digits"\n') and "patch = " in printed


def test_text_estimate_flops_match_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    from opsplit.cli import train_text
    from opsplit.cli.config import load

    for model in ({"context": 32, "d_model": 32}, {"context": 32, "d_model": 16, "scheme": "strang"},
                  {"context": 32, "d_model": 16, "attention": "sliced_relu", "heads": 3}):
        m = load(train_text.SCHEMA, data={"model": model})["model"]
        net = train_text.build_model(m, 60)
        x = torch.randint(60, (2, m["context"]))
        with FlopCounterMode(display=False) as fc:
            net(x, n_steps=3)
        est = 2 * train_text.forward_flops(m, 3, vocab=60)[0]
        assert 0.6 < est / fc.get_total_flops() < 1.6, (model, est, fc.get_total_flops())


def test_generate_refuses_before_any_work(run, capsys):
    """On a real run: a continuation longer than the learned positions, and a prompt with
    characters outside the run's vocabulary, exit 2 with one line and print no text."""
    for argv, match in ((["--max-new-tokens", "100"], "--max-new-tokens: the prompt (4 characters) and 100 new "
                         "characters exceed the model's 24 learned positions"),
                        (["--prompt", "Ωmega"], "--prompt: character(s) 'Ω' are not in the vocabulary"),
                        (["--n-t", "0"], "--n-t: expected N_t >= 1")):
        assert main(["generate", str(run), "--prompt", "The ", *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and match in err and err.count("\n") == 1, err
