"""The ``opsplit`` command: every subcommand on a tiny config, its --help, bad configs
stopped before any work (the default job's report: tests/test_report.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import csv_rows

from opsplit.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


def _toml(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_subcommand_has_help_with_an_example(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"opsplit {cmd}" in out


def test_top_level_help_and_console_script():
    import tomllib

    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["opsplit"]
    assert script == "opsplit.cli:main"
    r = subprocess.run([sys.executable, "-m", "opsplit", "--help"], capture_output=True, text=True,
                       cwd=ROOT, check=True)
    assert "default job" in r.stdout and "solve" in r.stdout and "examples:" in r.stdout


SOLVE = """
[model]
seed = 3
J = 1
batch = 1
[solve]
schemes = ["lie", "strang"]
solver = "heun"
n_t = [2, 4]
n_x = [4, 8]
n_y = [4, 8]
"""


def test_solve_tiny_config(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["solve", "--config", _toml(tmp_path, SOLVE), "--out", str(out), "--no-progress"]) == 0
    assert str(out.name) in capsys.readouterr().out  # the folder is named at the end
    for f in ("config.toml", "runs.csv", "runs.md", "orders.csv", "convergence_time.png",
              "report.md", "report.html"):
        assert (out / f).is_file(), f
    rows = csv_rows(out / "runs.csv")
    assert len(rows) == 2 * 2 * 2
    # the error of one run, recomputed independently: uniform midpoint grids, so the
    # relative discrete L2 error is the relative Frobenius norm
    from opsplit.analysis import smooth_transformer

    p = smooth_transformer(n_x=8, n_y=8, batch=1, J=1, seed=3, space="polynomial", constraint=True)
    with torch.no_grad():
        ref = p.reference()
        u = p.propagator(4, "strang", "heun")(p.f)
    want = float((u - ref).norm() / ref.norm())
    got = next(float(r["rel_error"]) for r in rows
               if r["scheme"] == "strang" and r["n_t"] == "4" and r["n_x"] == "8")
    assert got == pytest.approx(want, rel=1e-9)
    # the Strang errors fall faster than Lie's (second vs first order with Heun substeps)
    err = {(r["scheme"], r["n_t"]): float(r["rel_error"]) for r in rows if r["n_x"] == "8"}
    assert err["strang", "2"] / err["strang", "4"] > err["lie", "2"] / err["lie", "4"]
    html = (out / "report.html").read_text()
    assert "data-file='convergence_time.png'" in html and "<table>" in html


def test_compare_tiny_config_measures_the_orders(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", "--schemes", "lie", "strang", "--solvers", "euler", "heun", "--n-t", "2",
            "4", "8", "--n-x", "4", "--n-y", "4", "--repeats", "1", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    table = {(r["scheme"], r["solver"]): r for r in csv_rows(out / "comparison.csv")}
    assert set(table) == {("lie", "euler"), ("lie", "heun"), ("strang", "euler"), ("strang", "heun")}
    assert 1.7 < float(table["strang", "heun"]["order"]) < 2.4
    for key in [("lie", "euler"), ("strang", "euler")]:
        assert 0.7 < float(table[key]["order"]) < 1.4, table[key]
    assert table["strang", "heun"]["theory"] == "2" and table["strang", "euler"]["theory"] == "1"
    for f in ("error_vs_cost.png", "error_vs_dt.png", "compare_runs.csv", "report.md"):
        assert (out / f).is_file()


CONVERT = """
[convert]
models = ["torch", "vit"]
dtypes = ["float64"]
batch = 1
[torch]
d_model = 8
nhead = 2
dim_feedforward = 12
num_layers = 1
norm_first = true
seq_len = 5
[vit]
hidden_size = 8
num_hidden_layers = 1
num_attention_heads = 2
intermediate_size = 12
image_size = 8
patch_size = 4
num_channels = 1
"""


def test_convert_tiny_config(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "conv"
    assert main(["convert", "--config", _toml(tmp_path, CONVERT), "--out", str(out),
                 "--no-progress"]) == 0
    rows = csv_rows(out / "conversion_errors.csv")
    assert len(rows) == 2 and {r["dtype"] for r in rows} == {"float64"}
    for r in rows:
        assert float(r["max abs diff (output)"]) < 1e-12
        assert float(r["max abs diff (input grad)"]) < 1e-12, r
    assert float(rows[0]["round trip"]) < 1e-12
    assert "conversion_errors.csv" in (out / "report.md").read_text()


def test_convert_cvt_tiny_config(tmp_path):
    pytest.importorskip("transformers")
    toml = ('[convert]\nmodels = ["cvt"]\ndtypes = ["float64"]\nbatch = 1\n'
            "[cvt]\ndepth = [1, 2]\nnum_heads = [1, 2]\nembed_dim = [4, 8]\n"
            "patch_sizes = [3, 3]\npatch_stride = [2, 1]\nimage_size = 8\n")
    out = tmp_path / "cvt"
    assert main(["convert", "--config", _toml(tmp_path, toml), "--out", str(out), "--no-progress"]) == 0
    (row,) = csv_rows(out / "conversion_errors.csv")
    assert row["opsplit class"] == "CvT"
    assert float(row["max abs diff (output)"]) < 1e-12 and float(row["max abs diff (input grad)"]) < 1e-12


def test_convert_cvt_bad_config(tmp_path, capsys):
    toml = '[convert]\nmodels = ["cvt"]\n[cvt]\ndepth = [1]\n'
    assert main(["convert", "--config", _toml(tmp_path, toml), "--out", str(tmp_path / "x")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cvt.depth/num_heads/embed_dim/patch_sizes/patch_stride: expected one entry per stage" in err


LLM_CONVERT = """
[convert]
models = ["gpt2", "llama", "qwen2", "mistral"]
dtypes = ["float32", "float64"]
batch = 3
[gpt2]
n_embd = 8
n_layer = 1
activation_function = "relu"
tie_word_embeddings = false
seq_len = 5
new_tokens = 6
[llama]
hidden_size = 12
num_attention_heads = 3
num_key_value_heads = 1
head_dim = 6
attention_bias = true
mlp_bias = true
rope_theta = 500000.0
seq_len = 5
new_tokens = 6
[qwen2]
num_hidden_layers = 1
seq_len = 4
new_tokens = 6
[mistral]
seq_len = 4
new_tokens = 6
"""


def test_convert_decoder_llms(tmp_path):
    """GPT-2, Llama (multi-query, head_dim override, biases), Qwen2 and Mistral built from the
    config, converted: logits of a left-padded batch and every parameter's gradient within
    1e-5 (float32) and 1e-10 (float64) of Hugging Face's, relative to the largest; greedy
    generation token for token."""
    pytest.importorskip("transformers")
    out = tmp_path / "llm"
    assert main(["convert", "--config", _toml(tmp_path, LLM_CONVERT), "--out", str(out), "--no-progress"]) == 0
    rows = csv_rows(out / "conversion_errors.csv")
    assert [(r["model"].split()[1], r["dtype"]) for r in rows] == [
        (m, d) for m in ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
        for d in ("float32", "float64")]
    for r in rows:
        tol = 1e-5 if r["dtype"] == "float32" else 1e-10
        assert r["opsplit class"] == "DecoderLM"
        assert float(r["relative diff (output)"]) <= tol and float(r["relative diff (parameter grads)"]) <= tol, r
        assert r["greedy tokens equal"] == "18/18", r
        assert r["max abs diff (input grad)"] == "" and int(r["parameters"]) > 0
    assert "greedy tokens equal" in (out / "report.md").read_text()


def test_convert_decoder_config_reaches_the_model(tmp_path):
    """The section's keys are the Hugging Face config's (checked on the built model)."""
    pytest.importorskip("transformers")
    from opsplit.cli import convert
    from opsplit.cli.config import load

    cfg = load(convert.SCHEMA, data={"llama": {"num_key_value_heads": 1, "head_dim": 6, "mlp_bias": True,
                                               "hidden_act": "gelu", "rope_theta": 123.0}})
    m = convert.BUILDERS["llama"](cfg["llama"], 0)
    c = m.config
    assert (c.n_kv_heads, c.head_dim, c.mlp_bias, c.activation, c.rope_theta) == (1, 6, True, "gelu", 123.0)
    g = convert.BUILDERS["gpt2"](load(convert.SCHEMA, data={"gpt2": {"n_inner": 7}})["gpt2"], 0)
    assert g.config.d_ff == 7 and g.config.max_positions == 64


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_convert_decoder_estimate_flops_match_flop_counter(family):
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from opsplit.cli import convert_decoders
    from opsplit.cli.config import load
    from opsplit.cli.convert import SCHEMA

    s = load(SCHEMA, data={family: {"seq_len": 32}})[family]
    ref = convert_decoders.reference(family, s, 0)
    ref.set_attn_implementation("eager")  # matmuls that FlopCounterMode counts (not CPU SDPA's kernel)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        ref(input_ids=torch.zeros(2, 32, dtype=torch.long))
    est = convert_decoders.forward_flops(family, s, 2, 32)
    assert 0.7 < est / fc.get_total_flops() < 1.4, (est, fc.get_total_flops())


def test_report_of_a_folder_without_manifest(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "t.csv").write_text("a,b\n1,0.000012345\n")
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(tmp_path / "p.png")
    plt.close(fig)
    assert main(["report", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "| 1 | 1.234e-05 |" in md and "![p.png](p.png)" in md
    assert "data-file='p.png'" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize(
    "argv, toml, message",
    [
        (["solve", "--n-t", "0", "4"], None, "solve.n_t: expected values >= 1"),
        (["solve"], "[solve]\nnt = [4]\n", "solve.nt: unknown key"),
        (["solve"], "[solver]\nn_t = [4]\n", "unknown section [solver]"),
        (["solve"], '[solve]\nn_t = [4, "8"]\n', "solve.n_t: expected a non-empty list of integers (64-bit)"),
        (["solve"], "[model]\nT = \"one\"\n", "model.T: expected a finite number"),
        (["solve"], '[solve]\nschemes = ["lie", "yoshida"]\n', "solve.schemes: expected each of one of"),
        (["solve"], '[model]\nspace = "grid"\n', "model.space = 'grid' stores the controls"),
        (["solve"], "[model]\nrelu = true\n", "solve.reference: 'unsplit' needs a model without ReLU"),
        (["solve", "--n-x", "2", "3", "--n-y", "4", "4"], None, "solve.n_x: the finest grid"),
        (["solve", "--n-x", "4", "8", "--n-y", "4", "8", "16"], None, "solve.n_x / solve.n_y: expected"),
        (["compare", "--n-t", "4"], None, "compare.n_t: expected at least two distinct values"),
        (["compare", "--n-x", "0"], None, "compare.n_x: expected a value >= 1"),
        (["convert", "--nhead", "3"], None, "torch.nhead: expected a divisor of torch.d_model = 16"),
        (["convert"], "[vit]\npatch_size = 5\n", "vit.patch_size: expected a divisor"),
        (["convert"], "[torch]\nnorm_first = 1\n", "torch.norm_first: expected true or false"),
        (["solve", "--config", "/nonexistent.toml"], "", "no such file"),
        (["solve"], "[solve\n", "is not valid TOML"),
    ],
)
def test_bad_config_stops_before_any_work(tmp_path, capsys, argv, toml, message):
    out = tmp_path / "never"
    if toml:
        argv = [*argv, "--config", _toml(tmp_path, toml)]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err
    assert not out.exists()  # nothing was started


def test_print_config_round_trips(tmp_path, capsys):
    assert main(["compare", "--n-t", "3", "6", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "n_t = [3, 6]" in text
    p = _toml(tmp_path, text)
    assert main(["compare", "--config", p, "--print-config"]) == 0
    assert capsys.readouterr().out == text


def test_readme_first_command_runs_the_default_job():
    import re

    text = (ROOT / "README.md").read_text()
    first = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[0].strip()
    assert first == "bash scripts/install.sh && opsplit"


TRAIN = """
[model]
d_model = 8
heads = 2
d_ff = 16
n_steps = 2
T = 2.0
[train]
epochs = 2
batch_size = 16
save_every = 2
warmup_steps = 0
[eval]
n_steps = [1, 2, 4]
[data]
limit = 64
shift = 1
"""


def test_train_tiny_config(tmp_path):
    out = tmp_path / "train"
    assert main(["train", "--config", _toml(tmp_path, TRAIN), "--out", str(out), "--no-progress"]) == 0
    steps = csv_rows(out / "train" / "steps.csv")
    assert len(steps) == 2 * 4  # 64 images / 16 per step, 2 epochs
    evals = csv_rows(out / "continuity.csv")  # the solver-swap table (opsplit.control.continuity)
    own = [r for r in evals if r["solver"] == "euler"]
    assert [int(r["n_t"]) for r in own] == [1, 2, 4]
    assert [r["training grid"] for r in own] == ["", "yes", ""]
    assert {(r["solver"], int(r["n_t"])) for r in evals if r["solver"] != "euler"} == \
        {("heun", 2), ("heun", 4), ("rk4", 2), ("rk4", 4)}
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in evals)
    assert (out / "continuity.png").stat().st_size > 1000
    assert (out / "training_curve.png").stat().st_size > 1000
    assert "training_curve.png" in (out / "report.md").read_text()


def test_train_solvers_split_key(tmp_path, capsys):
    """train.solvers_split = true on the digits task: every batch shared between the drawn
    solvers' list (no solver drawn per step), the report says so; the model's own solver alone
    is refused before anything is written."""
    out = tmp_path / "split"
    toml = TRAIN.replace("[train]", '[train]\nn_steps = [2]\nsolvers = ["euler", "heun"]\n'
                         "solvers_split = true")
    assert main(["train", "--config", _toml(tmp_path, toml), "--out", str(out), "--no-progress"]) == 0
    steps = csv_rows(out / "train" / "steps.csv")
    assert len(steps) == 8 and all(not r.get("solver") for r in steps)
    assert "every batch shared between the substep solvers ['euler', 'heun'] (cost weights)" in \
        (out / "report.md").read_text()
    bad = tmp_path / "bad"
    toml = TRAIN.replace("[train]", '[train]\nsolvers = ["euler"]\nsolvers_split = true')
    capsys.readouterr()
    assert main(["train", "--config", _toml(tmp_path, toml, "b.toml"), "--out", str(bad), "--no-progress"]) == 2
    assert "train.solvers_split: a split of every batch between solvers needs solvers (the solvers it shares the " \
        "batch between) (train.solvers = ['euler'] is the model's own: no draw)" in \
        capsys.readouterr().err
    assert not bad.exists()
    toml = TRAIN.replace("[train]", '[train]\nsolvers = ["euler", "heun"]\nsolvers_split = true\n'
                         "solvers_split_weights = [0.7, 0.2, 0.1]")
    assert main(["train", "--config", _toml(tmp_path, toml, "c.toml"), "--out", str(bad), "--no-progress"]) == 2
    assert "train.solvers_split_weights: expected one weight per solver of solvers = ('euler', 'heun'), got 3" in \
        capsys.readouterr().err
    assert not bad.exists()


def test_train_distils_the_coarse_draws(tmp_path, capsys):
    """``train.n_steps_distill`` (digits): the steps drawn at N_t = 1 record the divergence
    and their loss is the mixture (no kinetic cost here), those at the grid none; with the
    model's own N_t alone (no draw) the key is refused, nothing written."""
    toml = TRAIN.replace("[train]", '[train]\nn_steps = [1, 2]\ncoarse_controls = "average"\nn_steps_distill = 0.5') \
        + "[objective]\nkinetic = 0.0\n"
    out = tmp_path / "run"
    assert main(["train", "--config", _toml(tmp_path, toml), "--out", str(out), "--no-progress"]) == 0
    rows = csv_rows(out / "train" / "steps.csv")
    coarse = [r for r in rows if r["n_steps"] == "1"]
    assert coarse and all(r["distill"] == "" for r in rows if r["n_steps"] == "2")
    for r in coarse:
        assert float(r["loss"]) == pytest.approx(0.5 * float(r["data"]) + 0.5 * float(r["distill"]), rel=1e-5)
    bad = tmp_path / "bad"
    toml = toml.replace("n_steps = [1, 2]", "n_steps = [2]")  # the model's own N_t: no draw
    capsys.readouterr()
    assert main(["train", "--config", _toml(tmp_path, toml, "b.toml"), "--out", str(bad), "--no-progress"]) == 2
    assert "train.n_steps_distill: self-distillation fits the coarse draws of n_steps to the finest" in \
        capsys.readouterr().err
    assert not bad.exists()


def test_train_is_seeded_whatever_the_global_rng(tmp_path):
    """model.seed and train.seed fix the whole run: two runs started from different global
    RNG states write the same losses (the patch embedding and read-out draw from torch's
    global generator; the command seeds it for the construction)."""
    cfg = _toml(tmp_path, TRAIN)
    losses = []
    for k, seed in enumerate((1, 2)):
        torch.manual_seed(seed)
        assert main(["train", "--config", cfg, "--out", str(tmp_path / f"r{k}"), "--no-progress"]) == 0
        losses.append([r["loss"] for r in csv_rows(tmp_path / f"r{k}" / "train" / "steps.csv")])
    assert len(losses[0]) == 8 and losses[0] == losses[1]
    from opsplit.cli.config import load
    from opsplit.cli.tasks.digits import SCHEMA, build_model

    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    m = load(SCHEMA, data={})["model"]
    a, b = build_model(m).state_dict(), build_model(m).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG is left alone


def test_interrupted_train_resumes_from_its_folder(tmp_path, monkeypatch, capsys):
    """Interrupted after the step-4 checkpoint, `--resume` finishes the run; the losses
    equal those of an uninterrupted run."""
    from opsplit.cli.tasks import digits as train_cmd

    cfg = _toml(tmp_path, TRAIN)
    full = tmp_path / "full"
    assert main(["train", "--config", cfg, "--out", str(full), "--no-progress"]) == 0
    real = train_cmd.augment

    def interrupting(shift):
        aug = real(shift)
        calls = {"n": 0}

        def f(x, g):
            calls["n"] += 1
            if calls["n"] == 6:  # during step 6, after the checkpoint of step 4
                raise KeyboardInterrupt
            return aug(x, g)

        return f

    cut = tmp_path / "cut"
    monkeypatch.setattr(train_cmd, "augment", interrupting)
    assert main(["train", "--config", cfg, "--out", str(cut), "--no-progress"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (cut / "train" / "steps.csv").exists()
    monkeypatch.setattr(train_cmd, "augment", real)
    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0
    a = [r["loss"] for r in csv_rows(full / "train" / "steps.csv")]
    b = [r["loss"] for r in csv_rows(cut / "train" / "steps.csv")]
    assert len(a) == 8 and a == b
    assert "resumed from a checkpoint" in (cut / "report.md").read_text()


def test_train_bad_configs(tmp_path, capsys):
    for toml, msg in [("[model]\nheads = 3\n", "model.heads: expected a divisor of model.d_model"),
                      ("[model]\npatch = 3\n", "model.patch: expected a divisor of 8"),
                      ('[train]\ngradient = "magic"\n', "train.gradient: expected one of"),
                      ("[model]\nn_steps = 0\n", "model.n_steps: expected a value >= 1")]:
        assert main(["train", "--config", _toml(tmp_path, toml), "--out", str(tmp_path / "x")]) == 2
        assert msg in " ".join(capsys.readouterr().err.split())
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "config.toml" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["grid", "--levels", "0"], "--levels: expected 1 to 5 levels"),
    (["grid", "--steps", "0"], "--steps: expected N_t >= 1, got 0"),
])
def test_grid_bad_arguments_stop_before_any_work(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


# -- issue 17, finding 7: torch's threads ---------------------------------------------------------
def _clean_env(**extra):
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "OPSPLIT_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_importing_the_command_does_not_load_torch():
    """The thread settings must be in place before torch loads: neither ``import opsplit``
    nor the command's entry modules may import it."""
    code = ("import sys, opsplit, opsplit.cli, opsplit.__main__; "
            "from opsplit.cli import main; print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=_clean_env(), check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("flags, env, want", [
    ([], {}, "1 torch thread (OMP_WAIT_POLICY=PASSIVE)"),
    (["--threads", "2"], {"OMP_NUM_THREADS": "3"}, "2 torch threads (OMP_WAIT_POLICY=PASSIVE)"),
    ([], {"OPSPLIT_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}, "2 torch threads (OMP_WAIT_POLICY=ACTIVE)"),
])
def test_command_sets_torch_threads_before_torch_loads(flags, env, want):
    """The console command runs torch on one thread with OpenMP's passive wait by default
    (4-15x faster on a loaded machine, issue 17); --threads, then OPSPLIT_THREADS, override
    the count, and a wait policy of the caller's environment is kept."""
    r = subprocess.run([sys.executable, "-m", "opsplit", *flags, "grid", "--levels", "1", "--steps", "1"],
                       capture_output=True, text=True, cwd=ROOT, env=_clean_env(**env), check=True)
    assert f"torch: {want}" in r.stdout, r.stdout


def test_threads_in_process_are_restored(capsys):
    """Called from a session that already imported torch, --threads applies for the call only."""
    before = torch.get_num_threads()
    assert main(["--threads", "3", "grid", "--levels", "1", "--steps", "1"]) == 0
    assert "torch: 3 torch threads" in capsys.readouterr().out
    assert torch.get_num_threads() == before


# -- issue 17, finding 8: checked before anything is written, interrupts resumable ------------------
def test_print_config_runs_the_cross_key_checks(tmp_path, capsys):
    """--print-config prints only a config whose keys are valid: the checks between keys run
    first; it does not refuse the job's cost (issue 47: it runs nothing), it says so in one
    line on stderr and builds nothing (the run itself refuses it, or takes --force)."""
    assert main(["train", "--print-config", "--config", _toml(tmp_path, "[model]\nheads = 3\n")]) == 2
    assert "model.heads: expected a divisor of model.d_model" in capsys.readouterr().err
    assert main(["solve", "--print-config", "--n-x", "100000", "--n-y", "100000"]) == 0
    out, err = capsys.readouterr()
    assert "n_x = [100000]" in out and err.count("\n") == 1
    assert "opsplit solve: note: not built" in err and "solve.n_x = [100000], solve.n_y = [100000]: the job needs" in err
    assert main(["solve", "--n-x", "100000", "--n-y", "100000", "--out", str(tmp_path / "s")]) == 2
    assert "the job needs an estimated" in capsys.readouterr().err and not (tmp_path / "s").exists()
    assert main(["train", "--print-config", "--config", _toml(tmp_path, "[model]\nheads = 2\n")]) == 0


def test_force_runs_a_job_over_the_guard(tmp_path, monkeypatch, capsys):
    from opsplit.cli import budget

    monkeypatch.setattr(budget, "MAX_SECONDS", 1e-9)
    argv = ["solve", "--n-t", "2", "4", "--n-x", "4", "--n-y", "4", "--schemes", "lie", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert "or --force to run it anyway" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert main([*argv, "--out", str(tmp_path / "b"), "--force"]) == 0
    assert (tmp_path / "b" / "runs.csv").is_file()


def test_interrupt_saves_a_checkpoint_and_prints_how_to_resume(tmp_path, monkeypatch, capsys):
    """A real SIGINT during step 6 (checkpoints every 4 steps): the run finishes step 6,
    saves a checkpoint there, exits 130 naming the resume command; resumed, it writes the
    losses of an uninterrupted run."""
    import os
    import signal

    from opsplit.cli.tasks import digits as train_cmd
    from opsplit.control.checkpoint import latest_checkpoint

    # the handler the run must restore: Python's own, or SIG_IGN in a process started in the
    # background by a shell without job control (such as one suite of .ci/run)
    before = signal.getsignal(signal.SIGINT)
    cfg = _toml(tmp_path, TRAIN.replace("save_every = 2", "save_every = 4"))
    full = tmp_path / "full"
    assert main(["train", "--config", cfg, "--out", str(full), "--no-progress"]) == 0
    real = train_cmd.augment

    def interrupting(shift):
        aug, calls = real(shift), {"n": 0}

        def f(x, g):
            calls["n"] += 1
            if calls["n"] == 6:  # Ctrl-C while step 6 runs
                os.kill(os.getpid(), signal.SIGINT)
            return aug(x, g)

        return f

    cut = tmp_path / "cut"
    monkeypatch.setattr(train_cmd, "augment", interrupting)
    assert main(["train", "--config", cfg, "--out", str(cut), "--no-progress"]) == 130
    err = " ".join(capsys.readouterr().err.split())
    assert "interrupted at step 6; saved a checkpoint at step 6" in err
    assert f"continue with: opsplit train --resume {cut}" in err
    assert latest_checkpoint(cut / "train").name == "step-00000006"
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    monkeypatch.setattr(train_cmd, "augment", real)
    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0
    a = [r["loss"] for r in csv_rows(full / "train" / "steps.csv")]
    b = [r["loss"] for r in csv_rows(cut / "train" / "steps.csv")]
    assert len(a) == 8 and a == b


def test_train_adjoint_with_rk4_substeps(tmp_path):
    """train.gradient = 'adjoint' runs with model.solver = 'rk4' (ODE substeps), whose
    gradient is the continuous adjoint's (finding 8: refused with Euler substeps); the drawn
    solvers are its own only and no flow cost reads the steps (both refused with it)."""
    toml = TRAIN.replace("[train]", '[train]\ngradient = "adjoint"\nsolvers = ["rk4"]').replace(
        "[data]", "[objective]\nkinetic = 0.0\n[data]").replace(
        "[model]", '[model]\nsolver = "rk4"').replace("epochs = 2", "epochs = 1").replace(
        "shift = 1", "shift = 0")
    out = tmp_path / "adj"
    assert main(["train", "--config", _toml(tmp_path, toml), "--out", str(out), "--no-progress"]) == 0
    steps = csv_rows(out / "train" / "steps.csv")
    assert len(steps) == 4 and all(float(r["grad_norm"]) > 0 for r in steps)


# -- the size and cost estimate against independent counts ----------------------------------------
def _solve_cfg(**model):
    from opsplit.cli.config import load
    from opsplit.cli.solve import SCHEMA

    return load(SCHEMA, data={"model": model})["model"]


@pytest.mark.parametrize("space", ["polynomial", "grid"])
@pytest.mark.parametrize("nx, ny, batch, J", [(8, 8, 2, 2), (12, 4, 1, 1), (4, 12, 3, 3)])
def test_field_flops_match_flop_counter(space, nx, ny, batch, J):
    from torch.utils.flop_counter import FlopCounterMode

    from opsplit.analysis import smooth_transformer
    from opsplit.cli import study

    m = _solve_cfg(batch=batch, J=J, space=space)
    p = smooth_transformer(n_x=nx, n_y=ny, batch=batch, J=J, seed=0, space=space, constraint=True)
    counted = []
    for op in (p.attention, p.ffn[0]):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            op.field(0.3, p.f, p.grid)
        counted.append(fc.get_total_flops())
    attention, ffn = study.field_flops(m, nx, ny)
    assert 0.8 < attention / counted[0] < 1.25 and 0.7 < ffn / counted[1] < 1.3, (attention, ffn, counted)


@pytest.mark.parametrize("scheme", ["lie", "strang", "parallel", "hybrid"])
@pytest.mark.parametrize("solver", ["euler", "heun", "odeint"])
def test_run_estimate_counts_the_field_evaluations(scheme, solver, monkeypatch):
    """Attention and FFN evaluations of one solve, counted, against the estimate (exact for
    the fixed-stage solvers; dopri5's within a factor 2)."""
    from opsplit.analysis import smooth_transformer
    from opsplit.cli import study
    from opsplit.operators import FFNIntegral, SoftmaxAttention

    calls = {"a": 0, "f": 0}
    for cls, k in ((SoftmaxAttention, "a"), (FFNIntegral, "f")):
        real = cls.field

        def counting(self, *a, _real=real, _k=k, **kw):
            calls[_k] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(cls, "field", counting)
    m = _solve_cfg(batch=1, J=2)
    p = smooth_transformer(n_x=4, n_y=4, batch=1, J=2, seed=0, space="polynomial", constraint=True)
    with torch.no_grad():
        p.propagator(4, scheme, solver)(p.f)
    attention, ffn = study.field_flops(m, 4, 4)
    est = study.run_estimate(m, 4, 4, 4, scheme, solver)
    # FFN calls of the parallel schemes are batched (one call for the J terms): count flops
    counted = calls["a"] * attention + calls["f"] * ffn * (2 if scheme in ("parallel", "hybrid") else 1)
    lo, hi = (0.99, 1.01) if solver != "odeint" else (0.5, 2.0)
    assert lo < est.flops / counted < hi, (est.flops, counted, calls)


def test_reference_estimate_counts_dopri5_evaluations(monkeypatch):
    from opsplit.analysis import smooth_transformer
    from opsplit.cli import study
    from opsplit.operators import SoftmaxAttention

    calls = {"n": 0}
    real = SoftmaxAttention.field

    def counting(self, *a, **kw):
        calls["n"] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(SoftmaxAttention, "field", counting)
    for T in (1.0, 8.0):
        calls["n"] = 0
        p = smooth_transformer(n_x=6, n_y=6, batch=1, J=1, T=T, seed=0, space="polynomial", constraint=True)
        with torch.no_grad():
            p.reference()
        assert 0.5 < study.dopri5_evaluations(T, coupled=True) / calls["n"] < 2.0, (T, calls["n"])


def test_memory_estimate_against_the_peak_resident_memory():
    """A solve dominated by its score matrices (N_x = 1500: 36 MB each in float64) and one
    dominated by its kernels (N_y = 1500), measured in a fresh process (the growth of the
    resident set's high-water mark, reset before the solve): the estimate is within a
    factor 3."""
    import os

    from opsplit.cli import study

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident memory")
    code = (
        "import re, sys, torch\n"
        "from opsplit.analysis import smooth_transformer\n"
        "def kb(k):\n"
        "    return int(re.search(k + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "nx, ny = int(sys.argv[1]), int(sys.argv[2])\n"
        "p = smooth_transformer(n_x=nx, n_y=ny, batch=2, J=2, seed=0, space='polynomial', constraint=True)\n"
        "prop = p.propagator(2, 'lie', 'heun')\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "base = kb('VmRSS')\n"
        "with torch.no_grad():\n"
        "    prop(p.f)\n"
        "print((kb('VmHWM') - base) * 1024)\n"
    )
    for nx, ny in ((1500, 4), (4, 1500)):
        r = subprocess.run([sys.executable, "-c", code, str(nx), str(ny)], capture_output=True,
                           text=True, cwd=ROOT, env=_clean_env(OMP_NUM_THREADS="1"), check=True)
        measured = float(r.stdout.strip())
        est = study.memory_bytes(_solve_cfg(batch=2, J=2), nx, ny)
        assert measured / 3 < est < measured * 3, (nx, ny, est, measured)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_train_estimate_flops_match_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    from opsplit.cli.config import load
    from opsplit.cli.tasks import digits as train_cmd

    for model in ({}, {"scheme": "strang", "patch": 4, "d_model": 16, "heads": 2}, {"solver": "rk4", "n_steps": 2}):
        m = load(train_cmd.SCHEMA, data={"model": model})["model"]
        net = train_cmd.build_model(m)
        x = torch.randn(3, 1, 8, 8)
        with FlopCounterMode(display=False) as fc:
            net(x)
        est = 3 * train_cmd.forward_flops(m, m["n_steps"])[0]
        assert 0.7 < est / fc.get_total_flops() < 1.4, (model, est, fc.get_total_flops())


def test_convert_estimate_flops_match_flop_counter():
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from opsplit.cli import convert
    from opsplit.cli.config import load

    cfg = load(convert.SCHEMA, data={})
    t, v = cfg["torch"], cfg["vit"]
    ref = convert._torch_reference(t, 0)
    with FlopCounterMode(display=False) as fc:
        ref(torch.randn(2, t["seq_len"], t["d_model"]))
    est = convert._encoder_cost(2, t["seq_len"], t["d_model"], t["dim_feedforward"], t["num_layers"], t["nhead"])[0]
    assert 0.7 < est / fc.get_total_flops() < 1.4
    vit = convert._vit_reference(v, 0)
    with FlopCounterMode(display=False) as fc:
        vit(torch.randn(2, v["num_channels"], v["image_size"], v["image_size"]))
    L = (v["image_size"] // v["patch_size"]) ** 2 + 1
    est = convert._encoder_cost(2, L, v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"],
                                v["num_attention_heads"])[0]
    est += 2.0 * 2 * (L - 1) * v["num_channels"] * v["patch_size"] ** 2 * v["hidden_size"]
    assert 0.7 < est / fc.get_total_flops() < 1.4


# -- issue 17, finding 10: what the command says ------------------------------------------------
def test_convert_help_names_the_three_models(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = capsys.readouterr().out
    assert "both models" not in out and "two models" not in out
    assert "CvT" in out and '"cvt"' in out


def test_readme_command_table_lists_every_command():
    import re

    text = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `opsplit (\w+)", text, flags=re.M))
    assert listed >= set(COMMANDS), set(COMMANDS) - listed


def test_compare_report_explains_parallel_with_the_constraint(tmp_path):
    """Local orders recomputed from the runs' errors; the report says why parallel splitting
    with the S1 constraint is below its theoretical order at coarse N_t."""
    import math

    out = tmp_path / "cmp"
    argv = ["compare", "--schemes", "parallel", "hybrid", "--solvers", "heun", "--n-t", "2", "4", "8",
            "--n-x", "4", "--n-y", "4", "--repeats", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    runs = csv_rows(out / "compare_runs.csv")
    for r in csv_rows(out / "comparison.csv"):
        e = [float(x["rel_error"]) for x in runs if x["scheme"] == r["scheme"]]
        want = [math.log2(e[i] / e[i + 1]) for i in range(len(e) - 1)]
        got = [float(x) for x in r["local orders"].split(", ")]
        assert got == pytest.approx(want, abs=0.006)
    md = (out / "report.md").read_text()
    assert "each step pulls the state only 1/K of the way back to S1" in md
    assert "K = 4" in md  # S1, attention and J = 2 FFN terms


def test_a_folder_holding_a_training_run_is_continued_only_by_the_same_config(tmp_path):
    from opsplit.cli import default
    from opsplit.cli.config import ConfigError, dump_toml
    from opsplit.cli.tasks import digits as train_cmd

    run = tmp_path / "run"
    (run / "train" / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "train" / "checkpoints" / "step-00000004" / "meta.json").write_text("{}")
    cfg = default.configs(quick=True)["train"]
    with pytest.raises(ConfigError, match="already holds a training run"):
        train_cmd.check_new_folder(run)  # opsplit train --out run
    (run / "train.toml").write_text(dump_toml(default.configs(quick=False)["train"]))
    with pytest.raises(ConfigError, match="already holds a training run"):
        train_cmd.check_new_folder(run, run / "train.toml", cfg)  # the full job's training
    (run / "train.toml").write_text(dump_toml(cfg))
    train_cmd.check_new_folder(run, run / "train.toml", cfg)  # opsplit --quick --out run again


# -- issue 43: one name per setting, checked once (by the library) ---------------------------------
#: a valid value of each TrainConfig field a task may have a [train] key for (no task's
#: default), with the keys it needs beside it, and the field's value TrainConfig then holds
SET = {
    "epochs": ({"epochs": 3}, 3),
    "max_steps": ({"max_steps": 7}, 7),
    "batch_size": ({"batch_size": 6}, 6),
    "lr": ({"lr": 0.02}, 0.02),
    "weight_decay": ({"weight_decay": 0.03}, 0.03),
    "warmup_steps": ({"warmup_steps": 3}, 3),
    "gradient": ({"gradient": "checkpoint"}, "checkpoint"),
    "save_every": ({"save_every": 7}, 7),
    "seed": ({"seed": 5}, 5),
    "n_steps": ({"n_steps": [3, 5]}, (3, 5)),
    "n_steps_weights": ({"n_steps": [3, 5], "n_steps_weights": [1, 3]}, (1.0, 3.0)),
    "solvers": ({"solvers": ["euler", "rk4"]}, ("euler", "rk4")),
    "solvers_weights": ({"solvers": ["euler", "rk4"], "solvers_weights": [2, 1]}, (2.0, 1.0)),
    "solvers_split": ({"solvers": ["euler", "heun"], "solvers_split": True}, True),
    "solvers_split_weights": ({"solvers": ["euler", "heun"], "solvers_split": True, "solvers_split_weights": [3, 1]},
                              (3.0, 1.0)),
    "levels": ({"levels": [[1, 0.25], [2, 0.75]]}, ((1, 0.25), (2, 0.75))),
    "levels_prolongation": ({"levels": [[1, 0.5], [2, 0.5]], "levels_prolongation": "linear"}, "linear"),
    "levels_schedule": ({"levels": [[1, 0.5], [2, 0.5]], "levels_schedule": "level"}, "level"),
    "coarse_controls": ({"coarse_controls": "average"}, "average"),
    "n_steps_distill": ({"n_steps": [3, 5], "n_steps_distill": 0.5}, 0.5),
}


@pytest.mark.parametrize("task", ["digits", "text", "burgers"])
def test_every_train_key_sets_the_trainconfig_field_of_its_name(task):
    """Every [train] key of every task is a TrainConfig field, and its value reaches that
    field (and nothing else does: the task's defaults leave it elsewhere); every [objective]
    key is the Objective weight of its name; every renamed key names its new name, which the
    schema has."""
    from opsplit.cli.config import ConfigError, load
    from opsplit.cli.tasks import MODULES
    from opsplit.control import TrainConfig

    mod = MODULES[task]
    fields = TrainConfig.schema()
    assert set(mod.SCHEMA["train"]) <= set(fields), set(mod.SCHEMA["train"]) - set(fields)
    default = mod.train_config(load(mod.SCHEMA, data={"task": task}), progress=False)
    for key in mod.SCHEMA["train"]:
        keys, want = SET[key]
        c = mod.train_config(load(mod.SCHEMA, data={"task": task, "train": keys}), progress=False)
        assert getattr(c, key) == want and getattr(default, key) != want, (task, key)
    for key in mod.SCHEMA.get("objective", {}):
        obj = mod.objective(load(mod.SCHEMA, data={"task": task, "objective": {key: 0.125}}))
        assert getattr(obj, key) == 0.125, (task, key)
    for old, new in mod.RENAMED.items():
        section, key = new.split(".")
        assert key in mod.SCHEMA[section] and old.split(".")[1] not in mod.SCHEMA[old.split(".")[0]]
        with pytest.raises(ConfigError, match=rf"^{re.escape(old)}: renamed {re.escape(new)} "):
            load(mod.SCHEMA, data={"task": task, old.split(".")[0]: {old.split(".")[1]: 1}}, renamed=mod.RENAMED)


@pytest.mark.parametrize("task, toml, match", [
    ("digits", "[train]\nlr = -1\n", "train.lr: expected a number > 0, got -1"),
    ("digits", "[train]\nsolvers_weights = [1]\n", "train.solvers_weights: expected one weight per entry of solvers (2)"),
    ("text", 'task = "text"\n[train]\nmax_steps = 0\n', "train.max_steps: expected an integer >= 1, got 0"),
    ("burgers", 'task = "burgers"\n[train]\nepochs = 1.5\n', "train.epochs: expected an integer"),
])
def test_train_keys_are_checked_by_trainconfig(task, toml, match, tmp_path, capsys, monkeypatch):
    """A [train] value is checked by TrainConfig alone: its refusal, one line naming the key,
    is the one TrainConfig gives (TrainConfig.<field> shown as train.<field>)."""
    from opsplit.cli.tasks import MODULES
    from opsplit.control import TrainConfig

    key, value = toml.split("[train]\n")[1].strip().split(" = ")
    with pytest.raises((ValueError, TypeError)) as e:
        kw = {"solvers": ("euler", "heun")} if key == "solvers_weights" else {}
        TrainConfig(**kw, **{key: json.loads(value)})
    assert str(e.value).replace("TrainConfig.", "train.", 1).startswith(match.split(" got ")[0])
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", _toml(tmp_path, toml), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and not (tmp_path / "out").exists()
    assert MODULES[task]


def _help(argv) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def _listed(help_text: str) -> dict:
    """``{(block, "section.key"): [values]}`` of the keys whose bracket lists names: the
    described schemas of a --help, each key line ``  key = default   # help [a, b, c]``."""
    out, block, section = {}, "", ""
    for line in help_text.splitlines():
        if line.startswith("task = ") or line.startswith("config keys"):
            block, section = line.split(":")[0], ""
        m = re.match(r"^  \[(\w+)\]$", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^  (\w+) = .*\[(?:each of )?([a-z0-9_]+(?:, [a-z0-9_]+)*)\]$", line)
        if m and section:
            out[(block, f"{section}.{m.group(1)}")] = m.group(2).split(", ")
    return out


_MODELS = {}


def _model(mod, task, m):
    if task not in _MODELS:
        _MODELS[task] = mod.build_model(m, 12) if task == "text" else mod.build_model(m)
    return _MODELS[task]


def _accepts(mod, task: str, key: str, value) -> bool:
    """Whether ``task`` takes ``value`` for ``key``: the config loads, the library takes it
    (TrainConfig for [train], the model for [model], a solver swap for eval.solvers and
    eval.schemes), independently of what --help prints."""
    from opsplit.cli.config import ConfigError, load
    from opsplit.control import solved_with

    section, name = key.split(".")
    v = [value] if isinstance(mod.SCHEMA[section][name].default, list) else value
    small = {"digits": {"d_model": 8, "heads": 2, "d_ff": 8, "n_steps": 1, "T": 1.0}, "text": {"context": 8, "d_model": 8, "heads": 2, "layers": 1},
             "burgers": {"d_model": 8, "heads": 2, "n_steps": 1, "modes": 2, "d_ff": 8}}[task]
    try:
        cfg = load(mod.SCHEMA, data={"task": task, "model": dict(small), section: {name: v}})
        if section == "train":
            mod.train_config(cfg, progress=False)
            return True
        model = _model(mod, task, cfg["model"]) if section == "eval" else \
            mod.build_model(cfg["model"], 12) if task == "text" else mod.build_model(cfg["model"])
        if key == "eval.solvers":
            with solved_with(model, solver=value):
                pass
        if key == "eval.schemes":
            with solved_with(model, scheme=value):
                pass
    except (ConfigError, ValueError, TypeError):
        return False
    return True


@pytest.mark.parametrize("task", ["digits", "text", "burgers"])
def test_help_lists_exactly_the_values_each_key_accepts(task):
    """Issue 47: `opsplit train --help` lists every task's keys, each choice key with exactly
    the values that task takes (before: the text task's schemes were listed as "lie, strang";
    parallel is taken); the --scheme flag's help lists each task's schemes the same way.
    Each value listed anywhere in the help (and a few more) is tried on the task."""
    from opsplit.analysis.problems import SCHEMES
    from opsplit.cli.tasks import MODULES
    from opsplit.models.token_decoder import ATTENTIONS
    from opsplit.solvers import SOLVERS

    text = _help(["train"])
    listed = _listed(text)
    pool = {v for vs in listed.values() for v in vs} | set(SCHEMES) | set(SOLVERS) | set(ATTENTIONS) | {"bogus"}
    mod = MODULES[task]
    block = f'task = "{task}"' + (" (the default)" if task == "digits" else "")
    keys = [k for (b, k) in listed if b == block]
    assert {"model.scheme", "model.attention" if task != "digits" else "train.gradient"} <= set(keys), keys
    for key in keys:
        if key.startswith("data."):
            continue  # data.corpus: a corpus each (read when the run starts)
        took = sorted(v for v in pool if _accepts(mod, task, key, v))
        assert sorted(listed[(block, key)]) == took, (task, key)
    flag = " ".join(text.split())
    assert f"{task}: {', '.join(mod.SCHEMA['model']['scheme'].choices)}" in flag
    assert "text: lie, strang, parallel" in flag


def _examples():
    """Every documented example config: the ``<name>.toml:`` blocks of the commands' EXAMPLE
    strings and the TOML code blocks of docs/*.md and README.md, as ``(where, command,
    text)``."""
    from opsplit.cli.app import COMMANDS

    out = []
    for name, mod in COMMANDS.items():
        for m in re.finditer(r"^(\w+)\.toml:\n((?:  .*\n?)+)", mod.EXAMPLE, re.M):
            text = "\n".join(line[2:] for line in m.group(2).splitlines())
            out.append((f"opsplit {name} --help: {m.group(1)}.toml", text))
    for p in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for i, m in enumerate(re.finditer(r"```toml\n(.*?)```", p.read_text(), re.S)):
            out.append((f"{p.relative_to(ROOT)} block {i + 1}", m.group(1)))
    rows = []
    for where, text in out:
        sections = set(re.findall(r"^\[(\w+)\]", text, re.M))
        command = ("train" if "task =" in text or sections & {"train", "objective", "eval"} else
                   "convert" if sections & {"convert", "torch", "vit", "cvt", "gpt2", "llama", "qwen2", "mistral"}
                   else "compare" if "compare" in sections else "solve")
        rows.append(pytest.param(command, text, id=where))
    return rows


@pytest.mark.parametrize("command, text", _examples())
def test_every_documented_example_config_prints(command, text, tmp_path, capsys, monkeypatch):
    """Issue 47: every example config of the commands' --help and of the docs is a valid
    config of its command: `--print-config` accepts it with its defaults (exit 0)."""
    monkeypatch.chdir(tmp_path)
    rc = main([command, "--config", _toml(tmp_path, text), "--print-config"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip() and not any(tmp_path.glob("opsplit-runs"))


@pytest.mark.parametrize("toml, key", [
    ("[train]\nepochs = 1000000000000\n", "train.epochs = 1000000000000"),
    ('task = "text"\n[train]\nmax_steps = 1000000000000\n', "train.max_steps = 1000000000000"),
    ('task = "burgers"\n[data]\nsolver_steps = 1000000000000\n', "data.solver_steps = 1000000000000"),
])
def test_print_config_checks_but_does_not_refuse_the_cost(toml, key, tmp_path, capsys, monkeypatch):
    """Issue 47: --print-config of a config the size guard refuses (every task) prints it,
    with one line on stderr saying what the run would need, and builds nothing (neither the
    model nor the data); the run itself is refused (exit 2, nothing written)."""
    from opsplit.cli.tasks import MODULES

    def built(cfg):
        raise AssertionError("prepare ran for --print-config over the guard")

    for mod in MODULES.values():
        monkeypatch.setattr(mod, "prepare", built)
    monkeypatch.chdir(tmp_path)
    cfg = _toml(tmp_path, toml)
    assert main(["train", "--config", cfg, "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert f"{key.split('.')[1].split(' = ')[0]} = 1000000000000" in out
    assert err.count("\n") == 1 and "note: not built" in err and f"{key}: the job needs an estimated" in err
    assert main(["train", "--config", cfg, "--out", str(tmp_path / "out")]) == 2
    assert f"{key}: the job needs an estimated" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "opsplit-runs").exists()


def test_a_run_of_an_earlier_version_resumes_with_its_keys_renamed(tmp_path, capsys):
    """A digits run whose checkpoint recorded the augmentation as train.shift (before it was
    data.shift) resumes once its config.toml's keys are renamed: the same value under its
    former name is the same setting (the checkpoint checks of --resume, run by --print-config);
    another value is refused naming both names, and --allow-changes takes either."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _train_helpers import rewrite_checkpoint

    from opsplit.control.checkpoint import latest_checkpoint

    run = tmp_path / "run"
    cfg = _toml(tmp_path, TRAIN.replace("epochs = 2", "epochs = 1").replace("limit = 64", "limit = 16").replace(
        "n_steps = [1, 2, 4]", 'n_steps = [2]\nsolvers = ["heun"]\n'))
    assert main(["train", "--config", cfg, "--out", str(run), "--no-progress"]) == 0

    def old_name(value):
        def edit(m):
            extra = m["config"]["extra"]
            del extra["data.shift"]
            extra["train.shift"] = value
        return edit

    resume = ["train", "--resume", str(run), "--print-config"]
    rewrite_checkpoint(latest_checkpoint(run / "train"), meta=old_name(1))  # config.toml: data.shift = 1
    capsys.readouterr()
    assert main(resume) == 0
    rewrite_checkpoint(latest_checkpoint(run / "train"), meta=lambda m: m["config"]["extra"].update({"train.shift": 0}))
    capsys.readouterr()
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "train.shift = 0 in the checkpoint" in err and "data.shift = '(not recorded)' in the checkpoint" in err
    assert "--allow-changes data.shift train.shift" in err
    assert main([*resume, "--allow-changes", "data.shift", "train.shift"]) == 0
