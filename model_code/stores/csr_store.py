"""The ``faiss`` backend's sparse store: documents as rows of a SciPy CSR matrix over the
vocabulary, with their id map, searched exactly by inner product (SVDR §3.6: a sparse matrix, not
an inverted index). FAISS has no sparse index, so the embedded backend keeps these rows in SciPy.

Two uses in kind ``svdr``: the *binary bag-of-tokens index* T(D) (``models.token_bags``) and the
sparse *embedding index* of the encoder's document vectors. Rows are never renumbered: ``add``
appends rows, ``remove`` masks them, so both are cheap and a removed document can come back as a
new row. For the same reason a change is small to store: ``save_delta`` writes the rows added and
the rows removed since load, ``apply_delta`` replays them onto that starting index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pandas as pd
import scipy.sparse as sp

from model_code.stores import register_store
from model_code.stores.base import VectorStore, check_rows

if TYPE_CHECKING:
    from model_code.config import IndexParams


@register_store
@dataclass
class CsrStore(VectorStore):
    backend: ClassVar[str] = "faiss"
    shape: ClassVar[str] = "sparse"

    matrix: sp.csr_matrix  # (rows, vocabulary)
    doc_ids: list[str]  # per row
    live: np.ndarray  # per row, False once removed
    loaded_rows: int = field(default=-1, repr=False)  # rows present at load: later ones go into the delta
    _removed: list[int] = field(default_factory=list, repr=False)  # rows before loaded_rows removed since load
    _live_rows: dict[str, int] | None = field(default=None, repr=False)  # live id -> row, built on first need

    def __post_init__(self) -> None:
        if self.loaded_rows < 0:
            self.loaded_rows = len(self.doc_ids)

    @classmethod
    def build(cls, matrix: sp.csr_matrix, doc_ids: list[str], settings: IndexParams | None = None) -> CsrStore:
        check_rows(matrix.shape[0], doc_ids)
        return cls(matrix.tocsr(), list(doc_ids), np.ones(len(doc_ids), dtype=bool))

    def live_ids(self) -> list[str]:
        return [d for d, alive in zip(self.doc_ids, self.live) if alive]

    def _live(self) -> dict[str, int]:
        """Live document id -> row: an addition or removal looks up its own ids only, not every row."""
        if self._live_rows is None:
            self._live_rows = {d: i for i, (d, alive) in enumerate(zip(self.doc_ids, self.live)) if alive}
        return self._live_rows

    def add(self, matrix: sp.csr_matrix, doc_ids: list[str]) -> None:
        check_rows(matrix.shape[0], doc_ids)
        live = self._live()
        clash = {d for d in doc_ids if d in live}
        if clash:
            raise ValueError(f"documents already indexed: {sorted(clash)[:5]}")
        first = len(self.doc_ids)
        self.matrix = sp.vstack([self.matrix, matrix], format="csr")
        self.doc_ids.extend(doc_ids)
        self.live = np.concatenate([self.live, np.ones(len(doc_ids), dtype=bool)])
        live.update((d, first + i) for i, d in enumerate(doc_ids))

    def remove(self, doc_ids: list[str]) -> int:
        """Mask the rows of ``doc_ids``; returns how many were removed."""
        live, wanted = self._live(), set(doc_ids)
        missing = wanted - live.keys()
        if missing:
            raise KeyError(f"documents not in the index: {sorted(missing)[:5]}")
        rows = sorted(live.pop(d) for d in wanted)
        self.live[rows] = False
        self._removed.extend(row for row in rows if row < self.loaded_rows)
        return len(rows)

    def search(self, queries: sp.csr_matrix, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-``k`` inner products and ids per query row, best first (ties: lower row first), over
        live rows only; ``k`` is cut to the number of live rows."""
        scores, rows = self.search_rows(queries, k)
        ids = np.asarray(self.doc_ids, dtype=object)
        return scores, [ids[r].tolist() for r in rows]

    def search_rows(self, queries: sp.csr_matrix, k: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """``search`` with row numbers instead of ids (a row's position in what was added)."""
        k = min(k, int(self.live.sum()))
        scores, rows = np.empty((queries.shape[0], k), dtype=np.float32), np.empty((queries.shape[0], k), dtype=np.int64)
        for start in range(0, queries.shape[0], chunk):
            dense = (queries[start : start + chunk] @ self.matrix.T).toarray()
            dense[:, ~self.live] = -np.inf
            order = np.argsort(-dense, axis=1, kind="stable")[:, :k]
            rows[start : start + chunk] = order
            scores[start : start + chunk] = np.take_along_axis(dense, order, axis=1)
        return scores, rows

    def vectors(self, doc_ids: list[str]) -> sp.csr_matrix:
        live = self._live()
        return self.matrix[[live[d] for d in doc_ids]]

    def copy(self) -> CsrStore:
        return CsrStore(self.matrix.copy(), list(self.doc_ids), self.live.copy())

    def save_files(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        sp.save_npz(directory / "matrix.npz", self.matrix)
        pd.DataFrame({"doc_id": self.doc_ids, "live": self.live}).to_parquet(directory / "rows.parquet", index=False)

    @classmethod
    def load_files(cls, directory: Path) -> CsrStore:
        rows = pd.read_parquet(directory / "rows.parquet")
        return cls(sp.load_npz(directory / "matrix.npz").tocsr(), rows["doc_id"].tolist(), rows["live"].to_numpy(bool))

    def save_delta_files(self, directory: Path) -> None:
        """The rows added since load (as an index of their own) and the earlier rows removed."""
        new = slice(self.loaded_rows, None)
        CsrStore(self.matrix[new], self.doc_ids[new], self.live[new]).save_files(directory)
        (directory / "delta.json").write_text(json.dumps({"first_row": self.loaded_rows, "removed_rows": self._removed}))

    def apply_delta_files(self, directory: Path) -> None:
        """Replay a delta written by ``save_delta`` on the index it was made from."""
        delta, added = json.loads((directory / "delta.json").read_text()), CsrStore.load_files(directory)
        if delta["first_row"] != len(self.doc_ids):
            raise ValueError(f"{directory}: the delta starts at row {delta['first_row']} but this index has "
                             f"{len(self.doc_ids)} rows; it was made from another version")
        self.matrix = sp.vstack([self.matrix, added.matrix], format="csr")
        self.doc_ids.extend(added.doc_ids)
        self.live = np.concatenate([self.live, added.live])
        self.live[delta["removed_rows"]] = False
        self.loaded_rows, self._removed, self._live_rows = len(self.doc_ids), [], None
