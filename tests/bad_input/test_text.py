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
)


@pytest.mark.parametrize("case", CASES)
def test_text_bad_input(case):
    run_case(case)


# -- the opsplit command: `opsplit train` with task = "text", `opsplit generate` ---------------------
from .test_cli import _check, _setup, _tree, rows  # noqa: E402  (the CLI table's row checks)

TEXT = 'task = "text"\n[model]\ncontext = 24\nd_model = 16\nheads = 2\nlayers = 2\n[train]\nsteps = 2\n' \
       'batch_size = 2\n[data]\nmax_chars = 20000\n[generate]\nmax_new_tokens = 8\n'
CFG = ("--config", "{tmp}/c.toml")
OUT = ("--out", "{tmp}/out")


def cfg(text=TEXT, **replace):
    for k, v in replace.items():
        text = text.replace(k, v)
    return {"c.toml": text}


RUN = {"g/config.toml": TEXT, "g/vocab.json": '{"chars": "The abc", "unknown_id": 0}'}

CLI = rows(
    ("cli-task-unknown", ["train", *CFG, *OUT], "task: expected one of 'digits', 'text', got 'poetry'",
     cfg('task = "poetry"\n')),
    ("cli-top-key-unknown", ["train", *CFG, *OUT], "config: key 'color' is outside any section",
     cfg('color = "red"\n' + TEXT)),
    ("cli-text-epochs", ["train", *CFG, "--epochs", "3", *OUT], "--epochs: the text task trains for train.steps",
     cfg()),
    ("cli-text-heads", ["train", *CFG, *OUT], "model.heads: expected a divisor of model.d_model = 16 (softmax heads split the features), got 3",
     cfg(**{"heads = 2": "heads = 3"})),
    ("cli-text-scheme", ["train", *CFG, "--scheme", "parallel", *OUT],
     "model.scheme: expected one of 'lie', 'strang', got 'parallel'", cfg()),
    ("cli-text-adjoint", ["train", *CFG, "--gradient", "adjoint", *OUT],
     "train.gradient: expected one of 'backprop', 'checkpoint', got 'adjoint'", cfg()),
    ("cli-text-n-t-0", ["train", *CFG, "--n-steps", "0", *OUT], "train.n_steps: expected values >= 1, got [0]",
     cfg()),
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
     "with task = \"text\", '{tmp}/nothing' is not a folder"),
    ("gen-no-config", ["generate", "{tmp}/e"], "has no config.toml", {"e": None}),
    ("gen-digits-run", ["generate", "{tmp}/d"], "holds a training run with task = 'digits'",
     {"d/config.toml": "[model]\nd_model = 8\nheads = 2\n"}),
    ("gen-no-vocab", ["generate", "{tmp}/g"], "vocab.json' is missing or not a vocabulary", {"g/config.toml": TEXT}),
    ("gen-no-checkpoint", ["generate", "{tmp}/g"], "has no checkpoint under train/checkpoints", RUN),
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
