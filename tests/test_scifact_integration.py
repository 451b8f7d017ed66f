"""Integration on real data: zero-shot all-MiniLM-L6-v2 through ingest -> index -> evaluate on
SciFact must land near its published nDCG@10 (~0.645), checking encoding, FAISS and metric code
together. Slow (encodes 5,183 documents at 256 tokens: ~10 min on 2 CPU cores)."""

import pytest

from model_code.config import load_params
from model_code.data.ingested import load_ingested
from model_code.layout import Layout
from model_code.stages import evaluate, index, ingest, train
from tests.conftest import SCIFACT
from tests.test_config import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SCIFACT / "corpus.jsonl").exists(), reason=f"SciFact not found at {SCIFACT}"),
]


def test_zero_shot_minilm_on_scifact(tmp_path):
    params = load_params(
        ROOT / "params.yaml",
        {
            "data": {"source": "beir", "path": str(SCIFACT)},
            "encoder": {"max_passage_length": 256, "max_query_length": 64},
            "train": {"enabled": False},
        },
    )
    layout = Layout(tmp_path)
    summary = ingest.run(params.data, layout)
    assert summary["documents"] == 5183 and summary["rejected_rows"] == 0
    data = load_ingested(layout.ingested)
    train.run(params.train, params.encoder, params.hierarchy, data, None, layout)
    index.run(params.index, params.encoder, data, layout)
    metrics = evaluate.run(params.eval, params.encoder, data, layout)
    assert metrics["queries"] == 300
    assert 0.62 <= metrics["ndcg@10"] <= 0.67
