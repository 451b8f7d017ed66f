"""Stage 5, index: build the configured retriever kind over the ingested corpus.

What is built is the kind's business (``model_code/retrievers``): a FAISS index of the trained
encoder's vectors (dense), that plus the IncDSI head with its tuned addition parameters
(incdsi), a BM25 index (bm25). Output: ``Layout.retriever`` (manifest.json + the kind's files),
with the corpus's text beside them (``DocumentStore``: what a search asking for documents returns).
"""

from __future__ import annotations

import time

from model_code.config import Params
from model_code.data.ingested import load_ingested
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.retrievers import kind_class, save_retriever
from model_code.versions.documents import DocumentStore


def run(params: Params, layout: Layout) -> dict:
    start = time.perf_counter()
    data = load_ingested(layout.ingested)
    retriever = kind_class(params.retriever.kind).build(params, data, layout)
    with atomic_path(layout.retriever) as out:
        manifest = save_retriever(retriever, out, store=DocumentStore(data.corpus), seconds=time.perf_counter() - start)
    return {k: v for k, v in manifest.items() if k != "files"}
