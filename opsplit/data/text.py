r"""Character-level text that ships with Python, for language modelling (nothing is downloaded).

**Corpora** (:data:`CORPORA`):

``"pydoc_topics"``
    ``pydoc_data.topics.topics``: the documentation topics ``help()`` prints (the language
    reference in plain text, ≈ 465 000 characters in 79 topics on Python 3.11), one
    *document* per topic.
``"stdlib"``
    the standard library's own ``.py`` sources (under ``sysconfig.get_paths()["stdlib"]``,
    without the test suites, ``idlelib``, ``lib2to3``, ``turtledemo``, ``ensurepip`` and
    ``site-packages``), one document per file, in sorted path order (≈ 11 million
    characters on Python 3.11; cap with ``max_chars``).
``"pydoc_docstrings"``
    ``"pydoc_topics"`` for training *and* validation, with the standard library's
    docstrings added to the training split only: every module, class and function
    docstring (``ast.get_docstring``, cleaned) longer than ``min_docstring`` = 200
    characters, from the ``.py`` files that ``"stdlib"`` reads, in sorted path order and
    source order within a file (≈ 1.2 million characters on Python 3.11.7).  An exact
    repeat of an earlier docstring is left out, and so is every docstring that shares a
    40-character substring with the validation documents (the docstrings quote none of
    the validation text), so the validation split — and the validation text deduplicated
    against the training text — is the one of ``"pydoc_topics"`` with the same ``seed``
    and ``val_fraction``.  ``max_chars`` caps the docstrings' characters (the topics are
    always whole).  The standard library differs between Python versions:
    ``TextCorpus.info`` holds the Python version, the docstrings' counts and the SHA-256
    of the training text.

Some distributions strip ``pydoc_data`` (or the sources): :func:`load_text` then raises a
``RuntimeError`` that says so and names the other corpus.

**Split.**  By document, seeded: the documents are permuted with ``torch.Generator``
seeded with ``seed`` and, in that order, every document that still fits is moved to the
validation split while it holds at most ``val_fraction`` of the characters (the first
document if none fits; at least one document stays in training), so no document
contributes to both.  A split's text is its documents joined by ``"\n"``.

**Vocabulary.**  The characters of the *training* split, sorted, after one reserved
unknown token (id ``0``, shown as ``"\ufffd"``).  Validation text is encoded with
unknown characters mapped to id 0 (:attr:`TextCorpus.val_unknown` counts them); a
*prompt* (``CharVocab.encode(..., errors="strict")``, the default) is refused with a
``ValueError`` naming the characters the model never saw: the unknown id is never a
training input (no training character maps to it) — its embedding row is trained only as an
output row of the tied read-out, pushed down as a class that never occurs — so conditioning
a generation on it would condition on a vector no input taught.

**Windows.**  A language-model sample is a window of ``context`` ids and the same window
shifted by one (next-character targets): :func:`sample_windows` draws ``batch_size``
window starts uniformly with a seeded generator (the batch sampler), and
:func:`text_windows` returns them — or, with ``n=None``, every non-overlapping window in
order (for evaluation) — as a :class:`~opsplit.data.TensorData` of ``(n, context)``
inputs and targets (int64).
"""

from __future__ import annotations

import ast
import hashlib
import math
import os
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from .._checks import check_choice
from .base import TensorData
from .dedup import _grams

__all__ = ["CORPORA", "UNKNOWN", "CharVocab", "TextCorpus", "load_text", "char_corpus", "sample_windows",
           "text_windows", "bits_per_char", "corpus_chars"]

CORPORA = ("pydoc_topics", "stdlib", "pydoc_docstrings")
#: how the unknown id 0 decodes
UNKNOWN = "\ufffd"
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__",
              "turtledemo", "ensurepip"}


def _int(v, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an integer, got {v!r}")
    if v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v}")
    return v


def _show(chars) -> str:
    chars = sorted(set(chars))
    s = ", ".join(repr(c) for c in chars[:10])
    return s + (f" and {len(chars) - 10} more" if len(chars) > 10 else "")


class CharVocab:
    """Characters ``<-> ids``: id 0 is the unknown token, ids ``1..`` the characters in order.

    Args:
        chars: the known characters (a string or iterable of one-character strings; sorted
            and deduplicated here).
    """

    def __init__(self, chars):
        if isinstance(chars, str):
            chars = list(chars)
        try:
            chars = list(chars)
        except TypeError:
            raise TypeError(f"CharVocab.chars: expected a string or an iterable of characters, got "
                            f"{type(chars).__name__}") from None
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise TypeError(f"CharVocab.chars: expected one-character strings, got {bad[0]!r}")
        self.chars = tuple(sorted(set(chars)))
        if not self.chars:
            raise ValueError("CharVocab.chars: expected at least one character, got none")
        self._index = {c: i + 1 for i, c in enumerate(self.chars)}

    @property
    def size(self) -> int:
        """Number of ids (the characters and the unknown token)."""
        return len(self.chars) + 1

    def __len__(self) -> int:
        return self.size

    def __contains__(self, c) -> bool:
        return c in self._index

    def unknown_chars(self, text: str) -> list[str]:
        """The distinct characters of ``text`` outside the vocabulary, sorted."""
        return sorted(set(text) - self._index.keys())

    def check(self, text, name: str = "text") -> str:
        """``text`` if it is a string of known characters; otherwise a ``TypeError`` /
        ``ValueError`` naming ``name`` and the unknown characters."""
        if not isinstance(text, str):
            raise TypeError(f"{name}: expected a string, got {type(text).__name__}")
        unknown = self.unknown_chars(text)
        if unknown:
            raise ValueError(
                f"{name}: character(s) {_show(unknown)} are not in the vocabulary of {len(self.chars)} characters "
                f"built from the training text; remove or replace them (the unknown token is never a training "
                f"input, so a prompt is not mapped to it)"
            )
        return text

    def encode(self, text: str, *, errors: str = "strict", name: str = "text") -> Tensor:
        """int64 ids of ``text``; ``errors="strict"`` refuses unknown characters
        (:meth:`check`), ``"replace"`` maps them to id 0."""
        if errors not in ("strict", "replace"):
            raise ValueError(f"CharVocab.encode.errors: expected 'strict' or 'replace', got {errors!r}")
        if errors == "strict":
            self.check(text, name)
        elif not isinstance(text, str):
            raise TypeError(f"{name}: expected a string, got {type(text).__name__}")
        get = self._index.get
        return torch.tensor([get(c, 0) for c in text], dtype=torch.int64)

    def decode(self, ids) -> str:
        """The characters of ``ids`` (a 1-D tensor or sequence of ints); id 0 is
        :data:`UNKNOWN`."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1 or ids.is_floating_point():
                raise ValueError(f"CharVocab.decode.ids: expected a 1-D integer tensor, got dtype {ids.dtype} "
                                 f"and shape {tuple(ids.shape)}")
            ids = ids.tolist()
        table = (UNKNOWN,) + self.chars
        n = len(table)
        out = []
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise ValueError(f"CharVocab.decode.ids: expected ids in [0, {n - 1}], got {i!r}")
            out.append(table[i])
        return "".join(out)

    def to_dict(self) -> dict:
        return {"chars": "".join(self.chars), "unknown_id": 0}

    @classmethod
    def from_dict(cls, d: dict) -> CharVocab:
        if not isinstance(d, dict) or not isinstance(d.get("chars"), str):
            raise ValueError(f"CharVocab.from_dict: expected {{'chars': str, ...}}, got {d!r}")
        return cls(d["chars"])

    def __eq__(self, other) -> bool:
        return isinstance(other, CharVocab) and other.chars == self.chars

    def __repr__(self) -> str:
        return f"CharVocab(size={self.size})"


@dataclass
class TextCorpus:
    """A character corpus split by document (module docstring).

    Attributes: ``name``; ``vocab`` (:class:`CharVocab` of the training split);
    ``train``, ``val`` (1-D int64 ids); ``train_documents``, ``val_documents`` (document
    names, in split order); ``val_unknown`` (validation characters mapped to the unknown
    id); ``info`` (seed, fraction, sizes).
    """

    name: str
    vocab: CharVocab
    train: Tensor
    val: Tensor
    train_documents: list = field(default_factory=list)
    val_documents: list = field(default_factory=list)
    val_unknown: int = 0
    info: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"TextCorpus({self.name!r}, vocab={self.vocab.size}, train={self.train.numel()} chars in "
                f"{len(self.train_documents)} documents, val={self.val.numel()} chars in "
                f"{len(self.val_documents)} documents)")


def _pydoc_topics() -> dict:
    try:
        from pydoc_data.topics import topics  # optional: some Python distributions strip pydoc_data
    except ImportError as e:
        raise RuntimeError(
            "load_text('pydoc_topics'): this Python has no pydoc_data.topics (some distributions strip it: "
            "Debian/Ubuntu ship it in the python3.X-doc or libpython3.X-stdlib package, Alpine/embedded "
            f"builds may lack it); install it or use corpus='stdlib' ({e})"
        ) from None
    if not isinstance(topics, dict) or not topics:
        raise RuntimeError("load_text('pydoc_topics'): pydoc_data.topics.topics is empty in this Python")
    return {k: topics[k] for k in sorted(topics)}


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list:
    """``(relative path, path)`` of the standard library's ``.py`` sources that
    ``load_text("stdlib")`` reads, in name order."""
    root = _stdlib_root()
    files = []
    if root.is_dir():
        for top, dirs, names in os.walk(root):
            rel = Path(top).relative_to(root)
            # prune the tests, the IDE, and installed packages (site-packages holds far more than the stdlib)
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not (rel == Path(".") and d.startswith("test")))
            files += [(rel / f, Path(top) / f) for f in names if f.endswith(".py")]
        files.sort()
    return files


def corpus_chars(corpus: str = "pydoc_topics", max_chars: int | None = None) -> int:
    """How many characters :func:`load_text` reads for ``corpus`` and ``max_chars``, without
    reading them: ``pydoc_data.topics``' lengths (exact), or the standard library's file
    sizes in bytes (an upper bound: UTF-8 takes at least a byte per character).  0 when the
    corpus is missing (``load_text`` says why).  For the size guards of a job that will
    load the corpus."""
    check_choice(corpus, CORPORA, "corpus_chars.corpus")
    if corpus in ("pydoc_topics", "pydoc_docstrings"):
        try:
            sizes = [len(d) for d in _pydoc_topics().values()]
        except RuntimeError:
            return 0
        if corpus == "pydoc_docstrings":  # the docstrings: at most the sources' sizes, capped by max_chars
            src = sum(p.stat().st_size for _, p in _stdlib_files() if p.is_file())
            return sum(sizes) + (src if max_chars is None else min(src, max_chars))
    else:
        sizes = []
        for _, p in _stdlib_files():
            try:
                sizes.append(p.stat().st_size)
            except OSError:
                continue
    n = 0
    for k in sizes:  # the first documents up to max_chars, as load_text keeps them
        if max_chars is not None and n >= max_chars:
            break
        n += k
    return n


def _stdlib_sources(max_chars: int | None) -> dict:
    docs, n = {}, 0
    for rel, p in _stdlib_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text:
            continue
        docs[str(rel)] = text
        n += len(text)
        if max_chars is not None and n >= max_chars:
            break
    if not docs:
        raise RuntimeError(f"load_text('stdlib'): no Python sources under {str(_stdlib_root())!r} (this distribution ships "
                           "only compiled modules); use corpus='pydoc_topics'")
    return docs


#: the shortest docstring ``load_text("pydoc_docstrings")`` keeps (characters, after cleaning)
MIN_DOCSTRING = 200
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstrings_of(tree, where: str):
    """``(name, docstring)`` of the module, class and function nodes of ``tree``, in source
    order (depth first), named ``where:Class.method``."""
    stack = [(tree, "")]
    while stack:
        node, q = stack.pop()
        if isinstance(node, _DOC_NODES):
            d = ast.get_docstring(node, clean=True)
            if d:
                yield f"{where}:{q}" if q else where, d
        kids = []
        for c in ast.iter_child_nodes(node):
            if isinstance(c, _DOC_NODES[1:]):
                kids.append((c, f"{q}.{c.name}" if q else c.name))
            elif isinstance(c, ast.stmt) or isinstance(c, (ast.excepthandler, ast.match_case)):
                kids.append((c, q))
        stack.extend(reversed(kids))


def _stdlib_docstrings(max_chars: int | None, min_chars: int = MIN_DOCSTRING) -> tuple[dict, dict]:
    """The standard library's docstrings longer than ``min_chars`` (module docstring),
    exact repeats left out; ``(docs, counts)``."""
    docs, seen, n = {}, set(), 0
    counts = {"files": 0, "unparsed_files": 0, "repeats": 0}
    for rel, p in _stdlib_files():
        if max_chars is not None and n >= max_chars:
            break
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            counts["unparsed_files"] += 1
            continue
        counts["files"] += 1
        for name, d in _docstrings_of(tree, str(rel)):
            if len(d) <= min_chars:
                continue
            if d in seen:
                counts["repeats"] += 1
                continue
            seen.add(d)
            docs[name] = d
            n += len(d)
            if max_chars is not None and n >= max_chars:
                break
    if not docs:
        raise RuntimeError(f"load_text('pydoc_docstrings'): no Python sources with docstrings under "
                           f"{str(_stdlib_root())!r} (this distribution ships only compiled modules); use "
                           "corpus='pydoc_topics'")
    return docs, counts


def _with_docstrings(topics: TextCorpus, max_chars: int | None, k: int = 40) -> TextCorpus:
    """``topics`` (split by document) with the standard library's docstrings added to its
    training split (module docstring, ``"pydoc_docstrings"``)."""
    docs, counts = _stdlib_docstrings(max_chars)
    val_docs = _pydoc_topics()
    val_text = "\n".join(val_docs[name] for name in topics.val_documents)  # as char_corpus joins them
    grams = _grams(val_text, k)
    quoting = [name for name, d in docs.items() if any(d[i:i + k] in grams for i in range(len(d) - k + 1))]
    for name in quoting:
        del docs[name]
    train_text = "\n".join([topics.vocab.decode(topics.train), *docs.values()])
    vocab = CharVocab(train_text)
    val_ids = vocab.encode(val_text, errors="replace")
    info = dict(topics.info)
    info.update({"train_chars": len(train_text), "val_chars": len(val_text), "python": platform.python_version(),
                 "topics_train_chars": topics.info["train_chars"], "docstrings": len(docs),
                 "docstring_chars": sum(len(d) for d in docs.values()), "min_docstring": MIN_DOCSTRING,
                 "docstrings_quoting_val": quoting, "docstring_files": counts["files"],
                 "unparsed_files": counts["unparsed_files"], "docstring_repeats": counts["repeats"],
                 "train_sha256": hashlib.sha256(train_text.encode("utf-8")).hexdigest()})
    return TextCorpus("pydoc_docstrings", vocab, vocab.encode(train_text), val_ids,
                      [*topics.train_documents, *docs], list(topics.val_documents), int((val_ids == 0).sum()), info)


def char_corpus(documents, *, val_fraction: float = 0.1, seed: int = 0, name: str = "text") -> TextCorpus:
    """Split ``documents`` (a dict ``{name: text}`` or a list of strings) by document and
    build the vocabulary from the training split (module docstring)."""
    if isinstance(documents, str):
        raise TypeError("char_corpus.documents: expected a dict {name: text} or a list of documents, got one "
                        "string (split it into documents)")
    if isinstance(documents, dict):
        items = list(documents.items())
    elif isinstance(documents, (list, tuple)):
        items = [(str(i), d) for i, d in enumerate(documents)]
    else:
        raise TypeError(f"char_corpus.documents: expected a dict {{name: text}} or a list of strings, got "
                        f"{type(documents).__name__}")
    bad = [k for k, d in items if not isinstance(d, str)]
    if bad:
        raise TypeError(f"char_corpus.documents: expected strings, document {bad[0]!r} is not one")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or \
            not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"char_corpus.val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    seed = _int(seed, "char_corpus.seed", 0)
    items = [(k, d) for k, d in items if d]
    total = sum(len(d) for _, d in items)
    if total == 0:
        raise ValueError(f"char_corpus.documents: empty corpus {name!r} (no characters)")
    if total < 2:
        raise ValueError(f"char_corpus.documents: corpus {name!r} has {total} character; a language model needs "
                         f"at least 2 (an input and its next character)")
    if len(items) < 2:
        raise ValueError(f"char_corpus.documents: corpus {name!r} has {len(items)} non-empty document; a split "
                         "by document needs at least 2")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(items), generator=g).tolist()
    want = float(val_fraction) * total
    val_idx, n_val = [], 0
    for i in order:  # every document that still fits under the target, in seeded order
        if n_val + len(items[i][1]) <= want:
            val_idx.append(i)
            n_val += len(items[i][1])
    if not val_idx:  # every document is longer than the target: the first one
        val_idx = [order[0]]
    val_set = set(val_idx)
    train_idx = [i for i in range(len(items)) if i not in val_set]
    val_idx.sort()
    train_text = "\n".join(items[i][1] for i in train_idx)
    val_text = "\n".join(items[i][1] for i in val_idx)
    vocab = CharVocab(train_text)
    val_ids = vocab.encode(val_text, errors="replace")
    info = {"seed": seed, "val_fraction": float(val_fraction), "documents": len(items),
            "train_chars": len(train_text), "val_chars": len(val_text)}
    return TextCorpus(name, vocab, vocab.encode(train_text), val_ids, [items[i][0] for i in train_idx],
                      [items[i][0] for i in val_idx], int((val_ids == 0).sum()), info)


def load_text(corpus: str = "pydoc_topics", *, val_fraction: float = 0.1, seed: int = 0,
              max_chars: int | None = None) -> TextCorpus:
    """A corpus of :data:`CORPORA`, split by document with ``seed`` (module docstring).

    ``max_chars`` keeps the first documents (in name order) up to about that many
    characters before the split (``None``: all); for ``"pydoc_docstrings"`` it caps the
    docstrings added to the training split.
    """
    check_choice(corpus, CORPORA, "load_text.corpus")
    if max_chars is not None:
        max_chars = _int(max_chars, "load_text.max_chars", 2)
    if corpus == "pydoc_docstrings":
        topics = char_corpus(_pydoc_topics(), val_fraction=val_fraction, seed=seed, name="pydoc_topics")
        return _with_docstrings(topics, max_chars)
    docs = _pydoc_topics() if corpus == "pydoc_topics" else _stdlib_sources(max_chars)
    if max_chars is not None and corpus == "pydoc_topics":
        kept, n = {}, 0
        for k, d in docs.items():
            if n >= max_chars:
                break
            kept[k] = d
            n += len(d)
        docs = kept
    return char_corpus(docs, val_fraction=val_fraction, seed=seed, name=corpus)


def _check_ids(ids, context, name: str) -> tuple[Tensor, int]:
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name}: expected a 1-D int64 tensor of character ids, got {type(ids).__name__}")
    if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{name}: expected a 1-D integer tensor of character ids, got dtype {ids.dtype} and "
                         f"shape {tuple(ids.shape)}")
    context = _int(context, "context", 1)
    if ids.numel() < context + 1:
        raise ValueError(f"context: a window of {context} characters and its next-character targets need "
                         f"{context + 1} characters, but {name} has {ids.numel()}; use a shorter context")
    return ids, context


def sample_windows(ids: Tensor, context: int, batch_size: int, generator: torch.Generator | None = None,
                   *, name: str = "ids") -> tuple[Tensor, Tensor]:
    """The batch sampler: ``(inputs, targets)``, each ``(batch_size, context)`` int64, at
    window starts drawn uniformly from ``[0, len(ids) - context - 1]`` with ``generator``;
    ``targets[:, i] = inputs[:, i + 1]`` continued by one character."""
    ids, context = _check_ids(ids, context, name)
    batch_size = _int(batch_size, "batch_size", 1)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    start = torch.randint(ids.numel() - context, (batch_size,), generator=generator)
    idx = start[:, None] + torch.arange(context + 1)
    w = ids[idx]
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def text_windows(ids: Tensor, context: int, n: int | None = None, *, seed: int = 0, name: str = "text") -> TensorData:
    """A :class:`~opsplit.data.TensorData` of windows of ``ids``: ``n`` drawn by
    :func:`sample_windows` with a generator seeded by ``seed``, or (``n=None``) every
    non-overlapping window from the start, ``(len(ids) - 1) // context`` of them."""
    ids, context = _check_ids(ids, context, name)
    if n is None:
        k = (ids.numel() - 1) // context
        w = ids[: k * context + 1]
        x = w[:-1].view(k, context)
        y = w[1:].reshape(k, context)
        info = {"context": context, "windows": "non-overlapping", "n": k}
    else:
        n = _int(n, "n", 1)
        g = torch.Generator().manual_seed(_int(seed, "seed", 0))
        x, y = sample_windows(ids, context, n, g, name=name)
        info = {"context": context, "windows": "random", "n": n, "seed": seed}
    return TensorData(x.contiguous(), y, name=name, info=info)


def bits_per_char(loss_nats: float) -> float:
    """Mean cross-entropy in nats per character as bits per character (``/ ln 2``)."""
    return float(loss_nats) / math.log(2.0)
