"""``data/frames.py``: tables from parquet and Hugging Face ``datasets`` keep what their cells say.
An empty cell rejects its row, never becomes the text "nan"; an integer id column with an empty
cell (read as floats) keeps "7", not "7.0"; a file ``datasets`` cannot read is named; two columns
meaning one are refused; a CSV row is named by its line in the file."""

import pandas as pd
import pytest

from model_code.config import DataParams
from model_code.data.frames import read_hf, read_parquet_dir
from model_code.data.tables import IngestError
from model_code.data.validation import validate_dataset


def test_empty_cells_reject_their_rows_and_whole_float_ids_keep_their_digits(tmp_path):
    pd.DataFrame({"_id": [7, None, 9], "title": ["t", None, "t"],
                  "text": ["lava flow", "basalt", None]}).to_parquet(tmp_path / "corpus.parquet")
    pd.DataFrame({"_id": ["q"], "text": [pd.NA]}, dtype="string").to_parquet(tmp_path / "queries.parquet")
    raw = read_parquet_dir(tmp_path)
    assert raw.corpus["doc_id"].tolist() == ["7", None, "9"]  # the column was float64: 7.0, NaN, 9.0
    assert raw.corpus["text"].tolist() == ["lava flow", "basalt", None] and raw.queries["text"].tolist() == [None]
    data = validate_dataset(raw, DataParams(source="parquet", path=str(tmp_path)))
    assert data.corpus["doc_id"].tolist() == ["7"]
    assert sorted((r["table"], r["line"], r["field"]) for r in data.rejects) == [
        ("corpus", 2, "doc_id"), ("corpus", 3, "text"), ("queries", 1, "text")]


def test_two_columns_naming_one_field_are_refused(tmp_path):
    pd.DataFrame({"_id": ["a"], "id": ["b"], "text": ["lava"]}).to_parquet(tmp_path / "corpus.parquet")
    with pytest.raises(IngestError, match=r"corpus\.parquet: columns '_id', 'id' all name the doc_id column"):
        read_parquet_dir(tmp_path)


def test_a_file_datasets_cannot_read_is_named_and_a_csv_row_by_its_line(tmp_path):
    broken = tmp_path / "corpus.jsonl"
    broken.write_text('{"_id": "a", "text": "lava"}\n{"_id": "b", "text": \n')
    with pytest.raises(IngestError, match=rf"{broken}: cannot be read as a Hugging Face dataset"):
        read_hf(broken)
    table = tmp_path / "corpus.csv"
    table.write_text("_id,title,text\na,,lava flow\nb,,\n")
    raw = read_hf(table)
    assert raw.corpus[["doc_id", "line"]].values.tolist() == [["a", 2], ["b", 3]]  # line 1 is the header
