"""Validation text deduplicated against the training text (``opsplit.data.dedup``) and the
n-gram baselines of the text benchmark (``benchmarks/ngram.py``)."""

import sys
from pathlib import Path

import pytest

from opsplit.data.dedup import deduplicate, shared_substrings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from ngram import NGram  # noqa: E402

TRAIN = ("The quick brown fox jumps over the lazy dog and runs into the forest.\n\n"
         "Every paragraph here is part of the training text, quoted below.")


def _naive_shared(text, ref, k):
    return [i for i in range(len(text) - k + 1) if text[i:i + k] in ref]  # substring search, no set


def test_paragraphs_with_a_shared_substring_are_removed():
    val = ("A new paragraph that the training text never saw.\n\n"
           "It says: the quick brown fox jumps over the lazy dog and more.\n\n"
           "Another unseen paragraph, long enough to matter here.")
    out, info = deduplicate(val, TRAIN, k=20)
    assert out == ("A new paragraph that the training text never saw.\n\n"
                   "Another unseen paragraph, long enough to matter here.")
    assert info["units_before"] == 3 and info["units_kept"] == 2 and info["chars_after"] == len(out)
    assert _naive_shared(out, TRAIN, 20) == [] and shared_substrings(out, TRAIN, 20) == 0
    assert shared_substrings(val, TRAIN, 20) == len(_naive_shared(val, TRAIN, 20)) > 0


def test_a_seam_that_creates_a_shared_substring_is_cut_again():
    ref = "xxxx end of one.\n\nStart of twoyyyy"
    val = "Alpha says end of one.\n\nStart of two goes on"  # each paragraph alone shares nothing of length 16
    assert _naive_shared("Alpha says end of one.", ref, 16) == []
    assert _naive_shared("Start of two goes on", ref, 16) == []
    with pytest.raises(ValueError, match="nothing is left"):
        deduplicate(val, ref, k=16)
    out, info = deduplicate(val + "\n\nA third, unrelated paragraph.", ref, k=16)
    assert out == "A third, unrelated paragraph." and info["rounds"] == 2


def test_character_units_keep_the_uncovered_text():
    val = "unseen words here, the quick brown fox jumps over the lazy dog, more unseen words"
    out, _ = deduplicate(val, TRAIN, k=20, unit="char")
    assert _naive_shared(out, TRAIN, 20) == []
    assert out.startswith("unseen words here,") and out.endswith("more unseen words")


def test_ngram_probabilities_sum_to_one_and_witten_bell_by_hand():
    text = "abracadabra"
    V = 6  # a b r c d and one more id
    for method in ("witten_bell", "kneser_ney"):
        m = NGram(3, method).fit(text, V)
        for h in ("", "a", "ab", "zz", "ra"):
            assert sum(m.prob(h, c) for c in "abrcdx") == pytest.approx(1.0, abs=1e-12)
    # Witten-Bell bigram p(b | a): C(ab) = 2, C(a.) = 4, N1+(a.) = 3; unigram a5 b2 r2 c1 d1 (11, 5 types)
    p0 = (2 + 5 / V) / (11 + 5)
    want = (2 + 3 * p0) / (4 + 3)
    assert NGram(2, "witten_bell").fit(text, V).prob("a", "b") == pytest.approx(want, rel=1e-12)
    # interpolated Kneser-Ney bigram: continuation counts below the top order (N1+(.b) = 1: only "ab")
    # unigram level: N1+(.c) over c: a: {r, c, d} -> 3, b: {a} -> 1, r: {b} -> 1, c: {a} -> 1, d: {a} -> 1 (7, 5 types)
    D = 0.75
    p1 = (1 - D) / 7 + D * 5 / 7 / V
    want = (2 - D) / 4 + D * 3 / 4 * p1
    assert NGram(2, "kneser_ney").fit(text, V).prob("a", "b") == pytest.approx(want, rel=1e-12)
