"""``opsplit train`` with ``task = "text"`` and ``opsplit generate`` on a tiny config: the run
folder, sampling at a chosen N_t, resuming, the config's task picking the schema, and the
cost estimate against torch's flop counter.  Bad input: tests/bad_input/test_text.py."""

from __future__ import annotations

import math
import re

import pytest
import torch
from _helpers import csv_rows

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
max_steps = 6
batch_size = 4
warmup_steps = 2
n_steps = [1, 2]
save_every = 3
[eval]
n_steps = [1, 2, 4]
windows = 8
[data]
max_chars = 20000
[generate]
max_new_tokens = 12
"""


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """The finished run, trained with its progress bar, and what the command printed
    (stdout, stderr), run from the folder above it with an absolute --out."""
    import contextlib
    import io
    import os

    tmp = tmp_path_factory.mktemp("text")
    cfg = tmp / "text.toml"
    cfg.write_text(TEXT)
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(tmp)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert main(["train", "--config", str(cfg), "--out", str(tmp / "run")]) == 0
    finally:
        os.chdir(here)
    return tmp / "run", out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run(shown):
    return shown[0]


def test_text_run_folder(run):
    from opsplit.cli.config import read_top

    assert read_top(run / "config.toml", "task") == "text"
    for f in ("vocab.json", "report.md", "report.html", "eval_n_t.csv", "text_training.png", "train/steps.csv"):
        assert (run / f).is_file(), f
    rows = csv_rows(run / "eval_n_t.csv")
    assert [int(r["n_t"]) for r in rows] == [1, 2, 4]
    assert [r["trained_at"] for r in rows] == ["yes", "yes", ""]
    assert all(math.isfinite(float(r["val_bits_per_char"])) for r in rows)
    losses = [float(r["loss"]) for r in csv_rows(run / "train" / "steps.csv")]
    assert len(losses) == 6 and {int(r["n_steps"]) for r in csv_rows(run / "train" / "steps.csv")} <= {1, 2}
    report = (run / "report.md").read_text()
    assert "Sample at N_t = 4" in report and "character-level GPT" in report


def test_generate_at_a_chosen_n_t(run, capsys):
    from opsplit.cli.tasks.text import load_run

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
    from opsplit.cli.tasks import text as train_text

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
    a = [r["loss"] for r in csv_rows(full / "train" / "steps.csv")]
    b = [r["loss"] for r in csv_rows(cut / "train" / "steps.csv")]
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

    from opsplit.cli.config import load
    from opsplit.cli.tasks import text as train_text

    for model in ({"context": 32, "d_model": 32}, {"context": 32, "d_model": 16, "scheme": "strang"},
                  {"context": 32, "d_model": 16, "scheme": "parallel"},
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


def test_generate_speculatively(run, capsys):
    """--draft-n-t: the same greedy text as the plain command (drafts reading the controls at
    their times or averaged over each step), the acceptance on stderr; a draft that is not
    cheaper, a bad --num-draft-tokens, drafts without a draft: exit 2."""
    base = ["generate", str(run), "--prompt", "The ", "--n-t", "4", "--greedy", "--max-new-tokens", "12"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    for k in ("3", "auto"):
        assert main([*base, "--draft-n-t", "2", "--num-draft-tokens", k]) == 0
        out, err = capsys.readouterr()
        assert out == plain and "speculative: drafts at N_t = 2" in err and "accepted" in err, err
    # one step reading the mean of the run's 2 pieces (a straddling draft is refused by the library's check)
    assert main([*base, "--draft-n-t", "1", "--draft-controls", "average"]) == 0
    out, err = capsys.readouterr()
    assert out == plain and "drafts at N_t = 1, controls average over each step" in err, err
    assert main([*base, "--draft-n-t", "2", "--num-draft-tokens", "4", "--draft-confidence", "0.5"]) == 0
    out, err = capsys.readouterr()
    assert out == plain and "speculative: drafts at N_t = 2" in err, err
    for argv, match in ((["--draft-controls", "average"], "--draft-controls: drafts are made only with --draft-n-t"),
                        (["--draft-confidence", "0.5"], "--draft-confidence: drafts are made only with --draft-n-t"),
                        (["--draft-n-t", "2", "--draft-confidence", "1.5"],
                         "--draft-confidence: expected a probability in (0, 1), got 1.5"),
                        (["--draft-n-t", "4"], "--draft-n-t: the draft (N_t = 4) costs 8 term evaluations per "
                         "character, the solve at --n-t 4 8: a draft must be cheaper"),
                        (["--draft-n-t", "2", "--draft-solver", "rk4"], "--draft-n-t: the draft (N_t = 2, solver rk4)"),
                        (["--draft-n-t", "0"], "--draft-n-t: expected an integer >= 1"),
                        (["--draft-n-t", "2", "--num-draft-tokens", "0"], "--num-draft-tokens: expected an integer >= 1"),
                        (["--num-draft-tokens", "3"], "--num-draft-tokens: drafts are made only with --draft-n-t")):
        assert main([*base, *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and match in err and err.count("\n") == 1, err


# -- the command's rough edges ---------------------------------------------------------------------
def test_progress_in_bits_and_absolute_out(shown):
    """The progress bar shows the training loss in bits per character, as the report does
    (before: the objective in nats); an absolute --out is printed absolute (before: relative
    to the current folder)."""
    run, out, err = shown
    assert "bits/char" in err and "loss=4." not in err, err[-300:]
    assert out.strip().splitlines()[-1] == f"opsplit train: results in {run}/ (report: {run / 'report.html'}, " \
                                          f"{run / 'report.md'})"


def test_train_help_names_both_tasks(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "on the bundled digits;" not in out and "character-level GPT" in out
    assert "train.n_steps (text)" in out and "text: backprop, checkpoint;" in out
    assert 'task = "text": config keys' in out and 'task = "burgers": config keys' in out


def test_sliced_run_samples_with_the_cache(tmp_path, capsys):
    """A sliced-attention run samples with the key/value cache (report and generate),
    giving the text of the argmax loop without it."""
    from opsplit.cli.tasks.text import load_run

    cfg = tmp_path / "s.toml"
    cfg.write_text(TEXT.replace("layers = 2", 'layers = 2\nattention = "sliced_relu"').replace("steps = 6", "steps = 2")
                   .replace("n_steps = [1, 2, 4]", "n_steps = [2]"))
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "s"), "--greedy", "--n-t", "3", "--max-new-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    assert "sliced_relu attention with a key/value cache" in err
    _, vocab, model = load_run(tmp_path / "s")
    ids = vocab.encode("The ")[None]
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model.eval()(ids, n_steps=3).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert out.rstrip("\n") == vocab.decode(ids[0])


def test_greedy_is_the_models_argmax(run, capsys):
    """``--greedy`` prints the argmax of the model, never the unknown id (which is no
    training target): an undertrained model repeats its most likely characters."""
    from opsplit.cli.tasks.text import load_run

    assert main(["generate", str(run), "--greedy", "--max-new-tokens", "12"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    _, vocab, model = load_run(run)
    ids = vocab.encode(text)
    assert (ids[4:] != 0).all() and text.startswith("The ")


def test_a_prompt_with_a_newline_round_trips(tmp_path, capsys):
    """``generate.prompt = "a\\nb"`` is written as valid TOML (before: raw, so that generate
    and --resume failed with "not valid TOML") and reads back equal."""
    from opsplit.cli.config import dump_toml, load
    from opsplit.cli.tasks import text as train_text

    cfg = tmp_path / "c.toml"
    cfg.write_text(TEXT.replace("max_new_tokens = 12", 'max_new_tokens = 12\nprompt = "T\\nh\\"e"'))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 0
    printed = tmp_path / "printed.toml"
    printed.write_text(capsys.readouterr().out)
    back = load(train_text.SCHEMA, printed)
    assert back["generate"]["prompt"] == 'T\nh"e' and back == load(train_text.SCHEMA, cfg)
    every = "".join(map(chr, range(0x20))) + "\x7f\\\"é"
    (tmp_path / "all.toml").write_text(dump_toml({"generate": {"prompt": every}}))
    from opsplit.cli.config import read_toml

    assert read_toml(tmp_path / "all.toml")["generate"]["prompt"] == every


def _snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_with_an_edited_key_is_refused_before_anything_is_written(run, tmp_path, capsys):
    """Before: a data.max_chars edit trained silently on other windows (and a refused edit,
    train.lr, printed a CheckpointError traceback, exit 1, after rewriting config.toml,
    vocab.json and manifest.json, advising allow_changes=['lr'], which the command lacks).
    tests/bad_input/test_text.py has a row per key."""
    import shutil

    folder = shutil.copytree(run, tmp_path / "run")
    (folder / "config.toml").write_text((folder / "config.toml").read_text().replace("max_chars = 20000",
                                                                                     "max_chars = 30000"))
    before = _snapshot(folder)
    assert main(["train", "--resume", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.max_chars = 20000 in the checkpoint, 30000 in config.toml" in err, err
    assert "allow_changes=" not in err and "--allow-changes data.max_chars" in err
    assert _snapshot(folder) == before
    with pytest.warns(UserWarning, match="accepted changed settings"):
        assert main(["train", "--resume", str(folder), "--no-progress", "--allow-changes", "data.max_chars"]) == 0
    assert len(csv_rows(folder / "train" / "steps.csv")) == 6


def test_interrupt_during_the_final_evaluation_prints_the_resume_command(run, tmp_path, monkeypatch, capsys):
    """A real SIGINT while the trained model is evaluated at eval_n_steps (here: a resumed
    finished run, which evaluates again): exit 130 with the command that continues the run
    (before: "interrupted", nothing else)."""
    import os
    import shutil
    import signal

    from opsplit.control import Trainer

    real = Trainer.evaluate

    def interrupted(self, data, **kw):
        if kw.get("n_steps") == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, data, **kw)

    folder = shutil.copytree(run, tmp_path / "run")
    monkeypatch.setattr(Trainer, "evaluate", interrupted)
    # Python's own handler, as in a command run from a terminal (a process started in the
    # background by a shell without job control, such as one suite of .ci/run, ignores SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["train", "--resume", str(folder), "--no-progress"]) == 130
    finally:
        signal.signal(signal.SIGINT, before)
    err = " ".join(capsys.readouterr().err.split())
    assert f"interrupted at step 6; the latest checkpoint is {folder / 'train' / 'checkpoints'}" in err
    assert f"continue with: opsplit train --resume {folder}" in err


def test_text_estimate_counts_the_corpus_and_the_windows():
    """The guard's memory counts the training windows (context 2, batch 2000, 200 000
    steps: 9.6 GB per int64 copy; before: 3 MB estimated, then a failed allocation) and
    its time the real corpus (the standard library: about 11 million characters; before:
    470 000 assumed)."""
    from opsplit.cli.config import load
    from opsplit.cli.tasks import text as train_text
    from opsplit.data import corpus_chars

    small = {"model": {"context": 2, "d_model": 8, "heads": 2, "layers": 1}, "generate": {"max_new_tokens": 0, "prompt": "a"},
             "train": {"max_steps": 200_000, "batch_size": 2000, "n_steps": [1]}, "eval": {"n_steps": [1]}}
    assert train_text.estimate(load(train_text.SCHEMA, data=small)).bytes > 2 * 9.6e9
    std = load(train_text.SCHEMA, data={"data": {"corpus": "stdlib"}})
    pydoc = load(train_text.SCHEMA, data={})
    n = corpus_chars("stdlib")
    assert n > 5e6 or n == 0  # a Python that ships its sources, or none
    if n:
        # the validation windows: 23 times as many (the training is the same)
        assert train_text.estimate(std).seconds > 3 * train_text.estimate(pydoc).seconds
    assert corpus_chars("pydoc_topics", 20000) < 40000


def test_the_continuous_recipe_keys(tmp_path):
    """train.solvers / solvers_weights / kinetic reach the trainer: every step draws its
    substep solver with the given weights and its loss is the data term plus the weighted
    kinetic energy (steps.csv); the report says so."""
    text = TEXT.replace("n_steps = [1, 2]\n", 'solvers = ["euler", "heun"]\nsolvers_weights = [1, 3]\n').replace(
        "[eval]", "[objective]\nkinetic = 0.25\n[eval]").replace("steps = 6\n", "steps = 8\n")
    cfg = tmp_path / "text.toml"
    cfg.write_text(text)
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    rows = csv_rows(tmp_path / "r" / "train" / "steps.csv")
    # (the model's own solver, explicit Euler, is recorded as an empty cell)
    assert len(rows) == 8 and {r["solver"] or "euler" for r in rows} == {"euler", "heun"}
    for r in rows:
        assert float(r["kinetic"]) > 0
        assert math.isclose(float(r["loss"]), float(r["data"]) + 0.25 * float(r["kinetic"]), rel_tol=1e-5)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "substep solver drawn from ['euler', 'heun'] (weights: [1.0, 3.0]), kinetic cost weight 0.25" in report


def test_solvers_split_key_shares_every_batch(tmp_path, capsys):
    """train.solvers_split = true: no draw (no solver column filled), every step's loss the
    mean over its windows solved by their parts' solvers, the report says so; a config that
    cannot split (the model's own solver only, a batch leaving a solver no window) is
    refused before anything is written."""
    text = TEXT.replace("n_steps = [1, 2]\n", 'solvers = ["euler", "heun"]\nsolvers_weights = [3, 1]\n'
                        "solvers_split = true\n").replace("[eval]", "[objective]\nkinetic = 0.1\n[eval]")
    cfg = tmp_path / "text.toml"
    cfg.write_text(text)
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    rows = csv_rows(tmp_path / "r" / "train" / "steps.csv")
    assert len(rows) == 6 and all(not r.get("solver") for r in rows)
    assert all(math.isclose(float(r["loss"]), float(r["data"]) + 0.1 * float(r["kinetic"]), rel_tol=1e-5)
               for r in rows)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "every batch shared between the substep solvers ['euler', 'heun'] (weights: [3.0, 1.0])" in report
    # the parts weighted apart from their shares (TrainConfig.train_solvers_split_weights)
    cfg.write_text(text.replace("solvers_split = true\n", "solvers_split = true\nsolvers_split_weights = [7, 3]\n"))
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "w"), "--no-progress"]) == 0
    report = (tmp_path / "w" / "report.md").read_text()
    assert "(weights: [3.0, 1.0]; the parts weighted [7.0, 3.0] in the objective)" in report
    w_rows = csv_rows(tmp_path / "w" / "train" / "steps.csv")
    assert float(w_rows[0]["loss"]) != pytest.approx(float(rows[0]["loss"]), rel=1e-6)
    for bad, match in ((TEXT.replace("n_steps = [1, 2]\n", "solvers_split = true\n"),
                        r"train\.solvers_split: a split of every batch between solvers needs solvers .*\(train\.solvers = \['euler'\] "
                        r"is the model's own: no draw\)"),
                       (TEXT.replace("n_steps = [1, 2]\n", 'solvers = ["euler", "heun"]\nsolvers_split_weights = [7, 3]\n'),
                        r"train\.solvers_split_weights: weights of the split's parts without solvers_split"),
                       (text.replace("solvers_split = true\n", "solvers_split = true\nsolvers_split_weights = [1]\n"),
                        r"train\.solvers_split_weights: expected one weight per solver of solvers = \('euler', 'heun'\), got 1"),
                       (text.replace("solvers_split = true\n", 'solvers_split = true\nsolvers_split_weights = "cost"\n'),
                        r"train\.solvers_split_weights: expected None or 'shares' .* or a list of weights > 0, one per solver, got 'cost'"),
                       (TEXT.replace("n_steps = [1, 2]\n", 'solvers = ["euler", "heun"]\nsolvers_weights = [7, 1]\n'
                                     "solvers_split = true\n"),
                        r"train\.solvers_split: a batch of 4 gives 'heun' no window")):
        cfg.write_text(bad)
        out = tmp_path / "bad"
        capsys.readouterr()
        assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 2
        assert re.search(match, capsys.readouterr().err)
        assert not out.exists()


def test_max_new_tokens_defaults_to_what_the_context_leaves(tmp_path, capsys):
    """Issue 47: a context of 128 characters with the default generate.max_new_tokens (200,
    more than the context leaves after the prompt "The ") is a valid config: unset, the key
    is 124 (context - len(prompt)); set to 200 by hand it is refused naming it."""
    from opsplit.cli.config import load
    from opsplit.cli.tasks import text as train_text

    small = TEXT.replace("context = 24", "context = 128").replace("max_new_tokens = 12\n", "")
    cfg = tmp_path / "c.toml"
    cfg.write_text(small)
    assert main(["train", "--config", str(cfg), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "max_new_tokens = 124" in out and load(train_text.SCHEMA, data={})["generate"]["max_new_tokens"] == 200
    assert load(train_text.SCHEMA, data={"model": {"context": 6}, "generate": {"prompt": "abc"}})["generate"][
        "max_new_tokens"] == 3
    cfg.write_text(small.replace("[generate]\n", "[generate]\nmax_new_tokens = 200\n"))
    assert main(["train", "--config", str(cfg), "--print-config"]) == 2
    assert "generate.max_new_tokens: the prompt (4 characters) and 200 new characters exceed model.context = 128" \
        in capsys.readouterr().err


def test_text_frontier_section_reads_the_averages_as_trained(tmp_path):
    """[frontier] on a run trained with coarse steps reading the pieces' average: the trained
    model at N_t = 1, 2, 4 (the default: half, one and two times the grid) on the
    deduplicated validation text; at the grid the number is the solver-swap table's, at
    N_t = 1 it is the model solved by hand with every piece replaced by the mean of both
    (the averaged reading), and the solver-swap table's N_t = 1 row reads the same way."""
    from opsplit.cli.config import load
    from opsplit.cli.tasks import text as train_text
    from opsplit.control import read_checkpoint
    from opsplit.control.checkpoint import latest_checkpoint
    from opsplit.data import bits_per_char

    cfg_path = tmp_path / "text.toml"
    cfg_path.write_text(TEXT.replace("n_steps = [1, 2]\n", 'n_steps = [1, 2]\ncoarse_controls = "average"\n')
                        + "[frontier]\nenabled = true\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(cfg_path), "--out", str(out), "--no-progress"]) == 0
    rows = {int(r["n_t"]): r for r in csv_rows(out / "frontier.csv")}
    assert sorted(rows) == [1, 2, 4]
    one = {n: float(r["bits_per_char (one model)"]) for n, r in rows.items()}
    cont = {int(r["n_t"]): float(r["bits_per_char"]) for r in csv_rows(out / "continuity.csv")
            if r["solver"] == "euler"}
    assert one[2] == pytest.approx(cont[2], rel=1e-12) and one[1] == pytest.approx(cont[1], rel=1e-12)
    # by hand: both pieces replaced by their mean, solved with one step
    cfg = load(train_text.SCHEMA, path=out / "config.toml")
    state = read_checkpoint(latest_checkpoint(out / "train")).model_state()
    vocab_size = state["head"].shape[0] if "head" in state else state["embedding.weight"].shape[0]
    model = train_text.build_model(cfg["model"], vocab_size)
    model.load_state_dict(state)
    with torch.no_grad():
        for mod in model.modules():
            raw = getattr(mod, "raw", None)
            if isinstance(raw, torch.Tensor) and raw.shape[0] == 2:  # a stacked piecewise control
                raw.copy_(raw.mean(0, keepdim=True).expand_as(raw) if not getattr(mod, "positive", False)
                          else raw.exp().mean(0, keepdim=True).log().expand_as(raw))
            pieces = getattr(mod, "pieces", None)
            if isinstance(pieces, torch.nn.ParameterList) and len(pieces) == 2:  # one weight per layer
                mean = (pieces[0] + pieces[1]) / 2
                pieces[0].copy_(mean)
                pieces[1].copy_(mean)
        corpus = train_text.corpus_of(cfg["data"])
        held = train_text.held_out(cfg, corpus)["windows"]
        logits = model.eval()(held.inputs, n_steps=1).logits
        nats = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), held.targets.reshape(-1))
    assert one[1] == pytest.approx(bits_per_char(float(nats)), rel=1e-5)
    assert "One model, every depth" in (out / "report.md").read_text()
