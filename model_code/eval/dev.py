"""The one dev-split scorer behind every training decision: checkpoint selection scores the
configured kind's own retriever (``training/selection.py``), HCE's EM schedule (Algorithm 3) scores
its encoder over an exact index of the corpus after each round (``methods/hce/training.py``). Both
rank the same dev queries and count them as the evaluate stage counts test's."""

from __future__ import annotations

import numpy as np

from model_code.config import EncoderParams
from model_code.data.ingested import IngestedData
from model_code.eval.metrics import evaluate, hits_to_run, parse_metric, qrels_dict, search_depth
from model_code.models.encoder import Encoder
from model_code.retrievers.base import Retriever
from model_code.stores import exact_store


class DevScorer:
    """``metric`` of a ranking of the ``split`` queries (the first ``max_queries`` by id, or all),
    counted as the evaluate stage counts test's: a hit that is the query's own document is dropped
    first (``ignore_identical_ids``, BEIR's rule), each query keeps ``top_k`` hits (``eval.top_k``;
    at least the metric's depth), and the metric ranks those in trec_eval's order before its cut,
    so a tie across the metric's k is broken by document id, not by the retriever's order."""

    def __init__(self, data: IngestedData, metric: str, split: str = "dev", max_queries: int | None = None,
                 ignore_identical_ids: bool = True, top_k: int = 0):
        qrels = qrels_dict(data.qrels_for(split))
        chosen = sorted(qrels)[:max_queries] if max_queries else sorted(qrels)
        self.qrels = {q: qrels[q] for q in chosen}
        text = dict(zip(data.queries["query_id"], data.queries["text"]))
        self.query_ids = chosen
        self.query_text = [text[q] for q in chosen]
        self.data = data
        self.metric = metric
        self.ignore_identical_ids = ignore_identical_ids
        self.kept = max(parse_metric(metric)[1], top_k)  # recall@100 needs 100 hits
        self.depth = search_depth(self.kept, ignore_identical_ids)

    def score_hits(self, hit_ids: list[list[str]], hit_scores) -> float:
        """The metric of ``self.depth`` hits per query, in ``self.query_ids`` order."""
        run = hits_to_run(self.query_ids, hit_ids, hit_scores, self.kept, self.ignore_identical_ids)
        means, _ = evaluate(self.qrels, run, [self.metric])
        return means[self.metric]

    def score_retriever(self, retriever: Retriever) -> float:
        hits = retriever.search(self.query_text, self.depth, desc="searching dev queries")
        return self.score_hits([h.doc_ids for h in hits], [h.scores for h in hits])

    def score_encoder(self, encoder: Encoder, params: EncoderParams, passage_length: int,
                      corpus_embeddings: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """The metric of ``encoder`` searched exactly over the corpus encoded at ``passage_length``
        (which may be shorter than at indexing time: re-encoding the corpus every EM round dominates
        CPU training time, and this score only has to rank rounds); returns the corpus embeddings
        too, so a re-clustering after an improvement reuses them."""
        if corpus_embeddings is None:
            corpus_embeddings = encoder.encode(self.data.passages(), passage_length, params.batch_size,
                                               desc="encoding corpus (dev)")
        index = exact_store(corpus_embeddings, self.data.corpus["doc_id"].tolist())
        queries = encoder.encode(self.query_text, params.max_query_length, params.batch_size, side="query")
        scores, ids = index.search(queries, self.depth)
        return self.score_hits(ids, scores), corpus_embeddings
