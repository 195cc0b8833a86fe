"""``opsplit generate``: sample text from a character-level GPT trained by ``opsplit train``
with ``task = "text"``, at an N_t chosen now (the controls are functions of time, so the
model trained at one N_t — or at several — is solved on any time grid).

Everything is checked before the model is loaded: ``--n-t`` (>= 1), ``--temperature``
(>= 1e-6), ``--max-new-tokens`` (>= 0), the folder (a text training run with its config,
vocabulary and a checkpoint; another job's folder is named), the prompt (not empty; every
character in the run's vocabulary — one that is not is refused by name, never mapped to the
unknown id, which no training input ever was), the prompt's length with the new characters
against the model's learned positions, and the size and cost guard (``--n-t 100000000``:
the controls of every step and the key/value cache exceed the memory; ``--force``).  Then
the checkpoint is loaded (refused if its weights hold NaN/inf) and the logits at the prompt
must be finite.  Every run keeps a key/value cache (softmax and sliced attention).  The text
goes to stdout, one line about the run to stderr.

``--draft-n-t`` / ``--draft-solver`` decode speculatively (:mod:`opsplit.models.speculative`):
a cheaper solve of the same model drafts ``--num-draft-tokens`` characters (an integer >= 1 or
``auto``) that the solve at ``--n-t`` verifies — the same text greedily, the same distribution
when sampling; a draft that is not cheaper than ``--n-t`` is refused before the model loads,
and the line on stderr gives the acceptance rate.  A draft of fewer steps than the control
pieces reads them as the run was trained (``train.coarse_controls``: averaged over each step
or at its times; ``--draft-controls`` chooses)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from ..coarse import COARSE_MODES, check_coarse
from ..data import CharVocab
from ..models.speculative import DraftSolve, speculative_generate
from ..solvers import EXPLICIT_SOLVERS
from .budget import guard
from .config import MAX_SEED, ConfigError, Field
from .tasks.text import (
    VOCAB,
    build_model,
    check_n_t,
    check_temperature,
    generate_estimate,
    load_model,
    run_config,
)

NAME = "generate"
SUMMARY = "sample text from a run of opsplit train with task = \"text\", at a chosen N_t"
EXAMPLE = """\
examples:
  opsplit generate runs/text --prompt "The " --n-t 8
  opsplit generate runs/text --prompt "def " --n-t 2 --max-new-tokens 100 --seed 3
  opsplit generate runs/text --greedy         # the most likely character at every step
  opsplit generate runs/text --greedy --draft-n-t 2 --num-draft-tokens auto   # speculative
"""
SCHEMA = None


def add_arguments(p):
    p.add_argument("folder", help="the output folder of opsplit train with task = \"text\"")
    p.add_argument("--prompt", help="the text to continue (default: the run's generate.prompt)")
    p.add_argument("--n-t", type=int, dest="n_t", metavar="N",
                   help="time steps N_t of the solve (default: the run's model.layers, dt = 1)")
    p.add_argument("--max-new-tokens", type=int, metavar="K",
                   help="characters to add (default: the run's generate.max_new_tokens, at most the context)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the run's)")
    p.add_argument("--seed", type=int, help="seed of the sampling (default: the run's generate.seed)")
    p.add_argument("--greedy", action="store_true", help="take the most likely character (no sampling)")
    p.add_argument("--draft-n-t", type=int, dest="draft_n_t", metavar="N",
                   help="decode speculatively: draft with the model solved at N_t = N (fewer steps than --n-t)")
    p.add_argument("--draft-solver", choices=EXPLICIT_SOLVERS, dest="draft_solver",
                   help="the draft's substep solver (default: the model's own)")
    p.add_argument("--draft-controls", choices=COARSE_MODES, dest="draft_controls",
                   help="how a draft of fewer steps than the model's control pieces reads them: average (over each "
                        "step) or point (at its times); default: as the run was trained (train.coarse_controls)")
    p.add_argument("--draft-confidence", type=float, dest="draft_confidence", metavar="P",
                   help="stop a round's drafting after a draft character of probability below P, in (0, 1) "
                        "(default: draft K every round)")
    p.add_argument("--num-draft-tokens", dest="num_draft_tokens", metavar="K",
                   help="draft characters per round: an integer >= 1, or auto (default) to follow the acceptance rate")
    p.add_argument("--force", action="store_true", help="run even when the estimated memory or time exceeds the "
                   "machine's memory or an hour (opsplit.cli.budget)")


def _check_flags(a) -> None:
    check_n_t(a.n_t)
    if a.temperature is not None:
        check_temperature(a.temperature)
    if a.greedy and a.temperature is not None:
        raise ConfigError(f"--temperature: --greedy takes the most likely character, no temperature applies; got "
                          f"--temperature {a.temperature:g} with --greedy")
    if a.max_new_tokens is not None and a.max_new_tokens < 0:
        raise ConfigError(f"--max-new-tokens: expected an integer >= 0, got {a.max_new_tokens}")
    if a.seed is not None and not 0 <= a.seed <= MAX_SEED:
        raise ConfigError(f"--seed: expected a seed from 0 to {MAX_SEED}, got {a.seed}")
    if a.prompt is not None and a.prompt == "":
        raise ConfigError("--prompt: expected at least one character, got an empty prompt")
    draft = getattr(a, "draft_n_t", None) is not None or getattr(a, "draft_solver", None) is not None
    if getattr(a, "draft_controls", None) is not None and not draft:
        raise ConfigError("--draft-controls: drafts are made only with --draft-n-t or --draft-solver")
    if getattr(a, "draft_n_t", None) is not None and a.draft_n_t < 1:
        raise ConfigError(f"--draft-n-t: expected an integer >= 1 (the draft's N_t), got {a.draft_n_t}")
    c = getattr(a, "draft_confidence", None)
    if c is not None:
        if not draft:
            raise ConfigError("--draft-confidence: drafts are made only with --draft-n-t or --draft-solver")
        if not 0 < c < 1:
            raise ConfigError(f"--draft-confidence: expected a probability in (0, 1), got {c:g}")
    k = getattr(a, "num_draft_tokens", None)
    if k is not None:
        if not draft:
            raise ConfigError("--num-draft-tokens: drafts are made only with --draft-n-t or --draft-solver")
        if k != "auto" and not (k.isdigit() and int(k) >= 1):
            raise ConfigError(f"--num-draft-tokens: expected an integer >= 1 or auto, got {k!r}")


def run_generate(a) -> str:
    _check_flags(a)
    cfg, vocab, ckpt = _checked_run(a)
    m, g = cfg["model"], cfg["generate"]
    prompt = a.prompt if a.prompt is not None else g["prompt"]
    try:
        ids = vocab.encode(prompt, name="--prompt")[None]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    room = m["context"] - ids.shape[1]
    k = min(g["max_new_tokens"], max(room, 0)) if a.max_new_tokens is None else a.max_new_tokens
    if ids.shape[1] + k > m["context"]:
        raise ConfigError(f"--max-new-tokens: the prompt ({ids.shape[1]} characters) and {k} new characters "
                          f"exceed the model's {m['context']} learned positions (model.context); expected at most "
                          f"{max(room, 0)}" + ("" if a.max_new_tokens is not None else " (a shorter --prompt)"))
    n_t = a.n_t if a.n_t is not None else m["layers"]
    flags = {"-": {"n-t": Field("int", m["layers"]), "max-new-tokens": Field("int", 0)}}
    guard("opsplit generate", flags, {"-": {"n-t": n_t, "max-new-tokens": k}},
          lambda c: generate_estimate(m, vocab.size, ids.shape[1], c["-"]["max-new-tokens"], c["-"]["n-t"]),
          a.force)
    seed = a.seed if a.seed is not None else g["seed"]
    temperature = a.temperature if a.temperature is not None else g["temperature"]
    draft = None
    if a.draft_n_t is not None or a.draft_solver is not None:
        controls = a.draft_controls or cfg["train"].get("coarse_controls") or "point"
        draft = DraftSolve(n_steps=a.draft_n_t, solver=a.draft_solver, controls=controls)
        shell = build_model(m, vocab.size)  # the solve's cost, before the weights are read
        if controls == "average" and draft.n_steps is not None:
            try:
                check_coarse(shell, draft.n_steps, "--draft-n-t")
            except ValueError as e:
                why = ("--draft-controls average" if a.draft_controls else "the drafts read the controls averaged "
                       "over each step, as the run was trained (train.coarse_controls = 'average'); "
                       "--draft-controls point reads them at their times")
                raise ConfigError(f"{e} ({why})") from None
        cost, dcost = shell.solve_cost(n_t), shell.solve_cost(draft.n_steps, draft.solver)
        if dcost >= cost:
            raise ConfigError(f"--draft-n-t: the draft ({draft.describe()}) costs {dcost} term evaluations per "
                              f"character, the solve at --n-t {n_t} {cost}: a draft must be cheaper")
    model = load_model(cfg, vocab, ckpt).eval()
    try:
        with torch.no_grad():
            first = model(ids, n_steps=n_t).logits[0, -1]
    except ValueError as e:  # the model's own checks (an overflowing attention score, ...)
        raise ConfigError(f"folder: the model of {str(ckpt)!r} cannot be solved at the prompt at N_t = {n_t}: "
                          f"{e}") from None
    if not bool(torch.isfinite(first).all()):
        raise ConfigError(f"folder: the model of {str(ckpt)!r} gives non-finite logits at the prompt at N_t = {n_t} "
                          f"(its weights are finite: the solve overflows); expected another --n-t or checkpoint")
    t0 = time.perf_counter()
    spec = ""
    if draft is not None:
        nk = a.num_draft_tokens or "auto"
        res = speculative_generate(model, ids, k, draft=draft, num_draft_tokens=nk if nk == "auto" else int(nk),
                                   do_sample=not a.greedy, temperature=temperature,
                                   generator=torch.Generator().manual_seed(seed), n_steps=n_t,
                                   draft_confidence=a.draft_confidence)
        out = res.sequences
        spec = (f", speculative: drafts at {draft.describe()}, {sum(res.accepted)} of {sum(res.drafted)} accepted "
                f"({100 * res.acceptance_rate:.0f} %) in {res.rounds} rounds")
    else:
        out = model.generate(ids, k, do_sample=not a.greedy, temperature=temperature,
                             generator=torch.Generator().manual_seed(seed), use_cache=True, n_steps=n_t)
    dt = time.perf_counter() - t0
    how = ("greedy" if a.greedy else f"sampled, temperature {temperature:g}, seed {seed}") + spec
    print(f"opsplit generate: {k} characters at N_t = {n_t} (dt = {m['layers'] / n_t:g}; trained at N_t in "
          f"{cfg['train']['n_steps']}), {how}, {m['attention']} attention with a key/value cache, {dt:.2f} s",
          file=sys.stderr)
    return vocab.decode(out[0])


def _checked_run(a):
    """The run's config, vocabulary and latest checkpoint, after the prompt is checked
    against the vocabulary (which comes from the folder before the config is read)."""
    folder = Path(a.folder)
    voc = folder / VOCAB
    if a.prompt is not None and voc.is_file():  # the prompt before the model is built and loaded
        try:
            vocab = CharVocab.from_dict(json.loads(voc.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            vocab = None
        if vocab is not None:
            try:
                vocab.check(a.prompt, "--prompt")
            except ValueError as e:
                raise ConfigError(str(e)) from None
    return run_config(folder)
