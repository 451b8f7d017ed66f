"""The ``faiss`` backend's dense store: FAISS over L2-normalised vectors, with its document-id map
(and the spherical k-means the corpus tree clusters with: FAISS is imported here only).

The index is built from an ``index_factory`` string with inner-product metric, and every vector
carries a stable integer id (its row in ``doc_ids.json``); that is what lets documents be added
(``add_with_ids``) and removed (``remove_ids``) later without renumbering. An IVF index keeps the
ids in its lists itself (a hash map finds a row's vector); any other is wrapped in ``IndexIDMap2``
(an IVF behind that wrapper answered as another document for every row after a removed one: the
wrapper's map closes the gap, the IVF's numbers do not). An index that cannot remove vectors
(HNSW's graph) keeps a removed row's vector and hides it from every search. With ``index.use_gpu: auto`` training, adding and searching run on the GPU when
faiss-gpu and a CUDA device are present; the saved index is always the CPU form.

Because rows are never renumbered, a change is cheap to store: ``save_delta`` writes only the rows
added (with their exact vectors, kept since load) and the rows removed since the index was
loaded or built, and ``apply_delta`` replays them onto that same starting index. An incremental
version of a retriever is stored this way instead of as a full copy of the index.

Settings: ``index.factory``, ``index.nprobe``, ``index.ef_search``, ``index.use_gpu``; built without settings (or
with ``exact_settings``) the index is ``Flat``: every row scored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import faiss
import numpy as np

from model_code.stores import register_store
from model_code.stores.base import VectorStore, check_rows

if TYPE_CHECKING:
    from model_code.config import IndexParams

log = logging.getLogger(__name__)


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _on_gpu(index: faiss.Index, use_gpu: str) -> faiss.Index:
    if use_gpu == "auto" and gpu_available():
        try:
            return faiss.index_cpu_to_all_gpus(index)
        except RuntimeError:  # index type without a GPU implementation (e.g. HNSW): stay on CPU
            return index
    return index


def _ids_kept_by_the_index(index: faiss.Index) -> faiss.Index:
    """``index`` with the ids of its IVF lists as the rows, and a hash map from row to vector (which,
    unlike the array map, allows removals). An IVF saved inside ``IndexIDMap2`` by earlier versions
    is taken out while nothing was removed from it (its own numbers are then the rows)."""
    if isinstance(index, faiss.IndexIDMap2) and faiss.try_extract_index_ivf(index.index) is not None:
        if not np.array_equal(faiss.vector_to_array(index.id_map), np.arange(index.ntotal)):
            log.warning("an IVF index behind IndexIDMap2 that had rows removed: its ids after them are shifted; "
                        "run the index stage again to rebuild it")
            return index
        index = faiss.clone_index(index.index)
    if isinstance(index, faiss.IndexIDMap):
        return index
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    return index


@register_store
@dataclass
class FaissStore(VectorStore):
    backend: ClassVar[str] = "faiss"
    shape: ClassVar[str] = "dense"

    index: faiss.Index
    doc_ids: list[str | None]  # position = faiss id; None marks a removed document
    use_gpu: str = "auto"  # index.use_gpu: auto = search on the GPU when faiss-gpu sees one
    # the journal save_delta writes: rows before ``_start`` existed at load; vectors of the rows added since
    _start: int = field(default=-1, repr=False)
    _added: list[np.ndarray] = field(default_factory=list, repr=False)
    _removed: list[int] = field(default_factory=list, repr=False)
    _hidden: set[int] = field(default_factory=set, repr=False)  # removed rows an HNSW graph still holds

    def __post_init__(self) -> None:
        if self._start < 0:
            self._start = len(self.doc_ids)
        self.index = _ids_kept_by_the_index(self.index)
        live = len(self.doc_ids) - self.doc_ids.count(None)
        if isinstance(self.index, faiss.IndexIDMap) and self.index.ntotal > live:  # removed rows still in the index
            self._hidden = {int(row) for row in faiss.vector_to_array(self.index.id_map) if self.doc_ids[row] is None}

    @classmethod
    def build(cls, vectors: np.ndarray, doc_ids: list[str], settings: IndexParams | None = None) -> FaissStore:
        factory, use_gpu = (settings.factory, settings.use_gpu) if settings else ("Flat", "auto")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        check_rows(vectors.shape[0], doc_ids)
        try:
            base = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as exc:
            raise ValueError(f"index.factory={factory!r} is not a valid faiss factory string: {exc}") from None
        index = base if faiss.try_extract_index_ivf(base) is not None else faiss.IndexIDMap2(base)
        working = _on_gpu(index, use_gpu)  # k-means of IVF training is where a GPU pays off
        if not working.is_trained:
            working.train(vectors)
        working.add_with_ids(vectors, np.arange(len(doc_ids), dtype=np.int64))
        if working is not index:
            index = faiss.index_gpu_to_cpu(working)
        built = cls(index=index, doc_ids=list(doc_ids), use_gpu=use_gpu)
        if settings is not None:
            built.set_search_breadth(settings.nprobe, settings.ef_search)
        return built

    def set_search_breadth(self, nprobe: int, ef_search: int) -> None:
        """How much of an approximate index a search reads: the IVF lists it probes, the HNSW
        candidates it keeps (saved with the index). FAISS's own HNSW default, 16, found 55 % of the
        exact top 10 over 5k synthetic documents (``benchmarks/scale.py``)."""
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            ivf.nprobe = nprobe
        base = faiss.downcast_index(self.index.index) if isinstance(self.index, faiss.IndexIDMap) else self.index
        if hasattr(base, "hnsw"):
            base.hnsw.efSearch = ef_search

    def add(self, vectors: np.ndarray, doc_ids: list[str]) -> None:
        """Append documents (HCE §5.3 / the dense path of incremental updates): new ids continue
        after the largest id in use, so removed ids are never reused."""
        clash = set(doc_ids) & set(self.live_ids())
        if clash:
            raise ValueError(f"documents already indexed: {sorted(clash)[:5]}")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        check_rows(vectors.shape[0], doc_ids)
        self._append(vectors, list(doc_ids))
        self._added.append(vectors)

    def _append(self, vectors: np.ndarray, doc_ids: list[str | None]) -> None:
        """Rows for ``doc_ids`` after the last one; a None id (a row removed again before the delta
        was saved) takes its position without a vector, so positions stay those of the writer."""
        start = len(self.doc_ids)
        rows = np.array([start + i for i, d in enumerate(doc_ids) if d is not None], dtype=np.int64)
        if len(rows):
            self.index.add_with_ids(vectors, rows)
        self.doc_ids.extend(doc_ids)

    def remove(self, doc_ids: list[str]) -> int:
        """Remove documents by id, every row of each (a multi-vector document has several); their
        slots in ``doc_ids`` become tombstones (None). Returns the number of rows removed."""
        wanted = set(doc_ids)
        missing = sorted(wanted - set(self.live_ids()))
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        rows = [i for i, d in enumerate(self.doc_ids) if d in wanted]
        removed = self._remove_rows(rows)
        self._removed.extend(row for row in rows if row < self._start)  # journalled once done
        return removed

    def _remove_rows(self, rows: list[int]) -> int:
        try:
            removed = int(self.index.remove_ids(np.array(rows, dtype=np.int64)))
        except RuntimeError as exc:
            if "not implemented" not in str(exc):
                raise
            removed = len(rows)  # an HNSW graph cannot drop a node: the rows stay, hidden from searches
            self._hidden.update(rows)
        for row in rows:
            self.doc_ids[row] = None
        return removed

    # -- deltas: what changed since load ------------------------------------------------------
    @staticmethod
    def exact_settings(settings: IndexParams) -> IndexParams:
        """``settings`` searching every row (dev selection scores checkpoints without approximation)."""
        return settings.model_copy(update={"factory": "Flat"})

    def copy(self) -> FaissStore:
        return FaissStore(index=faiss.clone_index(self.index), doc_ids=list(self.doc_ids), use_gpu=self.use_gpu)

    def save_delta_files(self, directory: Path) -> None:
        """Write the rows added and removed since this index was loaded (or built)."""
        directory.mkdir(parents=True, exist_ok=True)
        new_ids = self.doc_ids[self._start:]
        added = np.concatenate(self._added) if self._added else np.empty((0, self.index.d), dtype=np.float32)
        live = [i for i, d in enumerate(new_ids) if d is not None]  # rows added and removed again leave no vector
        np.save(directory / "added_vectors.npy", added[live] if len(added) else added)
        (directory / "delta.json").write_text(json.dumps(
            {"first_row": self._start, "doc_ids": new_ids, "removed_rows": sorted(self._removed)}))

    def apply_delta_files(self, directory: Path) -> None:
        """Replay a delta written by ``save_delta`` on the index it was made from."""
        delta = json.loads((directory / "delta.json").read_text())
        if delta["first_row"] != len(self.doc_ids):
            raise ValueError(f"{directory}: the delta starts at row {delta['first_row']} but this index has "
                             f"{len(self.doc_ids)} rows; it was made from another version")
        self._append(np.load(directory / "added_vectors.npy"), delta["doc_ids"])
        self._remove_rows(delta["removed_rows"])
        self._start, self._added, self._removed = len(self.doc_ids), [], []

    def vectors(self, doc_ids: list[str]) -> np.ndarray:
        """Stored vectors of ``doc_ids`` (drift statistics reuse them instead of re-encoding)."""
        position = {d: i for i, d in enumerate(self.doc_ids) if d is not None}
        keys = np.array([position[d] for d in doc_ids], dtype=np.int64)
        if not len(keys):
            return np.empty((0, self.index.d), dtype=np.float32)
        return self.index.reconstruct_batch(keys)

    def live_ids(self) -> list[str]:
        return [d for d in self.doc_ids if d is not None]

    def __len__(self) -> int:
        return int(self.index.ntotal) - len(self._hidden)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-``k`` scores and document ids per query row (fewer when the index is smaller; none
        when it holds no document: every one removed)."""
        k = min(k, len(self))
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if k <= 0:
            return np.empty((len(queries), 0), dtype=np.float32), [[] for _ in range(len(queries))]
        fetch = min(k + len(self._hidden), int(self.index.ntotal))  # enough for k once the hidden rows are left out
        scores, rows = _on_gpu(self.index, self.use_gpu).search(queries, fetch)
        if not self._hidden:
            return scores, [[self.doc_ids[i] for i in row if i >= 0] for row in rows]
        kept_scores, kept_ids = np.full((len(queries), k), -np.inf, dtype=np.float32), []
        for number, row in enumerate(rows):
            kept = [j for j, i in enumerate(row) if i >= 0 and self.doc_ids[i] is not None][:k]
            kept_scores[number, :len(kept)] = scores[number, kept]
            kept_ids.append([self.doc_ids[row[j]] for j in kept])
        return kept_scores, kept_ids

    def save_files(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(directory / "index.faiss"))
        (directory / "doc_ids.json").write_text(json.dumps(self.doc_ids))
        (directory / "settings.json").write_text(json.dumps({"use_gpu": self.use_gpu}))

    @classmethod
    def load_files(cls, directory: str | Path) -> FaissStore:
        directory = Path(directory)
        if not (directory / "index.faiss").is_file():
            raise FileNotFoundError(f"{directory}: no index.faiss; run the index stage first")
        settings = directory / "settings.json"
        return cls(
            index=faiss.read_index(str(directory / "index.faiss")),
            doc_ids=json.loads((directory / "doc_ids.json").read_text()),
            **(json.loads(settings.read_text()) if settings.is_file() else {}),
        )


def spherical_kmeans(vectors: np.ndarray, k: int, niter: int, seed: int) -> np.ndarray:
    """Cluster labels from faiss spherical k-means (GPU when available): the corpus tree's clustering."""
    kmeans = faiss.Kmeans(
        vectors.shape[1], k, niter=niter, seed=seed, spherical=True, min_points_per_centroid=1,
        max_points_per_centroid=1 << 20, gpu=faiss.get_num_gpus() > 0, verbose=False,
    )
    kmeans.train(np.ascontiguousarray(vectors, dtype=np.float32))
    _, labels = kmeans.index.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
    return labels[:, 0]
