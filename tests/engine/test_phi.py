"""Φ̂: tokenization, known pairs, properties and the interpretation thresholds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from debatebus.engine import compute_phi_hat, interpret_phi_hat, tokenize

# ---- tokenize -------------------------------------------------------------------------------


def test_tokenize_keeps_words_of_three_or_more_letters_casefolded():
    assert tokenize("The CAT sat on a Mat, ok?") == {"the", "cat", "sat", "mat"}


def test_tokenize_ignores_digits_punctuation_and_underscores():
    assert tokenize("2024 covid-19 snake_case x1y2z3 e-mail") == {"covid", "snake", "case", "mail"}
    assert tokenize("123 4567 ... !!! ___") == set()


def test_tokenize_letters_inside_alphanumerics_count_as_words():
    assert tokenize("abc123def") == {"abc", "def"}


def test_tokenize_ignores_non_decimal_numerics():
    assert tokenize("½½½ AA² x³y abcⅫdef") == {"abc", "def"}


def test_tokenize_handles_any_script_and_casefolds_fully():
    assert tokenize("Straße STRASSE") == {"strasse"}
    assert tokenize("Ünïcödé ΣΟΦΊΑ Москва 日本語 東京") == {"ünïcödé", "σοφία", "москва", "日本語"}


def test_tokenize_empty_and_short_texts():
    assert tokenize("") == set()
    assert tokenize("a an I ok") == set()


# ---- compute_phi_hat on known pairs ---------------------------------------------------------


def test_identical_texts_give_zero():
    texts = {"a": "Buses are cheaper than trams", "b": "Trams last longer"}
    assert compute_phi_hat(texts, dict(texts)) == 0.0


def test_same_words_in_another_order_and_case_give_zero():
    assert compute_phi_hat({"a": "green buses now"}, {"a": "NOW, buses... GREEN!"}) == 0.0


def test_disjoint_texts_give_one():
    assert compute_phi_hat({"a": "buses are cheap"}, {"a": "trams last longer"}) == 1.0
    assert (
        compute_phi_hat(
            {"a": "red green", "b": "one two three"}, {"a": "blue yellow", "b": "four five six"}
        )
        == 1.0
    )


def test_known_partial_overlap():
    # {alpha, beta, gamma} vs {beta, gamma, delta}: 2 shared of 4 → distance 0.5.
    assert compute_phi_hat({"a": "alpha beta gamma"}, {"a": "beta gamma delta"}) == 0.5


def test_mean_over_participants():
    before = {"a": "alpha beta", "b": "same words"}
    after = {"a": "gamma delta", "b": "same words"}
    assert compute_phi_hat(before, after) == 0.5


def test_participants_absent_from_either_side_are_ignored():
    before = {"a": "alpha beta", "only_before": "xxx yyy"}
    after = {"a": "alpha beta", "only_after": "zzz www"}
    assert compute_phi_hat(before, after) == 0.0
    assert compute_phi_hat({"a": "alpha"}, {"b": "beta"}) == 0.0
    assert compute_phi_hat({}, {}) == 0.0


def test_texts_without_words_count_as_unchanged():
    assert compute_phi_hat({"a": "12 34"}, {"a": "!!"}) == 0.0
    assert compute_phi_hat({"a": ""}, {"a": "something"}) == 1.0


# ---- properties -----------------------------------------------------------------------------

words = st.text(alphabet="abcdeéßΣσ xyz,.", max_size=40)
names = st.sampled_from(["a", "b", "c", "d"])
sides = st.dictionaries(names, words, max_size=4)


@given(sides, sides)
def test_phi_hat_is_within_zero_and_one(before, after):
    assert 0.0 <= compute_phi_hat(before, after) <= 1.0


@given(sides, sides)
def test_phi_hat_is_symmetric(before, after):
    assert compute_phi_hat(before, after) == pytest.approx(compute_phi_hat(after, before))


@given(sides)
def test_phi_hat_of_a_side_with_itself_is_zero(texts):
    assert compute_phi_hat(texts, texts) == 0.0


@given(sides, sides)
def test_phi_hat_only_depends_on_shared_participants(before, after):
    shared = before.keys() & after.keys()
    restricted = compute_phi_hat(
        {k: v for k, v in before.items() if k in shared},
        {k: v for k, v in after.items() if k in shared},
    )
    assert compute_phi_hat(before, after) == pytest.approx(restricted)


@given(st.text(max_size=60))
def test_tokens_are_exactly_the_runs_of_three_or_more_letters_after_casefolding(text):
    runs = "".join(ch if ch.isalpha() else " " for ch in text.casefold()).split()
    assert tokenize(text) == {run for run in runs if len(run) >= 3}


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_tokenize_matches_the_letter_rule_on_ascii(text):
    runs = "".join(ch if ch.isalpha() else " " for ch in text.casefold()).split()
    assert tokenize(text) == {run for run in runs if len(run) >= 3}


@given(st.text(alphabet=st.characters(categories=["L", "N", "P", "Z", "M"]), max_size=40))
def test_tokenize_matches_the_letter_rule_on_mixed_scripts(text):
    runs = "".join(ch if ch.isalpha() else " " for ch in text.casefold()).split()
    assert tokenize(text) == {run for run in runs if len(run) >= 3}


@given(st.text(max_size=60))
def test_tokens_are_casefolded_letter_words_of_three_or_more(text):
    for token in tokenize(text):
        assert len(token) >= 3
        assert token == token.casefold()
        assert all(ch.isalpha() for ch in token)


# ---- interpret_phi_hat ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phi", "level"),
    [
        (0.0, "low"),
        (0.4999, "low"),
        (0.50, "medium"),
        (0.6999, "medium"),
        (0.70, "high"),
        (1.0, "high"),
    ],
)
def test_interpret_default_thresholds(phi, level):
    assert interpret_phi_hat(phi) == level


def test_interpret_custom_thresholds():
    assert interpret_phi_hat(0.3, high=0.4, medium=0.2) == "medium"
    assert interpret_phi_hat(0.45, high=0.4, medium=0.2) == "high"
    assert interpret_phi_hat(0.1, high=0.4, medium=0.2) == "low"
