"""Stage 3, hierarchy clustering: encode the corpus and build the corpus tree.

Outputs (``Layout.hierarchy``): tree.npz (see ``hierarchy/tree.py``), stats.json and the
corpus embeddings.npy the tree was built from (HCE samples cached negatives from them).
"""

from __future__ import annotations

import json
import logging

import numpy as np

from model_code.config import Params
from model_code.data.ingested import load_ingested
from model_code.hierarchy.tree import build_tree
from model_code.io import atomic_path
from model_code.layout import Layout
from model_code.models.embedding_cache import EmbeddingCache
from model_code.models.encoder import Encoder
from model_code.retrievers import kind_class
from model_code.stages import not_used

log = logging.getLogger(__name__)


def run(settings: Params, layout: Layout) -> dict:
    params, encoder_params = settings.hierarchy, settings.encoder
    kind = kind_class(settings.retriever.kind)
    if not kind.uses_encoder:
        return not_used(layout.hierarchy, f"retriever.kind {settings.retriever.kind} uses no encoder")
    if not kind.uses_tree:
        return not_used(layout.hierarchy, f"retriever.kind {settings.retriever.kind} uses no corpus tree")
    data = load_ingested(layout.ingested)
    encoder = Encoder(encoder_params.model, encoder_params.pooling)
    embeddings = EmbeddingCache(layout.embedding_cache).encode(
        encoder, data.passages(), encoder_params.max_passage_length, encoder_params.batch_size, desc="encoding corpus")
    branching = params.branching_for(len(embeddings))
    tree = build_tree(data.corpus["doc_id"].tolist(), embeddings, branching, params.niter, params.seed, params.builder)
    stats = {**tree.stats(), "branching": branching, "builder": params.builder}
    with atomic_path(layout.hierarchy) as out:
        out.mkdir()
        tree.save(out / "tree.npz")
        np.save(out / "embeddings.npy", embeddings)  # HCE caches negatives from these
        (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("corpus tree: depth %d, nodes per level %s", stats["depth"], stats["nodes_per_level"])
    return stats
