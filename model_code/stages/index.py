"""Stage 5, index build: encode the corpus with the trained encoder and build the FAISS index.

Outputs (``Layout.index``): index.faiss, doc_ids.json, manifest.json.
"""

from __future__ import annotations

import json
import time

from model_code.config import EncoderParams, IndexParams
from model_code.data.ingested import IngestedData
from model_code.index.faiss_index import DocIndex
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.encoder import Encoder


def run(params: IndexParams, encoder_params: EncoderParams, data: IngestedData, layout: Layout) -> dict:
    encoder = Encoder(str(layout.encoder), encoder_params.pooling)
    start = time.perf_counter()
    vectors = encoder.encode(
        data.passages(), encoder_params.max_passage_length, encoder_params.batch_size, desc="encoding corpus"
    )
    encode_seconds = time.perf_counter() - start
    start = time.perf_counter()
    index = DocIndex.build(vectors, data.corpus["doc_id"].tolist(), params.factory, params.nprobe)
    manifest = {
        "factory": params.factory,
        "dimension": int(vectors.shape[1]),
        "documents": len(index),
        "encode_seconds": encode_seconds,
        "build_seconds": time.perf_counter() - start,
    }
    with atomic_path(layout.index) as out:
        index.save(out)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
