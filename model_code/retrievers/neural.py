"""The trained encoder as the neural kinds use it: loaded on first use, with the lengths, pooling
and tying it was built with recorded in the retriever's manifest, so every later version encodes
new documents and queries exactly as the index was built, whatever params.yaml says by then.
Queries go through the query side (an untied encoder's own transformer), everything else through
the passage side."""

from __future__ import annotations

import functools
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from model_code.config import EncoderParams
from model_code.data.ingested import passage_texts
from model_code.models.embedding_cache import EmbeddingCache
from model_code.models.encoder import Encoder

RECORDED = ("pooling", "max_query_length", "max_passage_length", "batch_size", "shared_encoder")


class EncoderHandle:
    """``cache``: where a build reads and stores its vectors (``models/embedding_cache.py``), so
    the corpus an earlier stage encoded with the same encoder is not encoded again; None (a
    loaded retriever, a server) encodes every call."""

    def __init__(self, directory: Path, settings: dict[str, Any], cache: Path | None = None):
        self.directory = Path(directory)
        self.settings = {key: settings[key] for key in RECORDED}
        self.cache = EmbeddingCache(cache) if cache is not None else None

    @classmethod
    def from_params(cls, directory: Path, params: EncoderParams, cache: Path | None = None) -> EncoderHandle:
        return cls(directory, params.model_dump(), cache)

    @classmethod
    def from_manifest(cls, directory: Path, manifest: dict[str, Any]) -> EncoderHandle:
        return cls(directory, {"shared_encoder": True, **manifest["encoder"]})  # older manifests: tied

    def manifest(self) -> dict[str, Any]:
        return {"encoder": self.settings}

    @functools.cached_property
    def model(self) -> Encoder:
        """The saved encoder, refused when its tying is not the one the retriever is (or is being)
        built with: a query side the index never saw, or a missing one, would answer silently."""
        encoder = _shared_encoder(self.directory, self.settings["pooling"])
        if encoder.shared != self.settings["shared_encoder"]:
            saved = "one encoder for queries and documents" if encoder.shared else "a separate query encoder (query/)"
            raise ValueError(f"{self.directory} holds {saved}, but the retriever is built with encoder.shared_encoder "
                             f"{self.settings['shared_encoder']}: train the encoder with that setting and index again")
        return encoder

    def embed_queries(self, texts: list[str], desc: str | None = None) -> np.ndarray:
        return self._encode(texts, "query", desc)

    def embed_texts(self, texts: list[str], desc: str | None = None) -> np.ndarray:
        return self._encode(texts, "passage", desc)

    def embed_documents(self, documents: pd.DataFrame, desc: str | None = None) -> np.ndarray:
        return self.embed_texts(passage_texts(documents), desc=desc)

    def embed_document_layers(self, documents: pd.DataFrame, layers: list[int], desc: str | None = None) -> np.ndarray:
        """(n, len(layers), dim): each document's pooled, L2-normalised vector at every listed layer."""
        return self._encode(passage_texts(documents), "passage", desc, layers)

    def _encode(self, texts: list[str], side: str, desc: str | None, layers: list[int] | None = None) -> np.ndarray:
        length, batch_size = self.settings[f"max_{side}_length"], self.settings["batch_size"]
        if self.cache is None:
            return self.model.encode(texts, length, batch_size, desc=desc, layers=layers, side=side)
        return self.cache.encode(self.model, texts, length, batch_size, desc=desc, layers=layers, side=side)


# Every loaded encoder still in use, by saved directory: one run of the freshness loop loads the
# champion's retriever version, its lineage's base version and the version it writes, all with the
# lineage's one encoder (three loads, 0.7 s of a 5 s update, became one). Weak values: an encoder
# nothing holds any more (a swapped-out lineage in the serving process) is freed as before.
_LOADED: weakref.WeakValueDictionary[tuple[str, str, int], Encoder] = weakref.WeakValueDictionary()


def _shared_encoder(directory: Path, pooling: str) -> Encoder:
    """The encoder saved in ``directory``, loaded once while something holds it; its files'
    newest modification time is part of the key, so an encoder saved again is loaded again.
    Inference only: training builds its own ``Encoder``."""
    files = [entry for folder in (directory, directory / "query") if folder.is_dir()
             for entry in os.scandir(folder) if entry.is_file()]
    key = (str(directory.resolve()), pooling, max((entry.stat().st_mtime_ns for entry in files), default=0))
    encoder = _LOADED.get(key)
    if encoder is None:
        encoder = _LOADED[key] = Encoder(str(directory), pooling)
    return encoder


def reuse_or_embed(encoder: EncoderHandle, documents: pd.DataFrame,
                   embeddings: dict[str, np.ndarray] | None) -> np.ndarray:
    """The documents' vectors: those an earlier step made (the drift report) when it covered them
    all, else freshly encoded."""
    if embeddings is not None and all(d in embeddings for d in documents["doc_id"]):
        return np.stack([embeddings[d] for d in documents["doc_id"]]).astype(np.float32)
    return encoder.embed_documents(documents)
