"""SVDR's binary token index (``model_code/methods/svdr/token_bags.py``): each document's bag of tokens
against the token set the tokenizer gives that document alone, the cut after a text's first words
(and what a tokenizer that cannot be cut there is given instead), and the vocabulary's bounds."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from model_code.methods.svdr import token_bags
from model_code.methods.svdr.token_bags import bag_of_tokens
from tests.helpers.svdr import START, TEXTS, token_set


def test_binary_index_is_each_documents_token_set(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(token_bags, "CHUNK", 2)  # several tokenizer calls
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = [*TEXTS, "", "long " * 50 + "tail words past the cut", "[CLS] unknown ☃ tokens"]
    matrix = bag_of_tokens(tokenizer, texts, 12, START, 30522 - START)
    assert matrix.shape == (len(texts), 30522 - START) and matrix.dtype == np.float32
    for row, text in zip(matrix, texts):
        assert set(row.indices.tolist()) == token_set(tokenizer, text, 12), text
        assert set(row.data.tolist()) <= {1.0}  # binary, not term frequency
    whole = bag_of_tokens(tokenizer, texts, 12, 0, 30522)  # every id a dimension: specials still never count
    for row, text in zip(whole, texts):
        assert set(row.indices.tolist()) == token_set(tokenizer, text, 12, start=0), text


@pytest.mark.parametrize("max_length", [12, 5])
def test_cutting_texts_after_their_first_words_keeps_their_first_tokens(tiny_model_dir, monkeypatch, max_length):
    """bag_of_tokens tokenises each text's first max_length words only: the same bags as whole
    texts, also where words give no token (the prefix falls short, even by one token, and the
    whole text is tokenised again, in whatever chunk), where a word gives many, and where a
    separator is whitespace to Python but not to BERT."""
    monkeypatch.setattr(token_bags, "CHUNK", 3)  # texts tokenised again sit in later chunks too
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert token_bags.cuts_at_words(tokenizer)
    texts = ["\u0301 " * 20 + "real words after empty ones", "\x00 \x07 " * 10 + "after control characters",
             "one\x1ctwo\x1cthree\x1cfour " * 20, "数学物理化学生物 " * 20, "a,b,c,d,e,f,g,h " * 20,
             "word " * (max_length - 1), "word " * max_length + "x", "nbsp\u00a0" * 30,
             "  leading   spaces\t\ttabs\n\nnewlines\r\n " * 5, "", "short",
             "\x1c".join(["qz"] * 60) + " tail" * 20,  # one 120-character word to BERT ([UNK]), 60 to Python
             "\u0301 " * 3 + "w " * (max_length - 3) + "zebra lion tiger",  # the prefix is one token short
             "\u0301 " * 20 + "late words"]  # tokenised again from a later chunk
    short = [a for a, b in zip(token_bags.word_prefixes(texts, max_length), texts) if len(a) < len(b)]
    assert len(short) >= 6  # the cut is exercised
    assert len(tokenizer(token_bags.word_prefixes(texts[:1], max_length)[0])["input_ids"]) < max_length  # and the redo
    matrix = bag_of_tokens(tokenizer, texts, max_length, START, 30522 - START)
    for row, text in zip(matrix, texts):
        assert set(row.indices.tolist()) == token_set(tokenizer, text, max_length), repr(text)


def test_a_text_with_fewer_words_than_the_cut_is_kept_whole_at_once():
    """Many whitespace runs and fewer words than max_length: a pattern that can split a run in
    several ways backtracks through all of them (it hung on SciFact abstracts at 256 tokens)."""
    import subprocess
    import sys

    code = ("from model_code.methods.svdr.token_bags import word_prefixes; t = 'word  ' * 100; "
            "assert word_prefixes([t, t + 'x ' * 300], 256) == [t, t + 'x ' * 156]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class RecordingBackend:
    """A Rust tokenizer, recording the texts each batch encoding is given."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def encode_batch_fast(self, texts):
        self.calls.append(list(texts))
        return self.backend.encode_batch_fast(texts)


def recorded_calls(monkeypatch) -> list:
    """The texts of every batch encoding ``bag_of_tokens`` makes from now on, call by call."""
    recorders, real = [], token_bags.truncating_backend

    def recording(tokenizer, max_length):
        recorders.append(RecordingBackend(real(tokenizer, max_length)))
        return recorders[-1]

    monkeypatch.setattr(token_bags, "truncating_backend", recording)
    return recorders


def test_a_bert_tokenizer_is_given_each_texts_first_max_length_words_only(tiny_model_dir, monkeypatch):
    """The binary index's speed-up: a BERT tokenizer tokenises a long text's first max_length
    words, not the whole text (the bags are the whole text's:
    test_cutting_texts_after_their_first_words_keeps_their_first_tokens)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    recorders = recorded_calls(monkeypatch)
    words = [f"w{i}" for i in range(300)]
    bags = bag_of_tokens(tokenizer, [" ".join(words), "short text"], 12, START, 30522 - START)
    assert [r.calls for r in recorders] == [[[" ".join(words[:12]) + " ", "short text"]]]
    assert set(bags[0].indices.tolist()) == token_set(tokenizer, " ".join(words), 12)


def test_a_tokenizer_that_cannot_be_cut_at_words_is_given_whole_texts(tiny_model_dir, monkeypatch):
    """Truncating on the left keeps a text's last tokens, so its first words are not enough: each
    text goes whole to the tokenizer, in chunks, and its bag is its last max_length tokens' set."""
    monkeypatch.setattr(token_bags, "CHUNK", 2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, truncation_side="left")
    recorders = recorded_calls(monkeypatch)
    assert not token_bags.cuts_at_words(tokenizer)
    texts = ["stars planets galaxies telescope orbit " * 5 + "recipe oven flour", "a recipe", "", "football goal"]
    bags = bag_of_tokens(tokenizer, texts, 8, START, 30522 - START)
    assert [r.calls for r in recorders] == [[texts[:2], texts[2:]]]
    for row, text in zip(bags, texts):
        ids = tokenizer(text, truncation=True, max_length=8)["input_ids"]
        assert set(row.indices.tolist()) == {i - START for i in ids if i >= START and i not in tokenizer.all_special_ids}
    assert {t - START for t in tokenizer("recipe oven flour")["input_ids"][1:-1]} <= set(bags[0].indices)


def test_a_tokenizer_without_a_rust_backend_is_refused_by_name():
    slow = type("SlowTokenizer", (), {"truncation_side": "right", "all_special_ids": [0]})()
    with pytest.raises(ValueError, match="needs a tokenizer with a Rust backend .* SlowTokenizer has none"):
        bag_of_tokens(slow, ["a text"], 8, START, 30522 - START)


def test_tokens_at_or_past_the_last_dimension_are_left_out(tiny_model_dir):
    """T(x) has vocab_size columns: a token id vocab_start + vocab_size (one past the last
    dimension) or above is not a dimension; the one just below it is, and so is vocab_start."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "stars planets galaxies telescope orbit comet!"  # "!" is id 999, the first dimension
    ids = sorted(token_set(tokenizer, text, 32, start=0))
    top, below = ids[-1], ids[-2]
    size = top - START  # the top id is one past the last column, the one below it a column
    matrix = bag_of_tokens(tokenizer, [text], 32, START, size)
    assert matrix.shape == (1, size)
    expected = {i - START for i in ids if START <= i < START + size}
    assert set(matrix.indices.tolist()) == expected
    assert {0, below - START} <= expected and top - START not in expected
