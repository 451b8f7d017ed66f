"""What the encoder's token lengths cut from a corpus (``fresh-retriever profile``).

The shipped ``encoder.max_passage_length`` and ``max_query_length`` suit the demo's short
docstrings on 2 cores; on another corpus they may cut most documents, and a zero-shot MiniLM cut at
64 query tokens lost 6 points of nDCG@10 on a corpus of long queries. This reports each side's
length distribution in the encoder's own tokens (special tokens included, as the encoder counts
them), the share of texts each configured length cuts, and the share the model's own limit cuts.
"""

from __future__ import annotations

import numpy as np

from model_code.config import EncoderParams, model_token_limit
from model_code.data.ingested import passage_texts
from model_code.data.tables import RawDataset
from model_code.models.encoder import resolve_model_path

PERCENTILES = (50, 90, 99)


def _side(lengths: np.ndarray, configured: int, limit: int) -> dict:
    if not len(lengths):
        return {"texts": 0}
    return {
        "texts": len(lengths),
        **{f"p{p}": int(np.percentile(lengths, p, method="higher")) for p in PERCENTILES},  # a length seen
        "max": int(lengths.max()),
        "configured": configured,
        "cut_by_configured": float(np.mean(lengths > configured)),
        "cut_by_model_limit": float(np.mean(lengths > limit)),
    }


def profile(raw: RawDataset, encoder: EncoderParams, sample: int | None = 10_000, seed: int = 0) -> dict:
    """Token-length statistics of ``raw``'s passages (title and text, as encoded) and queries,
    over at most ``sample`` of each (seeded; None: all)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(encoder.model)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    limit, source = model_token_limit(path)
    rng = np.random.default_rng(seed)

    def lengths(texts: list[str]) -> np.ndarray:
        if sample is not None and len(texts) > sample:
            texts = [texts[i] for i in sorted(rng.choice(len(texts), sample, replace=False))]
        if not texts:
            return np.zeros(0, dtype=int)
        return np.array([len(ids) for ids in tokenizer(texts, truncation=False, verbose=False)["input_ids"]])

    return {
        "model": encoder.model, "model_limit": limit, "model_limit_source": source,
        "documents": len(raw.corpus), "queries": len(raw.queries), "sample": sample,
        # unvalidated rows: a parquet or Hub source may leave a title or text null (None), which is nothing
        "passages": _side(lengths(passage_texts(raw.corpus.fillna({"title": "", "text": ""}))),
                          encoder.max_passage_length, limit),
        "query_texts": _side(lengths(raw.queries["text"].fillna("").tolist()), encoder.max_query_length, limit),
    }


def describe(report: dict) -> str:
    """The report as a short table, with the settings that would cut less."""
    lines = [f"{report['documents']} documents, {report['queries']} queries"
             + (f" (at most {report['sample']} of each profiled)" if report["sample"] else ""),
             f"model {report['model']}: reads at most {report['model_limit']} tokens ({report['model_limit_source']})",
             "", f"{'':10} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6}   {'cut by configured':>24}   cut by the model"]
    for name, side, key in (("passages", report["passages"], "max_passage_length"),
                            ("queries", report["query_texts"], "max_query_length")):
        if not side["texts"]:
            lines.append(f"{name:10} (none)")
            continue
        configured = f"{side['cut_by_configured']:.1%} at {side['configured']}"
        lines.append(f"{name:10} {side['p50']:>6} {side['p90']:>6} {side['p99']:>6} {side['max']:>6}   "
                     f"{configured:>24}   {side['cut_by_model_limit']:.1%}")
        if side["cut_by_configured"] > side["cut_by_model_limit"]:
            if side["p99"] <= report["model_limit"]:
                lines.append(f"{'':10} encoder.{key}: {side['p99']} keeps 99 % whole")
            else:
                lines.append(f"{'':10} encoder.{key}: {report['model_limit']} (the model's limit) cuts the fewest")
    return "\n".join(lines)
