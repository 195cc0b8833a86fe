"""opsplit.analysis.NGram against counts made by hand on a tiny text: interpolated
Kneser–Ney (continuation counts below the top order) and Witten–Bell, the bits per
character as the mean of the hand-made probabilities, and the refusals."""

import math

import pytest

from opsplit.analysis import NGram

TEXT = "abracadabra"  # a5 b2 r2 c1 d1
V = 6  # the five characters and one never seen
D = 0.75


def _kn_unigram(c):
    # N1+(. c): distinct characters before c -- a: {r, c, d}, b: {a}, r: {b}, c: {a}, d: {a}: 7 in all, 5 types
    n1 = {"a": 3, "b": 1, "r": 1, "c": 1, "d": 1}.get(c, 0)
    return max(n1 - D, 0) / 7 + D * 5 / 7 / V


def test_kneser_ney_trigram_by_hand():
    m = NGram(3, "kneser_ney", discount=D).fit(TEXT, V)
    # p(a | "br"): top order raw counts C(br a) = 2 of C(br .) = 2, one type;
    # middle order continuation counts N1+(. r a) = 1 ("bra" only) of 1, one type
    p1 = _kn_unigram("a")
    p2 = (1 - D) / 1 + D * 1 / 1 * p1
    want = (2 - D) / 2 + D * 1 / 2 * p2
    assert m.prob("abr", "a") == pytest.approx(want, rel=1e-14)
    # p(c | "ra"): "ra" is followed by c once (the last "ra" ends the text): 1 of 1, one type;
    # middle order "a": N1+(. a c) = 1 ("rac"), N1+(. a d) = 1 ("cad"), N1+(. a b) = 1 ("dab"): 3 of 3 types
    p2 = (1 - D) / 3 + D * 3 / 3 * _kn_unigram("c")
    want = (1 - D) / 1 + D * 1 / 1 * p2
    assert m.prob("ra", "c") == pytest.approx(want, rel=1e-14)
    # an unseen character in an unseen context: the discounted mass of every order, down to 1/V
    assert m.prob("zz", "x") == pytest.approx(_kn_unigram("x"), rel=1e-14)


def test_witten_bell_bigram_by_hand_and_normalised():
    m = NGram(2, "witten_bell").fit(TEXT, V)
    p0 = (2 + 5 / V) / (11 + 5)  # unigram b: 2 of 11, 5 types
    assert m.prob("a", "b") == pytest.approx((2 + 3 * p0) / (4 + 3), rel=1e-14)  # after a: b2 c1 d1
    for method in ("witten_bell", "kneser_ney"):
        m = NGram(3, method).fit(TEXT, V)
        for h in ("", "a", "ab", "zz", "ra"):
            assert sum(m.prob(h, c) for c in "abrcdx") == pytest.approx(1.0, abs=1e-12)


def test_bits_per_char_is_the_mean_code_length():
    m = NGram(3, "kneser_ney").fit(TEXT, V)
    text = "abrac"
    ps = [m.prob("", "a"), m.prob("a", "b"), m.prob("ab", "r"), m.prob("br", "a"), m.prob("ra", "c")]
    assert m.bits_per_char(text) == pytest.approx(-sum(math.log2(p) for p in ps) / 5, rel=1e-14)
    assert ps[1] == m.prob("zzza", "b")  # only the last order - 1 characters of the history count


@pytest.mark.parametrize("call, exc, match", [
    (lambda: NGram(0), ValueError, r"NGram\.order: expected an integer >= 1, got 0"),
    (lambda: NGram(2.0), TypeError, r"NGram\.order"),
    (lambda: NGram(2, "laplace"), ValueError, r"NGram\.method: expected one of"),
    (lambda: NGram(2, discount=1.5), ValueError, r"NGram\.discount: expected a number in \(0, 1\]"),
    (lambda: NGram(2).fit("", 3), ValueError, r"NGram\.fit\.text: expected a non-empty text"),
    (lambda: NGram(2).fit(b"ab", 3), TypeError, r"NGram\.fit\.text: expected a str"),
    (lambda: NGram(2).fit("abc", 2), ValueError, r"NGram\.fit\.vocab_size: the text has 3 distinct characters"),
    (lambda: NGram(2).prob("a", "b"), ValueError, r"NGram\.prob: the model is not fitted"),
    (lambda: NGram(2).fit("ab", 2).bits_per_char(""), ValueError, r"NGram\.bits_per_char\.text"),
])
def test_refusals(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
