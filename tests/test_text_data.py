"""opsplit.data.text: the character corpora that ship with Python, the split by document,
the vocabulary, and the window sampler."""

import sys

import pytest
import torch

from opsplit.data import (
    CharVocab,
    bits_per_char,
    char_corpus,
    load_text,
    sample_windows,
    text_windows,
)
from opsplit.data.text import UNKNOWN


@pytest.fixture(scope="module")
def topics():
    return load_text("pydoc_topics", seed=0)


def test_pydoc_topics_split_by_document(topics):
    from pydoc_data.topics import topics as raw  # the independent source

    assert set(topics.train_documents).isdisjoint(topics.val_documents)
    assert sorted(topics.train_documents + topics.val_documents) == sorted(raw)
    # each split is its documents, joined by newlines, character for character
    for ids, names in ((topics.train, topics.train_documents), (topics.val, topics.val_documents)):
        text = "\n".join(raw[k] for k in names)
        assert topics.vocab.decode(ids) == "".join(c if c in topics.vocab else UNKNOWN for c in text)
    n_val, n = topics.val.numel(), topics.train.numel() + topics.val.numel()
    assert 0.05 < n_val / n <= 0.1 + 1e-9
    # the vocabulary is the training split's characters (plus the unknown id 0)
    seen = set("\n".join(raw[k] for k in topics.train_documents))
    assert set(topics.vocab.chars) == seen and topics.vocab.size == len(seen) + 1
    assert int((topics.train == 0).sum()) == 0
    assert topics.val_unknown == sum(c not in seen for c in "\n".join(raw[k] for k in topics.val_documents))


def test_split_is_seeded(topics):
    again = load_text("pydoc_topics", seed=0)
    assert again.val_documents == topics.val_documents and torch.equal(again.train, topics.train)
    assert load_text("pydoc_topics", seed=1).val_documents != topics.val_documents


def test_vocab_roundtrip_and_unknown():
    v = CharVocab("hello world")
    assert v.size == len(set("hello world")) + 1 and v.chars == tuple(sorted(set("hello world")))
    ids = v.encode("low door")
    assert ids.dtype == torch.int64 and int(ids.min()) >= 1 and v.decode(ids) == "low door"
    assert v.encode("hex!", errors="replace").tolist()[2:] == [0, 0]
    assert v.decode([0]) == UNKNOWN
    assert CharVocab.from_dict(v.to_dict()) == v
    with pytest.raises(ValueError, match=r"prompt: character\(s\) '!', 'x' are not in the vocabulary"):
        v.encode("hex!", name="prompt")


def test_unknown_characters_of_validation_counted():
    c = char_corpus({"a": "abcabc", "b": "xyz"}, val_fraction=0.4, seed=0)
    assert c.val_documents == ["b"] and c.val_unknown == 3 and c.val.tolist() == [0, 0, 0]


def test_windows_and_sampler():
    ids = torch.arange(100)
    x, y = sample_windows(ids, 10, 5, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 10)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)  # next characters
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(5, 9, dtype=torch.int64))  # contiguous windows
    assert int(x.min()) >= 0 and int(y.max()) <= 99
    x2, _ = sample_windows(ids, 10, 5, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    d = text_windows(ids, 10, 7, seed=3)
    assert len(d) == 7 and torch.equal(d.inputs, sample_windows(ids, 10, 7, torch.Generator().manual_seed(3))[0])
    every = text_windows(ids, 10)  # non-overlapping, in order: 99 // 10 windows
    assert len(every) == 9 and torch.equal(every.inputs.flatten(), ids[:90]) and torch.equal(
        every.targets.flatten(), ids[1:91])
    # the largest start is len - context - 1: the last target is the last character
    starts = sample_windows(ids, 98, 200, torch.Generator().manual_seed(0))[0][:, 0]
    assert set(starts.tolist()) == {0, 1}


def test_bits_per_char():
    assert bits_per_char(torch.log(torch.tensor(4.0)).item()) == pytest.approx(2.0)


def test_stdlib_corpus():
    c = load_text("stdlib", max_chars=200_000, seed=0)
    assert c.train.numel() + c.val.numel() >= 200_000 and all(n.endswith(".py") for n in c.train_documents)
    assert not any(n.startswith(("test", "idlelib")) for n in c.train_documents + c.val_documents)


def test_stripped_pydoc_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # what a stripped distribution looks like
    with pytest.raises(RuntimeError, match=r"no pydoc_data\.topics.*corpus='stdlib'"):
        load_text("pydoc_topics")


def _docstrings_by_walk(path, min_chars):
    """The docstrings of a file, found independently (``ast.walk``, not the loader's order)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {d for n in ast.walk(tree) if isinstance(n, kinds) for d in [ast.get_docstring(n)] if d and len(d) > min_chars}


def test_docstrings_corpus_adds_training_text_only(topics):
    import hashlib
    import sysconfig
    from pathlib import Path

    from opsplit.data.dedup import deduplicate, shared_substrings
    from opsplit.data.text import MIN_DOCSTRING

    c = load_text("pydoc_docstrings", max_chars=60_000, seed=0)
    again = load_text("pydoc_docstrings", max_chars=60_000, seed=0)
    assert torch.equal(c.train, again.train) and c.info["train_sha256"] == again.info["train_sha256"]  # deterministic
    train = c.vocab.decode(c.train)
    assert c.info["train_sha256"] == hashlib.sha256(train.encode()).hexdigest()
    # the validation split is the topics' own, character for character; the training text starts with theirs
    assert c.val_documents == topics.val_documents and c.vocab.decode(c.val) == topics.vocab.decode(topics.val)
    topics_train = topics.vocab.decode(topics.train)
    assert train.startswith(topics_train + "\n") and c.train_documents[:len(topics.train_documents)] == \
        topics.train_documents
    added = train[len(topics_train) + 1:]
    assert len(added) > 50_000 and not set(c.info["docstrings_quoting_val"]) & set(c.train_documents)
    assert c.info["docstrings"] == len(c.train_documents) - len(topics.train_documents)
    # the docstrings are those of the standard library's files (found here by ast.walk), over 200 characters
    root = Path(sysconfig.get_paths()["stdlib"])
    names = c.train_documents[len(topics.train_documents):]
    files = sorted({n.split(":")[0] for n in names})
    assert files == sorted(files) and names[0].split(":")[0] == files[0]
    expected = set().union(*(_docstrings_by_walk(root / f, MIN_DOCSTRING) for f in files[:-1]))
    val = c.vocab.decode(c.val)
    kept = {d for d in expected if shared_substrings(d, val, 40) == 0}  # those quoting no validation text
    assert all(d in added for d in kept)
    assert sum(n.split(":")[0] in files[:-1] for n in names) == len(kept)  # and no others, each once
    # no text of the validation documents in the docstrings; deduplicating the validation text against the
    # larger training text leaves what deduplicating against the topics' training text leaves
    assert shared_substrings(added, val, 40) == 0
    assert deduplicate(val, train)[0] == deduplicate(val, topics_train)[0]


def test_docstrings_quoting_validation_left_out(monkeypatch, topics):
    from opsplit.data import text as text_mod

    val = topics.vocab.decode(topics.val)
    quote = "x" * 300 + val[1000:1040]  # one 40-character substring of the validation documents
    fresh = "y" * 300
    monkeypatch.setattr(text_mod, "_stdlib_docstrings",
                        lambda max_chars: ({"a.py:f": quote, "b.py:g": fresh}, {"files": 2, "unparsed_files": 0,
                                                                                "repeats": 0}))
    c = load_text("pydoc_docstrings", seed=0)
    assert c.info["docstrings_quoting_val"] == ["a.py:f"] and c.train_documents[-1] == "b.py:g"
    assert c.vocab.decode(c.train).endswith("\n" + fresh) and quote not in c.vocab.decode(c.train)
