"""The report of ``opsplit train`` with ``task = "text"`` on text it has not seen repeated
(issue 47): bits per character on the deduplicated validation text, the solver-swap table
(finer N_t, Heun, RK4) and the Kneser-Ney baseline, each against a computation of its own
here (the windows cut by hand, the cross-entropy by ``F.cross_entropy``, the n-gram fitted
on the training text); ``model.init``; the documented recipe's config against the
benchmark's settings (benchmarks/continuity_text.py)."""

from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _helpers import csv_rows

from opsplit.analysis import NGram
from opsplit.cli import main
from opsplit.control.swap import solved_with
from opsplit.data import load_text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.usefixtures("one_thread")

# the topics: more than half of the 46 487 validation characters sit in paragraphs that
# share a 40-character substring with the training text; the first 100 windows of each
TEXT = """\
task = "text"
[model]
context = 24
d_model = 16
heads = 2
layers = 2
init = "nanogpt"
[train]
max_steps = 40
batch_size = 4
warmup_steps = 2
n_steps = [2]
save_every = 40
[eval]
n_steps = [1, 2, 4]
ngram_order = 2
windows = 100
[generate]
max_new_tokens = 4
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text_report")
    (tmp / "c.toml").write_text(TEXT)
    assert main(["train", "--config", str(tmp / "c.toml"), "--out", str(tmp / "run"), "--no-progress"]) == 0
    return tmp / "run"


def _paragraphs_without_shared(val: str, train: str, k: int = 40) -> str:
    """The validation paragraphs (blocks between blank lines) with no k-character substring
    of ``train``, joined by a blank line; a substring shared across a seam of the join drops
    the paragraphs it touches, until none is left (a transcription of the rule)."""
    grams = {train[i:i + k] for i in range(len(train) - k + 1)}
    keep = [p for p in re.split(r"\n[ \t]*\n", val) if p.strip() and
            not any(p[i:i + k] in grams for i in range(len(p) - k + 1))]
    while True:
        text = "\n\n".join(keep)
        hits = [i for i in range(len(text) - k + 1) if text[i:i + k] in grams]
        if not hits:
            return text
        starts, pos = [], 0
        for p in keep:
            starts.append(pos)
            pos += len(p) + 2
        keep = [p for p, a in zip(keep, starts) if not any(a - k < i < a + len(p) + 2 for i in hits)]


def _bits(model, ids, context, n_steps, solver=None, windows=100):
    """Mean next-character cross-entropy in bits over every position of the first
    ``windows`` non-overlapping windows of ``ids`` (cut here), one forward call."""
    k = min(windows, (ids.numel() - 1) // context)
    x = torch.stack([ids[i * context:(i + 1) * context] for i in range(k)])
    y = torch.stack([ids[i * context + 1:(i + 1) * context + 1] for i in range(k)])
    model.eval()
    with torch.no_grad(), solved_with(model, solver=solver):
        logits = model(x, n_steps=n_steps).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))) / math.log(2)


def test_report_scores_the_deduplicated_text_and_the_baseline(run):
    """The report's rows on the deduplicated validation text: every row of the solver-swap
    table (Euler at every eval.n_steps, Heun and RK4 from the training grid up) equals the
    bits per character of the trained model on windows cut here from the paragraphs kept
    here; the baseline table's model row is the training grid's and its whole-split column
    the eval table's; the Kneser-Ney row equals NGram fitted on the same training text."""
    from opsplit.cli.tasks.text import load_run

    cfg, vocab, model = load_run(run)
    corpus = load_text("pydoc_topics")
    train, val = vocab.decode(corpus.train), vocab.decode(corpus.val)
    dedup = _paragraphs_without_shared(val, train)
    assert 0 < len(dedup) < len(val) / 2  # most of the split repeats the training text
    ids = vocab.encode(dedup, errors="replace")
    table = csv_rows(run / "continuity.csv")
    want = {("euler", n): _bits(model, ids, 24, n) for n in (1, 2, 4)}
    want.update({(s, n): _bits(model, ids, 24, n, s) for s in ("heun", "rk4") for n in (2, 4)})
    got = {(r["solver"], int(r["n_t"])): float(r["bits_per_char"]) for r in table}
    assert got.keys() == want.keys()
    for key, v in want.items():
        assert got[key] == pytest.approx(v, rel=2e-6), key
    grid = next(r for r in table if r["training grid"] == "yes")
    assert (grid["solver"], grid["n_t"]) == ("euler", "2")
    base = csv_rows(run / "baseline.csv")
    assert len(base) == 2
    col = "deduplicated validation bits/char"
    assert float(base[0][col]) == pytest.approx(want["euler", 2], rel=2e-6)
    whole = _bits(model, corpus.val, 24, 2)
    assert float(base[0]["whole validation split bits/char"]) == pytest.approx(whole, rel=2e-6)
    assert dedup[:2401] != val[:2401] and abs(whole - want["euler", 2]) > 1e-3  # the two texts differ
    ngram = NGram(2, "kneser_ney").fit(train, vocab.size)
    assert float(base[1][col]) == pytest.approx(ngram.bits_per_char(dedup), rel=1e-9)
    assert float(base[1]["whole validation split bits/char"]) == pytest.approx(ngram.bits_per_char(val), rel=1e-9)
    assert abs(float(base[1][col]) - float(base[1]["whole validation split bits/char"])) > 0.01
    report = (run / "report.md").read_text()
    assert "The validation paragraphs that share no 40-character substring with the training text" in report
    assert f"{len(dedup)} of {len(val)} characters" in report
    assert f"Kneser-Ney 2-gram baseline fitted on the same {len(train)} training characters" in report


def test_held_out_text_and_its_fallbacks():
    """The held-out text is the validation paragraphs the training text does not repeat
    (their windows only); a split every paragraph of which the training text repeats, or
    one that leaves fewer characters than a window, falls back to the whole split and says
    why; eval.windows caps the windows."""
    from types import SimpleNamespace

    from opsplit.cli.config import load
    from opsplit.cli.tasks import text
    from opsplit.data import CharVocab

    para = "a paragraph of documentation repeated in every document, word for word."
    fresh = "a new paragraph that no training document holds, long enough for a window or two of text."
    vocab = CharVocab(sorted(set(para + fresh + "\n")))

    def corpus(train, val):
        return SimpleNamespace(vocab=vocab, train=vocab.encode(train), val=vocab.encode(val))

    def cfg(context, windows=0):
        return load(text.SCHEMA, data={"task": "text", "model": {"context": context}, "eval": {"windows": windows}})

    c = corpus("\n\n".join([para] * 3), "\n\n".join([para, fresh, para]))
    held = text.held_out(cfg(16), c)
    assert held["deduplicated"] and held["text"] == fresh and held["why"] is None
    assert len(held["windows"]) == (len(fresh) - 1) // 16
    assert vocab.decode(held["windows"].inputs.flatten()) == fresh[:16 * len(held["windows"])]
    assert len(text.held_out(cfg(16, windows=2), c)["windows"]) == 2
    long = para + " " * 200  # a repeated paragraph: the whole split holds several windows
    for val, context, why in (("\n\n".join([long, para]), 16, "every paragraph of the validation split shares a "
                               "40-character substring with the training text"),
                              ("\n\n".join([long, fresh]), 128, f"the {len(fresh)} characters of the validation "
                               "split that share no 40-character substring with the training text are fewer than one "
                               "window of model.context = 128 and its targets")):
        held = text.held_out(cfg(context), corpus("\n\n".join([para] * 3), val))
        assert not held["deduplicated"] and held["why"] == why
        assert held["text"] == val and len(held["windows"]) == (len(val) - 1) // context


def test_model_init_key():
    """model.init = "nanogpt" builds the transcription's model (tests/test_nanogpt_init.py)
    from model.seed; the default ("gpt2") is the model built as before the key existed."""
    from test_nanogpt_init import peer

    from opsplit.cli.config import load
    from opsplit.cli.tasks import text
    from opsplit.models import DecoderLM

    m = load(text.SCHEMA, data={"task": "text", "model": {"context": 12, "d_model": 16, "heads": 4, "layers": 3,
                                                          "init": "nanogpt", "seed": 5}})["model"]
    model = text.build_model(m, 13)
    ref = peer(5, 13, 12, 16, 3, 4, 64)
    ids = torch.randint(13, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, ref(ids), rtol=0, atol=1e-6)
    m = load(text.SCHEMA, data={"task": "text", "model": {"context": 12, "d_model": 16, "seed": 5}})["model"]
    assert m["init"] == "gpt2"
    before = DecoderLM(text.decoder_config(m, 13), generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(text.build_model(m, 13).state_dict().values(),
                                                   before.state_dict().values()))


def _documented_recipe() -> str:
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", (ROOT / "docs" / "text.md").read_text(), re.S)
              if 'init = "nanogpt"' in b and "pydoc_docstrings" in b]
    assert len(blocks) == 1
    return blocks[0]


def test_documented_recipe_is_the_benchmarks_run(tmp_path):
    """The recipe's TOML block of docs/text.md sets what docs/continuity.md's benchmark
    command runs (benchmarks/continuity_text.py, variant par_splitw0.3_k0.01): the same
    TrainConfig, objective weights, architecture, initial weights (the same seed), training
    windows and evaluation grid; the guard estimates it above the hour (hence --force)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import continuity_text as ct
    import train_text as tt

    from opsplit.cli.config import load
    from opsplit.cli.tasks import text

    line = next(c for c in (ROOT / "docs" / "continuity.md").read_text().splitlines()
                if "continuity_text.py" in c and "par_splitw0.3_k0.01" in c)
    argv = shlex.split(line.strip())
    args = ct.main_args(argv[argv.index("benchmarks/continuity_text.py") + 1:])
    v = ct.VARIANTS[args.variants[0]]
    (tmp_path / "r.toml").write_text(_documented_recipe())
    cfg = load(text.SCHEMA, tmp_path / "r.toml")
    mine, theirs = text.train_config(cfg, progress=False), ct.config(args, v)
    for f in ("solvers", "solvers_weights", "solvers_split", "solvers_split_weights", "batch_size", "optimizer", "lr",
              "weight_decay", "betas", "schedule", "warmup_steps", "min_lr_ratio", "grad_clip", "seed", "shuffle",
              "n_steps", "epochs"):
        a, b = getattr(mine, f), getattr(theirs, f)
        assert (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b), f
    assert cfg["train"]["max_steps"] == args.steps
    assert text.objective(cfg).kinetic == v["kinetic"]
    m, d = cfg["model"], cfg["data"]
    assert (d["corpus"], d["split_seed"], d["val_fraction"]) == (args.corpus, args.split_seed, args.val_fraction)
    assert m["scheme"] == v["scheme"] and m["seed"] == args.seed and m["init"] == "nanogpt"
    assert text.decoder_config(m, 111) == tt.opsplit_config(111, args, scheme=v["scheme"])
    a, b = text.build_model(m, 111), ct.build(args, 111, scheme=v["scheme"])
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert cfg["eval"]["n_steps"] == args.eval_n
    assert [text.training_grid(cfg) * k for k in (1, 2, 4, 8, 16)] == args.levels
    assert cfg["eval"]["ngram_order"] == 7 and cfg["eval"]["solvers"] == ["heun", "rk4"]
    assert text.estimate(cfg).seconds > 3600
