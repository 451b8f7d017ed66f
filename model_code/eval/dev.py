"""Dev-split scoring during training (model selection and HCE's EM schedule, Algorithm 3)."""

from __future__ import annotations

import numpy as np

from model_code.config import EncoderParams
from model_code.data.ingested import IngestedData
from model_code.eval.metrics import evaluate, hits_to_run, parse_metric, qrels_dict, search_depth
from model_code.models.encoder import Encoder
from model_code.stores import exact_store


class DevScorer:
    """Encodes the corpus with the current encoder and scores a fixed subset of dev queries.

    Returns the corpus embeddings too, so a re-clustering after an improvement reuses them.
    ``passage_length`` may be shorter than at indexing time: re-encoding the corpus every EM round
    dominates CPU training time, and the dev metric only has to rank rounds, not report quality."""

    def __init__(self, data: IngestedData, encoder_params: EncoderParams, metric: str, max_queries: int,
                 passage_length: int, split: str = "dev", ignore_identical_ids: bool = True):
        qrels = qrels_dict(data.qrels_for(split))
        chosen = sorted(qrels)[:max_queries]
        self.qrels = {q: qrels[q] for q in chosen}
        text = dict(zip(data.queries["query_id"], data.queries["text"]))
        self.query_text = [text[q] for q in chosen]
        self.doc_ids = data.corpus["doc_id"].tolist()
        self.passages = data.passages()
        self.params = encoder_params
        self.passage_length = passage_length
        self.metric = metric
        self.ignore_identical_ids = ignore_identical_ids

    def score(self, encoder: Encoder, corpus_embeddings: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        if corpus_embeddings is None:
            corpus_embeddings = encoder.encode(
                self.passages, self.passage_length, self.params.batch_size, desc="encoding corpus (dev)"
            )
        index = exact_store(corpus_embeddings, self.doc_ids)
        queries = encoder.encode(self.query_text, self.params.max_query_length, self.params.batch_size, side="query")
        depth = parse_metric(self.metric)[1]  # the metric's cutoff: recall@100 needs 100 hits
        scores, ids = index.search(queries, search_depth(depth, self.ignore_identical_ids))
        run = hits_to_run(list(self.qrels), ids, scores, depth, self.ignore_identical_ids)
        means, _ = evaluate(self.qrels, run, [self.metric])
        return means[self.metric], corpus_embeddings
