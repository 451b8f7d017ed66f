"""``data/profile.py`` and ``fresh-retriever profile``: token lengths counted on texts whose length
is known by construction (one token per repeated word, plus [CLS] and [SEP]), the shares each
configured length and the model's own limit cut, and the limit read from where the model says it."""

import json

import pytest
import yaml

from model_code.cli import main


def beir(directory, passage_words: list[int], query_words: list[int]):
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(["cat"] * n)}) + "\n"
        for i, n in enumerate(passage_words)))
    (directory / "queries.jsonl").write_text("".join(
        json.dumps({"_id": f"q{i}", "text": " ".join(["dog"] * n)}) + "\n" for i, n in enumerate(query_words)))
    (directory / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    return directory


def run_profile(tmp_path, capsys, data, *extra) -> tuple[int, str]:
    params = tmp_path / "params.yaml"
    if not params.exists():
        params.write_text(yaml.safe_dump({"encoder": {"model": str(tmp_path / "model"), "max_passage_length": 12,
                                                      "max_query_length": 5}}))
    status = main(["profile", str(data), "--params", str(params), *extra])
    return status, capsys.readouterr()


@pytest.fixture
def model(tmp_path, tiny_model_dir):
    import shutil

    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_lengths_and_cut_shares_of_known_texts(tmp_path, capsys, model):
    data = beir(tmp_path / "beir", passage_words=[4, 8, 10, 20, 200], query_words=[1, 2, 3, 4])
    status, out = run_profile(tmp_path, capsys, data, "--json")
    assert status == 0, out.err
    report = json.loads(out.out)
    passages, queries = report["passages"], report["query_texts"]
    assert passages["max"] == 202 and passages["p50"] == 12  # words + [CLS] + [SEP]
    assert passages["cut_by_configured"] == pytest.approx(2 / 5)  # 22 and 202 tokens > 12
    # the tiny model has no sentence-transformers config: its position embeddings (128) bound it
    source = "config.json max_position_embeddings"
    assert (report["model_limit"], report["model_limit_source"]) == (128, source)
    assert passages["cut_by_model_limit"] == pytest.approx(1 / 5)
    assert queries["cut_by_configured"] == pytest.approx(1 / 4)  # 6 tokens > 5
    assert queries["cut_by_model_limit"] == 0.0

    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    status, out = run_profile(tmp_path, capsys, data, "--json")
    report = json.loads(out.out)
    assert (report["model_limit"], report["passages"]["cut_by_model_limit"]) == (16, pytest.approx(2 / 5))

    status, out = run_profile(tmp_path, capsys, data)  # the table, with what would cut less
    assert "encoder.max_query_length: 6 keeps 99 % whole" in out.out


def test_a_directory_that_is_not_beir_is_named(tmp_path, capsys, model):
    (tmp_path / "empty").mkdir()
    status, out = run_profile(tmp_path, capsys, tmp_path / "empty")
    assert status == 2 and f"{tmp_path / 'empty'}: not a BEIR directory" in out.err


def test_a_document_without_a_title_is_profiled_as_its_text_alone(tmp_path, capsys, model):
    """A null title adds nothing to what is measured (the text's 4 words and [CLS], [SEP]), from a
    BEIR file (JSON null) and from a parquet source (None, which ingestion would refuse later)."""
    import pandas as pd

    data = beir(tmp_path / "beir", passage_words=[4, 4], query_words=[1])
    rows = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    rows[0]["title"] = None
    (data / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, out = run_profile(tmp_path, capsys, data, "--json")
    assert status == 0, out.err
    assert json.loads(out.out)["passages"]["max"] == 6

    parquet = tmp_path / "parquet"
    parquet.mkdir()
    pd.DataFrame({"_id": ["d0", "d1"], "title": [None, ""], "text": ["cat cat cat cat"] * 2}).to_parquet(
        parquet / "corpus.parquet")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "encoder": {"model": str(model), "max_passage_length": 12, "max_query_length": 5},
        "data": {"source": "parquet", "path": str(parquet)}}))
    status = main(["profile", "--params", str(tmp_path / "params.yaml"), "--json"])  # the source params.data names
    out = capsys.readouterr()
    assert status == 0, out.err
    assert json.loads(out.out)["passages"]["max"] == 6
