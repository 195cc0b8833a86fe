"""Bad input to the character-level text data and the text model: empty and one-character
corpora, a context longer than the data, a prompt with characters outside the vocabulary,
N_t = 0 at generation, the sliced decoder's unsupported options."""

import pytest
import torch

from opsplit.data import CharVocab, char_corpus, load_text, sample_windows, text_windows
from opsplit.models import DecoderConfig, DecoderLM

from ._table import cases, run_case

IDS = torch.arange(20)


def _gpt(**kw):
    base = dict(vocab_size=5, d_model=8, n_layers=2, n_heads=2, d_ff=16, norm="layer", mlp="plain",
                activation="gelu", positions="learned", max_positions=8, tie_embeddings=True)
    base.update(kw)
    return DecoderConfig(**base)


def _generate(**kw):
    m = DecoderLM(_gpt())
    return m.generate(torch.zeros(1, 2, dtype=torch.long), 2, **kw)


CASES = cases(
    ("corpus-empty-list", lambda: char_corpus([]), ValueError, r"char_corpus\.documents: empty corpus"),
    ("corpus-empty-strings", lambda: char_corpus(["", ""]), ValueError, r"empty corpus"),
    ("corpus-one-char", lambda: char_corpus(["a", ""]), ValueError, r"has 1 character; .*at least 2"),
    ("corpus-one-document", lambda: char_corpus(["abc"]), ValueError, r"1 non-empty document; a split by document"),
    ("corpus-one-string", lambda: char_corpus("abc"), TypeError, r"char_corpus\.documents: .*one string"),
    ("corpus-not-str", lambda: char_corpus(["ab", 3]), TypeError, r"document '1' is not one"),
    ("corpus-int", lambda: char_corpus(5), TypeError, r"char_corpus\.documents"),
    ("val-fraction-0", lambda: char_corpus(["ab", "cd"], val_fraction=0.0), ValueError, r"val_fraction.*\(0, 1\)"),
    ("val-fraction-1", lambda: char_corpus(["ab", "cd"], val_fraction=1), ValueError, r"val_fraction"),
    ("val-fraction-str", lambda: char_corpus(["ab", "cd"], val_fraction="0.1"), ValueError, r"val_fraction"),
    ("seed-negative", lambda: char_corpus(["ab", "cd"], seed=-1), ValueError, r"char_corpus\.seed.*>= 0"),
    ("seed-float", lambda: char_corpus(["ab", "cd"], seed=0.5), TypeError, r"char_corpus\.seed"),
    ("corpus-name", lambda: load_text("shakespeare"), ValueError, r"load_text\.corpus: expected one of"),
    ("max-chars-1", lambda: load_text(max_chars=1), ValueError, r"load_text\.max_chars.*>= 2"),
    ("docstrings-max-chars-0", lambda: load_text("pydoc_docstrings", max_chars=0), ValueError,
     r"load_text\.max_chars.*>= 2"),
    ("docstrings-seed-negative", lambda: load_text("pydoc_docstrings", seed=-1), ValueError, r"char_corpus\.seed"),
    ("context-longer-than-data", lambda: text_windows(IDS, 20), ValueError,
     r"context: a window of 20 characters .* need 21 characters, but text has 20"),
    ("context-longer-sampler", lambda: sample_windows(IDS, 50, 2), ValueError, r"context.*but ids has 20"),
    ("context-0", lambda: text_windows(IDS, 0), ValueError, r"context: expected an integer >= 1"),
    ("context-float", lambda: text_windows(IDS, 2.0), TypeError, r"context: expected an integer"),
    ("windows-n-0", lambda: text_windows(IDS, 4, 0), ValueError, r"n: expected an integer >= 1"),
    ("ids-float", lambda: text_windows(IDS.float(), 4), ValueError, r"1-D integer tensor"),
    ("ids-2d", lambda: text_windows(IDS.view(4, 5), 2), ValueError, r"1-D integer tensor"),
    ("ids-list", lambda: text_windows(list(range(9)), 2), TypeError, r"expected a 1-D int64 tensor"),
    ("batch-0", lambda: sample_windows(IDS, 4, 0), ValueError, r"batch_size: expected an integer >= 1"),
    ("generator-int", lambda: sample_windows(IDS, 4, 2, 0), TypeError, r"generator: expected a torch\.Generator"),
    ("vocab-empty", lambda: CharVocab(""), ValueError, r"CharVocab\.chars: expected at least one character"),
    ("vocab-multichar", lambda: CharVocab(["ab"]), TypeError, r"one-character strings"),
    ("prompt-unknown-chars", lambda: CharVocab("abc").encode("abz\u00e9", name="prompt"), ValueError,
     r"prompt: character\(s\) 'z', 'é' are not in the vocabulary of 3 characters"),
    ("prompt-not-str", lambda: CharVocab("abc").encode(b"ab", name="prompt"), TypeError, r"prompt: expected a string"),
    ("encode-errors", lambda: CharVocab("abc").encode("a", errors="ignore"), ValueError, r"'strict' or 'replace'"),
    ("decode-out-of-range", lambda: CharVocab("abc").decode([4]), ValueError, r"ids in \[0, 3\], got 4"),
    ("decode-float", lambda: CharVocab("abc").decode(torch.ones(2)), ValueError, r"1-D integer tensor"),
    ("generate-n_t-0", lambda: _generate(n_steps=0), ValueError, r"n_steps \(N_t\).*>= 1"),
    ("generate-n_t-float", lambda: _generate(n_steps=1.5), TypeError, r"n_steps \(N_t\)"),
    ("forward-n_t-0", lambda: DecoderLM(_gpt())(torch.zeros(1, 2, dtype=torch.long), n_steps=0), ValueError,
     r"n_steps \(N_t\).*>= 1"),
    ("gpt-attention", lambda: _gpt(attention="linear"), ValueError, r"DecoderConfig\.attention: expected one of"),
    ("gpt-scheme", lambda: _gpt(scheme="yoshida"), ValueError, r"DecoderConfig\.scheme: expected one of"),
    ("sliced-rope", lambda: _gpt(attention="sliced_relu", positions="rope"), ValueError,
     r"DecoderConfig\.positions: attention='sliced_relu' has no rotary"),
    ("sliced-qkv-bias", lambda: _gpt(attention="sliced_relu", qkv_bias=True), ValueError, r"DecoderConfig\.qkv_bias"),
    ("sliced-gqa", lambda: _gpt(attention="sliced_relu", n_kv_heads=1), ValueError, r"DecoderConfig\.n_kv_heads"),
    # issue 47: nanoGPT's initialisation, for nanoGPT's layout only
    ("init-unknown", lambda: DecoderLM(_gpt()).reset_parameters(init="xavier"), ValueError,
     r"DecoderLM\.reset_parameters\.init: expected one of \('gpt2', 'nanogpt'\), got 'xavier'"),
    ("init-nanogpt-sliced", lambda: DecoderLM(_gpt(attention="sliced_relu")).reset_parameters(init="nanogpt"),
     ValueError, r"init: 'nanogpt' initialises nanoGPT's layout .* this model has attention='sliced_relu'"),
    ("init-nanogpt-rms", lambda: DecoderLM(_gpt(norm="rms")).reset_parameters(init="nanogpt"), ValueError,
     r"init: 'nanogpt' .* this model has norm='rms'"),
    ("init-nanogpt-gqa", lambda: DecoderLM(_gpt(n_kv_heads=1)).reset_parameters(init="nanogpt"), ValueError,
     r"init: 'nanogpt' initialises nanoGPT's attention .* n_kv_heads=1, n_heads=2"),
    ("init-generator-int", lambda: DecoderLM(_gpt()).reset_parameters(3, init="nanogpt"), TypeError,
     r"DecoderLM\.reset_parameters\.generator: expected a torch\.Generator or None, got int"),
)


@pytest.mark.parametrize("case", CASES)
def test_text_bad_input(case):
    run_case(case)


# -- the opsplit command: `opsplit train` with task = "text", `opsplit generate` ---------------------
from .test_cli import (  # noqa: E402  (the CLI table's row checks)
    SOLVE_DIR,
    _check,
    _setup,
    _tree,
    all_weights,
    check_run_row,
    checkpoint_edit,
    config_edit,
    finished_run,
    first_weight,
    rows,
    run_rows,
    scaled_weights,
)

TEXT = 'task = "text"\n[model]\ncontext = 24\nd_model = 16\nheads = 2\nlayers = 2\n[train]\nmax_steps = 2\n' \
       'batch_size = 2\n[data]\nmax_chars = 20000\n[generate]\nmax_new_tokens = 8\n'
CFG = ("--config", "{tmp}/c.toml")
OUT = ("--out", "{tmp}/out")


def cfg(text=TEXT, **replace):
    for k, v in replace.items():
        text = text.replace(k, v)
    return {"c.toml": text}


RUN = {"g/config.toml": TEXT, "g/vocab.json": '{"chars": "The abc", "unknown_id": 0}'}

CLI = rows(
    ("cli-task-unknown", ["train", *CFG, *OUT], "task: expected one of 'digits', 'text', 'burgers', got 'poetry'",
     cfg('task = "poetry"\n')),
    ("cli-top-key-unknown", ["train", *CFG, *OUT], "config: key 'color' is outside any section",
     cfg('color = "red"\n' + TEXT)),
    ("cli-text-epochs", ["train", *CFG, "--epochs", "3", *OUT], "--epochs: the text task trains for train.max_steps",
     cfg()),
    ("cli-text-heads", ["train", *CFG, *OUT], "model.heads: expected a divisor of model.d_model = 16 (softmax heads split the features), got 3",
     cfg(**{"heads = 2": "heads = 3"})),
    ("cli-text-scheme", ["train", *CFG, "--scheme", "hybrid", *OUT],
     "model.scheme: expected one of 'lie', 'strang', 'parallel', got 'hybrid'", cfg()),
    ("cli-text-adjoint", ["train", *CFG, "--gradient", "adjoint", *OUT],
     "train.gradient: expected one of 'backprop', 'checkpoint', got 'adjoint'", cfg()),
    ("cli-text-n-t-0", ["train", *CFG, "--n-steps", "0", *OUT], "train.n_steps: expected an integer >= 1, got 0",
     cfg()),
    ("cli-text-n-steps-repeated", ["train", *CFG, *OUT], "train.n_steps: N_t = 2 is listed twice, got [2, 2]", cfg(**{"batch_size = 2\n": "batch_size = 2\nn_steps = [2, 2]\n"})),
    ("cli-text-n-steps-negative", ["train", *CFG, *OUT], "train.n_steps: expected an integer >= 1, got -1",
     cfg(**{"batch_size = 2\n": "batch_size = 2\nn_steps = [2, -1]\n"})),
    ("cli-text-solver-unknown", ["train", *CFG, *OUT], "train.solvers: expected solver names from ('euler', 'heun', "
     "'rk4'), got 'midpoint'", cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers = ["euler", "midpoint"]\n'})),
    ("cli-text-solver-repeated", ["train", *CFG, *OUT], "train.solvers: solver 'heun' is listed twice, got ['heun', 'heun']",
     cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers = ["heun", "heun"]\n'})),
    ("cli-text-solver-weights-count", ["train", *CFG, *OUT], "train.solvers_weights: expected one weight per entry of "
     "solvers (2), got 1",
     cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers = ["euler", "heun"]\nsolvers_weights = [1]\n'})),
    ("cli-text-solver-weights-zero", ["train", *CFG, *OUT], "train.solvers_weights: expected finite weights > 0, got 0",
     cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers = ["euler", "heun"]\nsolvers_weights = [3, 0]\n'})),
    ("cli-text-solvers-split-own-only", ["train", *CFG, *OUT], "train.solvers_split: a split of every batch between "
     "solvers needs solvers (the solvers it shares the batch between) (train.solvers = ['euler'] is the model's own: "
     "no draw)",
     cfg(**{"batch_size = 2\n": "batch_size = 2\nsolvers_split = true\n"})),
    ("cli-text-solvers-split-batch", ["train", *CFG, *OUT], "train.solvers_split: a batch of 2 gives 'heun' no "
     "window (windows per solver {'euler': 2, 'heun': 0})",
     cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers = ["euler", "heun"]\nsolvers_weights = [3, 1]\n'
            "solvers_split = true\n"})),
    ("cli-text-solvers-split-not-bool", ["train", *CFG, *OUT], "train.solvers_split: expected",
     cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers = ["euler", "heun"]\nsolvers_split = 1\n'})),
    ("cli-text-solver-weights-name", ["train", *CFG, *OUT], "train.solvers_weights: expected None, 'uniform', 'cost' "
     "or a list of weights > 0, got 'costly'",
     cfg(**{"batch_size = 2\n": 'batch_size = 2\nsolvers_weights = "costly"\n'})),
    ("cli-text-kinetic-negative", ["train", *CFG, *OUT], "objective.kinetic: expected a finite weight >= 0, got -0.1",
     cfg(**{"[data]": "[objective]\nkinetic = -0.1\n[data]"})),
    ("cli-text-kinetic-nan", ["train", *CFG, *OUT], "objective.kinetic: expected a finite weight >= 0, got nan",
     cfg(**{"[data]": "[objective]\nkinetic = nan\n[data]"})),
    ("cli-text-acceleration-inf", ["train", *CFG, *OUT], "objective.acceleration: expected a finite weight >= 0, got inf",
     cfg(**{"[data]": "[objective]\nacceleration = inf\n[data]"})),
    ("cli-text-kinetic-checkpoint", ["train", *CFG, "--gradient", "checkpoint", *OUT], "objective.kinetic: a flow "
     "cost reads every step of the forward solve, and the checkpointed time loop (gradient='checkpoint', or 'adjoint' "
     "with snapshots) recomputes steps",
     cfg(**{"[data]": "[objective]\nkinetic = 0.1\n[data]"})),
    # issue 47: the objective's weights checked on the untrained model before the run folder is made
    ("cli-text-kinetic-1e308", ["train", *CFG, *OUT], "objective.kinetic: a weight of 1e+308 is beyond the largest "
     "float32 number (3.4e+38)", cfg(**{"[data]": "[objective]\nkinetic = 1e308\n[data]"})),
    ("cli-text-kinetic-gradient-overflow", ["train", *CFG, *OUT], "objective.kinetic: the weight 1e+30 times the "
     "gradient of the flow's kinetic energy", cfg(**{"[data]": "[objective]\nkinetic = 1e30\n[data]"})),
    # issue 43: a key of an earlier version names its new name
    ("cli-text-old-steps", ["train", *CFG, *OUT], "train.steps: renamed train.max_steps (the name of what it sets); "
     "expected max_steps = ... under [train]", cfg(**{"max_steps = 2": "steps = 2"})),
    ("cli-text-old-kinetic", ["train", *CFG, *OUT], "train.kinetic: renamed objective.kinetic",
     cfg(**{"batch_size = 2\n": "batch_size = 2\nkinetic = 0.1\n"})),
    ("cli-text-old-eval-windows", ["train", *CFG, *OUT], "data.eval_windows: renamed eval.windows",
     cfg(**{"max_chars = 20000": "max_chars = 20000\neval_windows = 4"})),
    ("cli-text-context-longer-than-data", ["train", *CFG, *OUT],
     "model.context: a window of 3000 characters and its targets need 3001 characters, but the validation split",
     cfg(**{"context = 24": "context = 3000", "max_chars = 20000": "max_chars = 12000"})),
    ("cli-text-one-document", ["train", *CFG, *OUT], "data: char_corpus.documents: corpus 'pydoc_topics' has 1 "
     "non-empty document", cfg(**{"max_chars = 20000": "max_chars = 50"})),
    ("cli-text-prompt-unknown", ["train", *CFG, *OUT], "generate.prompt: character(s) 'λ' are not in the vocabulary",
     cfg(**{"max_new_tokens = 8\n": 'max_new_tokens = 8\nprompt = "λ"\n'})),
    ("cli-text-gen-too-long", ["train", *CFG, *OUT], "generate.max_new_tokens: the prompt (4 characters) and 30 "
     "new characters exceed model.context = 24", cfg(**{"max_new_tokens = 8": "max_new_tokens = 30"})),
    ("gen-n-t-0", ["generate", "{tmp}/g", "--n-t", "0"], "--n-t: expected N_t >= 1 (time steps of the solve), got 0",
     RUN),
    ("gen-n-t-negative", ["generate", "{tmp}/g", "--n-t", "-2"], "--n-t: expected N_t >= 1", RUN),
    ("gen-n-t-text", ["generate", "{tmp}/g", "--n-t", "four"], "argument --n-t: invalid int value: 'four'", RUN),
    ("gen-temperature-0", ["generate", "{tmp}/g", "--temperature", "0"], "--temperature: expected a finite number > 0",
     RUN),
    ("gen-max-new-negative", ["generate", "{tmp}/g", "--max-new-tokens", "-1"], "--max-new-tokens: expected an "
     "integer >= 0, got -1", RUN),
    ("gen-seed-negative", ["generate", "{tmp}/g", "--seed", "-1"], "--seed: expected a seed from 0", RUN),
    ("gen-empty-prompt", ["generate", "{tmp}/g", "--prompt", ""], "--prompt: expected at least one character", RUN),
    ("gen-prompt-unknown", ["generate", "{tmp}/g", "--prompt", "Thé λ"], "--prompt: character(s) 'é', 'λ' are not "
     "in the vocabulary of 7 characters", RUN),
    ("gen-no-folder", ["generate", "{tmp}/nothing"], "folder: expected the output folder of an opsplit train run "
     "with task = \"text\" (its config.toml, vocab.json and checkpoints), '{tmp}/nothing' is not a folder"),
    ("gen-no-config", ["generate", "{tmp}/e"], "has no config.toml", {"e": None}),
    ("gen-digits-run", ["generate", "{tmp}/d"], "holds a training run with task = 'digits'",
     {"d/config.toml": "[model]\nd_model = 8\nheads = 2\n"}),
    ("gen-no-vocab", ["generate", "{tmp}/g"], "vocab.json' is missing or not a vocabulary", {"g/config.toml": TEXT}),
    ("gen-no-checkpoint", ["generate", "{tmp}/g"], "has no checkpoint under train/checkpoints", RUN),
    # the task line names `task` (before: model.context: unknown key)
    ("cli-task-upper-case", ["train", *CFG, *OUT], "task: expected one of 'digits', 'text', 'burgers', got 'TEXT' (task names "
     "are lower case: 'text')", cfg(**{'task = "text"': 'task = "TEXT"'})),
    ("cli-task-int", ["train", *CFG, *OUT], "task: expected a string, one of 'digits', 'text', 'burgers', got 5 (int)",
     cfg(**{'task = "text"': "task = 5"})),
    ("cli-task-bool", ["train", *CFG, *OUT], "task: expected a string, one of 'digits', 'text', 'burgers', got True (bool)",
     cfg(**{'task = "text"': "task = true"})),
    ("cli-task-missing", ["train", *CFG, *OUT], "task: the config has no task line, so it is read as task = "
     "\"digits\", but model.context, model.layers, data.max_chars, [generate] belong(s) to task = \"text\"",
     cfg(**{'task = "text"\n': ""})),
    ("cli-task-missing-generate", ["train", *CFG, *OUT], "task: the config has no task line, so it is read as task = "
     "\"digits\", but [generate] belong(s) to task = \"text\"", {"c.toml": '[generate]\nprompt = "a"\n'}),
    ("cli-task-resume-upper-case", ["train", "--resume", "{tmp}/u"], "task: expected one of 'digits', 'text', 'burgers', got "
     "'Text'", {"u/config.toml": TEXT.replace('task = "text"', 'task = "Text"')}),
    # the size guard counts the training windows (before: passed, then 9.6 GB in one allocation)
    ("cli-text-window-memory", ["train", *CFG, *OUT], "train.max_steps = 200000000: the job needs an estimated "
     "28.8 TB of memory", cfg(**{"context = 24": "context = 2", "steps = 2\n": "steps = 200000000\n",
                            "batch_size = 2": "batch_size = 2000",
                            "max_new_tokens = 8": 'max_new_tokens = 0\nprompt = "a"'})),
    ("cli-text-temperature-tiny", ["train", *CFG, *OUT], "generate.temperature: expected a temperature >= 1e-06 "
     "(smaller ones overflow the float32 logits or sample the most likely character), got 1e-300",
     cfg(**{"max_new_tokens = 8\n": "max_new_tokens = 8\ntemperature = 1e-300\n"})),
    ("cli-text-allow-changes-new-run", ["train", *CFG, *OUT, "--allow-changes", "train.lr"],
     "--allow-changes: only with --resume", cfg()),
    ("gen-temperature-1e-300", ["generate", "{tmp}/g", "--temperature", "1e-300"], "--temperature: expected a "
     "temperature >= 1e-06, got 1e-300", RUN),
    ("gen-temperature-1e-40", ["generate", "{tmp}/g", "--temperature", "1e-40"], "--temperature: expected a "
     "temperature >= 1e-06", RUN),
    ("gen-temperature-nan", ["generate", "{tmp}/g", "--temperature", "nan"], "--temperature: expected a finite number "
     "> 0, got nan", RUN),
    ("gen-greedy-temperature", ["generate", "{tmp}/g", "--greedy", "--temperature", "0.5"], "--temperature: --greedy "
     "takes the most likely character, no temperature applies", RUN),
    ("gen-solve-folder", ["generate", "{tmp}/s"], "folder: expected the output folder of an opsplit train run "
     "with task = \"text\" (its config.toml, vocab.json and checkpoints), '{tmp}/s' holds the output of opsplit solve", SOLVE_DIR),
    ("gen-default-folder", ["generate", "{tmp}/d"], "'{tmp}/d' holds the output of the default job",
     {"d/manifest.json": '{"title": "opsplit: the default job", "blocks": []}', "d/train.toml": ""}),
)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("row", CLI)
def test_text_cli_bad_input(row, tmp_path, capsys, monkeypatch):
    from opsplit.cli import main

    _setup(tmp_path, row.files)
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in row.argv])
    _check(row, tmp_path, rc, capsys.readouterr().err, before)


# -- a real text run: --resume against an edited config.toml or a damaged checkpoint, and generate ----
RESUME = ("train", "--resume", "{run}", "--no-progress")
GEN = ("generate", "{run}")
RUN_ROWS = run_rows(
    ("resume-max-chars", RESUME, "differs from the run that wrote the checkpoint '{run}/train/checkpoints/"
     "step-00000002': data.max_chars = 20000 in the checkpoint, 30000 in config.toml",
     config_edit("max_chars = 20000", "max_chars = 30000")),
    ("resume-solvers", RESUME, "train.solvers = unset (the default) in the checkpoint, ['euler', 'heun'] in "
     "config.toml",
     config_edit('solvers = ["euler"]', 'solvers = ["euler", "heun"]')),
    ("resume-split-seed", RESUME, "data.split_seed = 0 in the checkpoint, 7 in config.toml",
     config_edit("split_seed = 0", "split_seed = 7")),
    ("resume-val-fraction", RESUME, "data.val_fraction = 0.1 in the checkpoint, 0.2 in config.toml",
     config_edit("val_fraction = 0.1", "val_fraction = 0.2")),
    ("resume-lr", RESUME, "train.lr = 0.003 in the checkpoint, 0.01 in config.toml. A resume continues that run: "
     "restore the value(s) in config.toml, or start a new run with --out, or pass --allow-changes train.lr to "
     "continue with the new value(s)", config_edit("lr = 0.003", "lr = 0.01")),
    ("resume-seed", RESUME, "train.seed = 0 in the checkpoint, 4 in config.toml",
     config_edit("\nseed = 0\n\n[objective]", "\nseed = 4\n\n[objective]")),
    ("resume-steps", RESUME, "train.max_steps = 2 in the checkpoint, 3 in config.toml",
     config_edit("steps = 2\n", "steps = 3\n")),
    ("resume-batch", RESUME, "train.batch_size = 2 in the checkpoint, 3 in config.toml",
     config_edit("batch_size = 2\n", "batch_size = 3\n")),
    ("resume-n-steps", RESUME, "train.n_steps = [4] in the checkpoint, [1, 2] in config.toml",
     config_edit("n_steps = [4]", "n_steps = [1, 2]")),
    ("resume-scheme", RESUME, "the model ([model] edited): decoder.scheme = 'Lie (2 substeps: PreNorm, PreNorm)' in "
     "the checkpoint, 'Strang (2 substeps: PreNorm, PreNorm)' now",
     config_edit('scheme = "lie"', 'scheme = "strang"')),
    ("resume-d-model", RESUME, "'{run}/config.toml' differs from the run that wrote the checkpoint",
     config_edit("d_model = 16", "d_model = 8")),
    ("resume-truncated", RESUME, "--resume: checkpoint '{run}/train/checkpoints/step-00000002': state.safetensors has "
     "1000 bytes", checkpoint_edit(size=1000)),
    ("resume-nan-weight", RESUME, "hold(s) NaN/inf; a diverged model is not loaded, as save_checkpoint does not "
     "write one. Nothing was loaded; start a new run with --out", checkpoint_edit(first_weight(float("nan")))),
    ("resume-int-weight", RESUME, "is torch.int64 in the checkpoint, torch.float32 in the model; a tensor of another "
     "kind (integer for floating) is not cast", checkpoint_edit(all_weights(torch.Tensor.long))),
    ("resume-inf-exp_avg_sq", RESUME, "the optimizer state optimizer.0.exp_avg_sq", checkpoint_edit(
        lambda t: {k: v.clone().fill_(float("inf")) if k.endswith("exp_avg_sq") else v for k, v in t.items()})),
    ("resume-negative-step", RESUME, "meta.trainer.step: expected >= 0, got -5",
     checkpoint_edit(meta=lambda m: m["trainer"].update(step=-5))),
    ("resume-meta-not-json", RESUME, "meta.json is not valid JSON", lambda f: (
        f / "train" / "checkpoints" / "step-00000002" / "meta.json").write_text("{")),
    ("resume-allow-unknown", (*RESUME, "--allow-changes", "train.lrx"), "--allow-changes: expected keys that a resume "
     "compares (data.corpus, data.max_chars, data.split_seed, data.val_fraction, train.batch_size, "
     "train.coarse_controls, train.levels, train.levels_prolongation, train.levels_schedule, train.lr, "
     "train.max_steps, train.n_steps, train.n_steps_distill, train.seed, train.solvers, train.solvers_split, train.solvers_split_weights, "
     "train.solvers_weights, train.warmup_steps, train.weight_decay), got 'train.lrx'"),
    ("resume-allow-model-key", (*RESUME, "--allow-changes", "model.scheme"), "--allow-changes: expected keys that a "
     "resume compares", config_edit('scheme = "lie"', 'scheme = "strang"')),
    ("gen-nan-weights", GEN, "folder: checkpoint '{run}/train/checkpoints/step-00000002': the weights ",
     checkpoint_edit(first_weight(float("nan")))),
    ("gen-nan-weights-greedy", (*GEN, "--greedy"), "hold(s) NaN/inf; a diverged model is not loaded",
     checkpoint_edit(first_weight(float("nan")))),
    ("gen-inf-weights", GEN, "hold(s) NaN/inf", checkpoint_edit(first_weight(float("inf")))),
    ("gen-int-weights", GEN, "a tensor of another kind (integer for floating) is not cast",
     checkpoint_edit(all_weights(torch.Tensor.long))),
    ("gen-truncated", GEN, "state.safetensors has 1000 bytes", checkpoint_edit(size=1000)),
    ("gen-overflowing-weights", (*GEN, "--greedy"), "cannot be solved at the prompt at N_t = 2: GroupedQueryAttention: "
     "the attention scores", checkpoint_edit(scaled_weights(1e30))),
    ("gen-n-t-huge", (*GEN, "--n-t", "100000000"), "--n-t = 100000000: the job needs an estimated"),
    ("gen-n-t-huge-greedy", (*GEN, "--n-t", "100000000", "--greedy"), "--n-t = 100000000: the job needs an estimated"),
)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    return finished_run(tmp_path_factory, TEXT)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("row", RUN_ROWS)
def test_text_run_bad_input(row, text_run, tmp_path, capsys, monkeypatch):
    check_run_row(row, text_run, tmp_path, capsys, monkeypatch)
