"""Integration on real data: zero-shot all-MiniLM-L6-v2 through ingest -> index -> evaluate on
SciFact must land near its published nDCG@10 (~0.645), checking encoding, FAISS and metric code
together. Slow (encodes 5,183 documents at 256 tokens: ~10 min on 2 CPU cores)."""

import pytest

from model_code.config import load_params
from model_code.layout import Layout
from model_code.stages import evaluate, index, ingest, train
from tests.conftest import REPOSITORY, SCIFACT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SCIFACT / "corpus.jsonl").exists(), reason=f"SciFact not found at {SCIFACT}"),
]


def test_zero_shot_minilm_on_scifact(tmp_path):
    params = load_params(
        REPOSITORY / "params.yaml",
        {
            "data": {"source": "beir", "path": str(SCIFACT)},
            "encoder": {"max_passage_length": 256, "max_query_length": 64},
            "train": {"enabled": False},
        },
    )
    layout = Layout(tmp_path)
    summary = ingest.run(params, layout)
    assert summary["documents"] == 5183 and summary["rejected_rows"] == 0
    train.run(params, layout)
    index.run(params, layout)
    metrics = evaluate.run(params, layout)
    assert metrics["queries"] == 300
    assert 0.62 <= metrics["ndcg@10"] <= 0.67
