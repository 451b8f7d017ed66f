"""The ``milvus`` backend's stores: a lineage's vectors in one Milvus collection, each retriever
version a view of it (``index.milvus``; pymilvus is imported here only). ``MilvusStore`` keeps dense
rows (FLOAT_VECTOR: dense, incdsi, mlr), ``MilvusSparseStore`` sparse ones (SPARSE_FLOAT_VECTOR
under a SPARSE_INVERTED_INDEX: svdr's token bags and sparse embeddings); everything else is shared.

Why views: a retriever version is immutable (a rollback serves an earlier registered version again)
while a collection is one mutable table that every server reads. Each row carries the write-set
that wrote it (``born``); removing a document writes a *tombstone* row (``removes``: the row it
removes) under the remover's write-set. A version is the list of write-sets it holds: it sees the
vector rows born in one of them, less those a tombstone born in one of them removes. Hence:

* an update writes its rows and tombstones under a new write-set id, which no served version lists
  until the update commits it (``milvus_commits``: one row in the lineage's commit log, written
  after the rows): a crash
  before the commit leaves nothing half-applied in what is served, and the retried batch writes a
  write-set of its own;
* a saved version is a reference (URI, collection, write-sets) of a few hundred bytes, not a copy
  of the index; its delta is the write-sets it added; a server following the champion loads the
  next version by reading that reference, with no index to load;
* rollback within a lineage serves an earlier list; across lineages, another collection;
* ``copy`` is a view with write-sets of its own (the drift report adds a batch to one to measure
  it, and the deployed view never sees those rows).

The search filter is ``born in [...] and removes == -1``, over two scalar indexes (INVERTED; on a
Milvus 2.3 server, STL_SORT), so a server answers it from its indexes rather than row by row; the
view's removed rows (few: those its tombstones name) are left out client-side, by asking for that
many more results. Rows of write-sets no registered version and no commit lists (a crashed update, the
drift report's copies) are invisible; ``sweep`` deletes them and drops collections no version refers to
(``fresh-registry gc``). A full training builds a new collection, named ``<prefix>_<UTC time>_<random>``.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import scipy.sparse as sp

from model_code.stores import register_store
from model_code.stores.base import VectorStore, check_rows

if TYPE_CHECKING:
    from pymilvus import MilvusClient

    from model_code.config import IndexParams

log = logging.getLogger(__name__)
REFERENCE_FILE = "milvus.json"  # a saved version: where its collection is and the write-sets it sees
DELTA_FILE = "milvus_delta.json"  # a delta: the write-sets an update added, and the view it started from
ID_CHARS = 2048  # longest document id a row holds (data.max_id_chars is 512 by default)
COMMIT_LOG_SUFFIX = "_commits"  # a lineage's commit log is the collection named <lineage>_commits
VECTOR_ROW = -1  # ``removes`` of a row that holds a document's vector (a tombstone's names the row it removes)
MAX_RESULTS = 16384  # Milvus's largest top-k
SPARSE_INDEX = "SPARSE_INVERTED_INDEX"  # the sparse store's index: exact, one posting list per dimension
WRITE_BATCH = 2048  # rows per insert request
READ_BATCH = 1000  # ids per query request


class MilvusStoreError(RuntimeError):
    """A Milvus request that failed, with the URI and collection it was for."""


@dataclass(frozen=True)
class Connection:
    """Where a collection lives and how requests to it are made; saved with every version."""

    uri: str
    collection: str
    dimension: int
    index_type: str = "FLAT"
    ef_search: int = 128
    nprobe: int = 8
    timeout_s: float = 30.0
    token: str | None = None  # the environment variable holding the token, never the token

    @property
    def client(self) -> MilvusClient:
        return _client(self.uri, self.token, self.timeout_s)

    def where(self) -> str:
        return f"Milvus at {self.uri}, collection {self.collection!r}"

    @contextmanager
    def calling(self, what: str) -> Iterator[None]:
        """Turn a failed request into one error naming the URI, the collection and what was asked."""
        from pymilvus import MilvusException

        try:
            yield
        except MilvusException as exc:
            raise MilvusStoreError(f"{self.where()}: {what} failed: {exc.message} (code {exc.code})") from None

    def search_params(self, k: int) -> dict:
        if self.index_type == SPARSE_INDEX:  # every posting list read: the exact inner product
            return {"metric_type": "IP", "params": {"drop_ratio_search": 0.0}}
        if self.index_type == "HNSW":
            return {"metric_type": "IP", "params": {"ef": max(self.ef_search, k)}}
        if self.index_type == "IVF_FLAT":
            return {"metric_type": "IP", "params": {"nprobe": self.nprobe}}
        return {"metric_type": "IP", "params": {}}


_CLIENTS: dict[tuple[str, str | None], MilvusClient] = {}


def _client(uri: str, token_env: str | None, timeout_s: float) -> MilvusClient:
    """One client per URI in a process (a Milvus Lite file is opened once). pymilvus is imported
    here, on first use: it takes 0.7 s, which every process importing the stores would pay."""
    from pymilvus import MilvusClient, MilvusException

    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)  # it logs each refused call with a traceback; ours names it
    key = (uri, token_env)
    if key not in _CLIENTS:
        token = ""
        if token_env:
            token = os.environ.get(token_env, "")
            if not token:
                raise MilvusStoreError(f"Milvus at {uri}: index.milvus.token names ${token_env}, which is not set")
        options = {"grpc_options": {"grpc.keepalive_time_ms": LOCAL_KEEPALIVE_MS}} if _local(uri) else {}
        try:
            _CLIENTS[key] = MilvusClient(uri=uri, token=token, timeout=timeout_s, **options)
        except MilvusException as exc:
            raise MilvusStoreError(f"Milvus at {uri}: cannot connect ({exc.message}); start it with `make milvus-up` "
                                   "or set index.milvus.uri") from None
    return _CLIENTS[key]


# pymilvus pings its server every 10 s; the Milvus Lite server (gRPC's defaults) allows a ping without
# data every 5 minutes and sends GOAWAY "too_many_pings" after the third early one: a client idle
# for 30 s had its connection dropped (and re-made) with an error in the log. A server on this
# machine needs no keep-alive to find a dead network path; a remote one keeps pymilvus's.
LOCAL_KEEPALIVE_MS = 360_000


def _local(uri: str) -> bool:
    """Whether ``uri`` is a Milvus Lite file or a server on this machine."""
    from urllib.parse import urlsplit

    return "://" not in uri or urlsplit(uri).hostname in ("127.0.0.1", "localhost", "::1")


def resolve_uri(uri: str) -> str:
    """A Milvus Lite file as an absolute path (a version keeps working from any directory); a server URI as given."""
    return uri if "://" in uri else str(Path(uri).expanduser().resolve())


def _quoted(text: str) -> str:
    """``text`` as a string literal of a Milvus filter expression."""
    if any(ord(ch) < 32 and ch not in "\n\r\t" for ch in text):
        raise ValueError(f"document id {text!r}: control characters cannot be matched in a Milvus filter")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def new_write_set() -> int:
    """A write-set id: its second of creation (``sweep`` leaves write-sets younger than its grace
    period alone: an update may be between its write and its registration) and 20 random bits."""
    return (int(time.time()) << 20) | secrets.randbelow(1 << 20)


def write_set_age(write_set: int) -> float:
    return time.time() - (write_set >> 20)


def _integers(values: Iterable[int]) -> str:
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def _dense(vectors) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(vectors), -1)


@register_store
@dataclass
class MilvusStore(VectorStore):
    backend: ClassVar[str] = "milvus"
    shape: ClassVar[str] = "dense"
    in_files: ClassVar[bool] = False
    vector_type: ClassVar[str] = "FLOAT_VECTOR"  # the pymilvus DataType of the vector field

    connection: Connection
    base: list[int]  # the write-sets of the version this view was loaded (or built, or copied) as
    written: list[int] = field(default_factory=list)  # write-sets this view wrote since: its delta
    _open: int | None = field(default=None, repr=False)  # the write-set this view's next write goes to
    _dead: set[int] | None = field(default=None, repr=False)  # the rows its tombstones remove (read on first use)

    # -- building a collection ----------------------------------------------------------------
    @classmethod
    def build(cls, vectors, doc_ids: list[str], settings: IndexParams | None = None) -> MilvusStore:
        """A new collection holding ``vectors`` (a full training's lineage starts here)."""
        from model_code.config import IndexParams

        settings = cls.exact_settings(IndexParams(backend=cls.backend)) if settings is None else settings
        milvus = settings.milvus
        vectors = cls._converted(vectors)
        check_rows(vectors.shape[0], doc_ids)
        name = f"{milvus.collection_prefix}_{time.strftime('%Y%m%d%H%M%S', time.gmtime())}_{secrets.token_hex(3)}"
        connection = Connection(uri=resolve_uri(milvus.uri), collection=name, dimension=int(vectors.shape[1]),
                                index_type=cls._index_type(milvus.index_type), ef_search=settings.ef_search,
                                nprobe=settings.nprobe, timeout_s=milvus.timeout_s, token=milvus.token)
        _create_collection(connection, cls.vector_type, milvus.hnsw_m, milvus.ef_construction, milvus.nlist)
        store = cls(connection, base=[])
        store.add(vectors, list(doc_ids))
        with connection.calling("sealing the collection"):  # searched as an index, not as inserted rows: Milvus
            connection.client.flush(name, timeout=connection.timeout_s)  # Lite took 2.7 s a query at 50k before
        _wait_for_index(connection, len(doc_ids))
        store._settle()
        return store

    @staticmethod
    def exact_settings(settings: IndexParams) -> IndexParams:
        return settings.model_copy(update={"milvus": settings.milvus.model_copy(update={"index_type": "FLAT"})})

    # -- the vector field's form (dense here; MilvusSparseStore overrides these) --------------------
    @staticmethod
    def _index_type(configured: str) -> str:
        return configured

    @staticmethod
    def _converted(vectors):
        return _dense(vectors)

    @staticmethod
    def _rows(vectors) -> list:
        return list(vectors)

    def _tombstone_vector(self):
        return np.zeros(self.connection.dimension, dtype=np.float32)

    def _stacked(self, rows: list):
        return np.array(rows, dtype=np.float32).reshape(len(rows), self.connection.dimension)

    # -- the view ---------------------------------------------------------------------------
    @property
    def visible(self) -> list[int]:
        return self.base + self.written

    def _filter(self, rows: str = "vector") -> str:
        """The view's vector rows (``rows="tombstone"``: its tombstones), as indexed fields only."""
        kind = f"removes == {VECTOR_ROW}" if rows == "vector" else f"removes > {VECTOR_ROW}"
        return f"born in {_integers(self.visible)} and {kind}"

    def _removed(self) -> set[int]:
        """The rows this view's tombstones remove (read once per view, kept as it writes more)."""
        if self._dead is None:
            with self.connection.calling("reading removals"):
                tombstones = all_rows(self.connection.client, self.connection.collection, self._filter("tombstone"),
                                       ["row", "removes"], self.connection.timeout_s)
            self._dead = {t["removes"] for t in tombstones}
        return self._dead

    def _rows_of(self, doc_ids: list[str], fields: list[str]) -> list[dict]:
        """The visible vector rows of ``doc_ids``, in row order."""
        client, found, dead = self.connection.client, [], self._removed()
        for start in range(0, len(doc_ids), READ_BATCH):
            names = ",".join(_quoted(d) for d in doc_ids[start:start + READ_BATCH])
            with self.connection.calling("reading rows"):
                found += client.query(self.connection.collection, filter=f"{self._filter()} and doc_id in [{names}]",
                                       output_fields=["row", *fields], timeout=self.connection.timeout_s)
        return sorted((row for row in found if row["row"] not in dead), key=lambda row: row["row"])

    def _write_set(self) -> int:
        """The write-set this view writes to, new on its first write: an id no row carries yet."""
        if self._open is None:
            while True:
                candidate = new_write_set()
                with self.connection.calling("allocating a write-set"):
                    taken = self.connection.client.query(self.connection.collection, filter=f"born == {candidate}",
                                                         output_fields=["row"], limit=1,
                                                         timeout=self.connection.timeout_s)
                if not taken:
                    break
            self._open = candidate
            self.written.append(candidate)
        return self._open

    def _settle(self) -> None:
        """What this view wrote becomes its base (it was saved, or the build finished)."""
        self.base, self.written, self._open = self.visible, [], None

    def _insert(self, rows: list[dict], what: str) -> None:
        for start in range(0, len(rows), WRITE_BATCH):
            part = rows[start:start + WRITE_BATCH]
            with self.connection.calling(f"inserting {len(part)} {what}"):
                self.connection.client.insert(self.connection.collection, part, timeout=self.connection.timeout_s)

    # -- the contract -----------------------------------------------------------------------
    def add(self, vectors, doc_ids: list[str]) -> None:
        vectors = self._converted(vectors)
        check_rows(vectors.shape[0], doc_ids)
        if vectors.shape[1] != self.connection.dimension:
            raise ValueError(f"{self.connection.where()}: vectors of dimension {vectors.shape[1]}, the collection "
                             f"holds {self.connection.dimension}")
        clash = {row["doc_id"] for row in self._rows_of(list(doc_ids), ["doc_id"])}
        if clash:
            raise ValueError(f"documents already indexed: {sorted(clash)[:5]}")
        write_set = self._write_set()
        self._insert([{"doc_id": d, "born": write_set, "removes": VECTOR_ROW, "vector": v}
                      for d, v in zip(doc_ids, self._rows(vectors))], "rows")

    def remove(self, doc_ids: list[str]) -> int:
        rows = self._rows_of(list(doc_ids), ["doc_id"])
        missing = sorted(set(doc_ids) - {row["doc_id"] for row in rows})
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        write_set, placeholder = self._write_set(), self._tombstone_vector()
        self._insert([{"doc_id": row["doc_id"], "born": write_set, "removes": row["row"], "vector": placeholder}
                      for row in rows], "tombstones")
        self._removed().update(row["row"] for row in rows)
        return len(rows)

    def search(self, queries, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top ``k`` per query, asking for as many more as this view has removed rows (at most that
        many results can be removed ones), which are then left out."""
        queries, dead = self._converted(queries), self._removed()
        expression, limit = self._filter(), k + len(dead)
        if limit > MAX_RESULTS:  # too many removals to over-fetch: name them in the filter (slower, exact)
            expression, limit = f"{expression} and not (row in {_integers(sorted(dead))})", k
        with self.connection.calling(f"searching {queries.shape[0]} queries"):
            found = self.connection.client.search(
                self.connection.collection, data=self._rows(queries), anns_field="vector",
                limit=min(limit, MAX_RESULTS), filter=expression,
                output_fields=["doc_id", "row"], search_params=self.connection.search_params(limit),
                timeout=self.connection.timeout_s)
        kept = [[hit for hit in hits if hit["row"] not in dead][:k] for hits in found]
        ids = [[hit["entity"]["doc_id"] for hit in hits] for hits in kept]
        scores = np.full((len(ids), max(map(len, ids), default=0)), -np.inf, dtype=np.float32)
        for row, hits in zip(scores, kept):
            row[: len(hits)] = [hit["distance"] for hit in hits]
        return scores, ids

    def vectors(self, doc_ids: list[str]) -> np.ndarray:
        stored = {}
        for row in self._rows_of(list(doc_ids), ["doc_id", "vector"]):
            stored.setdefault(row["doc_id"], row["vector"])
        missing = [d for d in doc_ids if d not in stored]
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        return self._stacked([stored[d] for d in doc_ids])

    def live_ids(self) -> list[str]:
        dead = self._removed()
        with self.connection.calling("listing rows"):
            rows = all_rows(self.connection.client, self.connection.collection, self._filter(), ["row", "doc_id"],
                             self.connection.timeout_s)
        return [row["doc_id"] for row in rows if row["row"] not in dead]

    def copy(self) -> MilvusStore:
        """A view of the same rows whose writes go to write-sets of its own; this view's next write
        opens a new write-set, so neither sees what the other writes afterwards."""
        self._open = None
        return type(self)(self.connection, base=self.visible, _dead=set(self._removed()))

    # -- saving: references, not rows ----------------------------------------------------------
    def save_files(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / REFERENCE_FILE).write_text(json.dumps({**asdict(self.connection), "write_sets": self.visible}) + "\n")
        self._settle()

    @classmethod
    def load_files(cls, directory: Path) -> MilvusStore:
        reference = json.loads((Path(directory) / REFERENCE_FILE).read_text())
        store = cls(Connection(**{k: v for k, v in reference.items() if k != "write_sets"}), base=reference["write_sets"])
        open_collection(store.connection, str(directory))
        return store

    def save_delta_files(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / DELTA_FILE).write_text(json.dumps(
            {**asdict(self.connection), "from": self.base, "write_sets": self.written}) + "\n")
        self._settle()

    def apply_delta_files(self, directory: Path) -> None:
        delta = json.loads((directory / DELTA_FILE).read_text())
        if delta["collection"] != self.connection.collection or delta["from"] != self.visible:
            raise ValueError(f"{directory}: the delta was made from another version of {delta['collection']!r}")
        self.base, self._dead = self.visible + delta["write_sets"], None  # its tombstones are read again


@register_store
@dataclass
class MilvusSparseStore(MilvusStore):
    """Sparse rows over a vocabulary (SciPy CSR in, CSR out), searched exactly by inner product
    through Milvus's inverted index. Unlike the CSR store it returns only rows that share a
    dimension with the query: the others all score 0, a tie in any order, and Milvus leaves them
    out (so a search may return fewer than k)."""

    shape: ClassVar[str] = "sparse"
    vector_type: ClassVar[str] = "SPARSE_FLOAT_VECTOR"

    @staticmethod
    def _index_type(configured: str) -> str:
        return SPARSE_INDEX  # index.milvus.index_type names the dense index; sparse rows have one exact index

    @staticmethod
    def _converted(vectors) -> sp.csr_matrix:
        return sp.csr_matrix(vectors, dtype=np.float32)

    @staticmethod
    def _rows(vectors: sp.csr_matrix) -> list:
        return [{int(i): float(v) for i, v in zip(vectors.indices[a:b], vectors.data[a:b])}
                for a, b in zip(vectors.indptr[:-1], vectors.indptr[1:])]

    def add(self, vectors, doc_ids: list[str]) -> None:
        vectors = self._converted(vectors)
        empty = [d for d, n in zip(doc_ids, np.diff(vectors.indptr)) if n == 0]
        if empty:
            raise ValueError(f"{self.connection.where()}: documents with no nonzero weight (Milvus stores no empty "
                             f"sparse vector): {empty[:5]}")
        super().add(vectors, doc_ids)

    def _tombstone_vector(self) -> dict[int, float]:
        return {0: 1.0}  # never searched (the filter leaves tombstones out); Milvus refuses an empty one

    def _stacked(self, rows: list) -> sp.csr_matrix:
        lines = [i for i, row in enumerate(rows) for _ in row]
        columns = [int(column) for row in rows for column in row]
        values = [value for row in rows for value in row.values()]
        return sp.csr_matrix((values, (lines, columns)), shape=(len(rows), self.connection.dimension), dtype=np.float32)


def _create_collection(connection: Connection, vector_type: str, hnsw_m: int, ef_construction: int,
                       nlist: int) -> None:
    from pymilvus import DataType, MilvusClient

    client = connection.client
    with connection.calling("asking the server's version"):
        version = client.get_server_version(timeout=connection.timeout_s)
    if vector_type == "SPARSE_FLOAT_VECTOR" and _before_2_4(version):
        raise MilvusStoreError(f"{connection.where()}: sparse vectors (retriever kind svdr) need Milvus 2.4 or "
                               f"later; this server runs {version}")
    schema = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
    schema.add_field("row", DataType.INT64, is_primary=True)  # auto ids increase: row order is insertion order
    schema.add_field("doc_id", DataType.VARCHAR, max_length=ID_CHARS)
    schema.add_field("born", DataType.INT64)  # the write-set that wrote the row
    schema.add_field("removes", DataType.INT64)  # VECTOR_ROW, or the row a tombstone removes
    if vector_type == "SPARSE_FLOAT_VECTOR":
        schema.add_field("vector", DataType.SPARSE_FLOAT_VECTOR)  # no fixed width: the vocabulary is the dimension
    else:
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=connection.dimension)  # a tombstone's: zeros
    index = client.prepare_index_params()
    build = {"HNSW": {"M": hnsw_m, "efConstruction": ef_construction}, "IVF_FLAT": {"nlist": nlist}}
    index.add_index(field_name="vector", index_type=connection.index_type, metric_type="IP",
                    params=build.get(connection.index_type, {}))
    for scalar, index_type in _scalar_indexes(version).items():  # filters are answered from these, not row by row
        index.add_index(field_name=scalar, index_type=index_type)
    with connection.calling("creating the collection"):
        client.create_collection(connection.collection, schema=schema, index_params=index, consistency_level="Strong",
                                 timeout=connection.timeout_s)


def open_collection(connection: Connection, referrer: str) -> None:
    """Check that the collection exists and load it if the server holds it released (a restarted
    server does); ``referrer`` is named in the error (what refers to the collection)."""
    from pymilvus.client.types import LoadState

    client, name, timeout = connection.client, connection.collection, connection.timeout_s
    with connection.calling("opening the collection"):
        if not client.has_collection(name, timeout=timeout):
            raise MilvusStoreError(f"{connection.where()}: the collection does not exist (dropped, or another "
                                   f"server); {referrer} refers to it")
        if client.get_load_state(name, timeout=timeout)["state"] != LoadState.Loaded:
            client.load_collection(name, timeout=timeout)


def _wait_for_index(connection: Connection, rows: int) -> None:
    """Until the vector index covers ``rows`` rows, as long as it grows at least once every
    ``timeout_s``. A Milvus server builds it after the flush, in the background, and meanwhile
    searches the rows not in it without it: at 100k rows on 2 cores, HNSW searches had a p50 / p99
    of 39 / 248 ms before it was built and 21 / 38 ms after (benchmarks/results/scale/). Milvus Lite
    builds it in the flush. An index that stops growing is left to the server, with a warning:
    the collection answers exactly meanwhile, only slower."""
    covered, since = -1, time.monotonic()
    while True:
        with connection.calling("waiting for the vector index"):
            index = connection.client.describe_index(connection.collection, "vector", timeout=connection.timeout_s)
        indexed = index.get("indexed_rows", rows)
        if indexed >= rows and not index.get("pending_index_rows", 0):
            return
        if indexed > covered:
            covered, since = indexed, time.monotonic()
        elif time.monotonic() - since > connection.timeout_s:
            log.warning("%s: the vector index covers %d of %d rows and has not grown for %g s (index.milvus.timeout_s); "
                        "going on: the server searches the other rows without it until it has built it",
                        connection.where(), indexed, rows, connection.timeout_s)
            return
        time.sleep(0.2)


def _before_2_4(version: str) -> bool:
    """Whether a server version (``get_server_version``: ``v2.3.5``, ``milvus_lite-3.2.2``, ...)
    is a Milvus server older than 2.4, which has neither INVERTED scalar indexes nor sparse vectors."""
    return re.match(r"v?2\.[0-3]\.", version) is not None


def _scalar_indexes(version: str) -> dict[str, str]:
    """The scalar index of each filtered field: INVERTED (Milvus 2.4 and later, Milvus Lite), or
    on a Milvus 2.3 server a sorted one for the numbers and a trie for the ids."""
    if _before_2_4(version):
        return {"born": "STL_SORT", "removes": "STL_SORT", "doc_id": "Trie"}
    return {"born": "INVERTED", "removes": "INVERTED", "doc_id": "INVERTED"}


def collection_age(name: str) -> float:
    """Seconds since the collection ``<prefix>_<UTC time>_<random>`` was created (from its name)."""
    stamp = name.rsplit("_", 2)[-2]
    return time.time() - calendar.timegm(time.strptime(stamp, "%Y%m%d%H%M%S"))


def sweep(uri: str, referenced: dict[str, set[int]], prefix: str, grace_s: float, token: str | None = None,
          timeout_s: float = 30.0, dry_run: bool = False) -> dict:
    """Delete what no version refers to, at ``uri``: collections named ``<prefix>_...`` that no
    version lists (with their commit logs), and rows (vectors and tombstones) of write-sets none lists.
    ``referenced`` maps each collection to every write-set any version that may be served lists;
    anything younger than ``grace_s`` stays (a training or an update may not be registered yet).
    ``dry_run``: count what would go, change nothing."""
    uri = resolve_uri(uri)
    client = _client(uri, token, timeout_s)
    pattern = re.compile(rf"^{re.escape(prefix)}_\d{{14}}_[0-9a-f]{{6}}$")
    dropped, deleted = [], 0
    # a lineage's commit log before the lineage: a stop between the two drops leaves the lineage, which the
    # next sweep drops, never a log no sweep would find (a log whose lineage is gone goes too)
    for name in sorted(client.list_collections(timeout=timeout_s), key=lambda n: (not n.endswith(COMMIT_LOG_SUFFIX), n)):
        lineage = name.removesuffix(COMMIT_LOG_SUFFIX)
        if not pattern.match(lineage):
            continue
        connection = Connection(uri=uri, collection=name, dimension=0, timeout_s=timeout_s, token=token)
        if lineage not in referenced:
            if collection_age(lineage) > grace_s:
                if not dry_run:
                    with connection.calling("dropping the collection"):
                        client.drop_collection(name, timeout=timeout_s)
                dropped.append(name)
        elif name == lineage:  # a log's rows are a few per update, kept for the lineage's life
            deleted += _unreferenced(connection, referenced[name], grace_s, dry_run)
    return {"collections_dropped": dropped, "rows_deleted": deleted}


def _unreferenced(connection: Connection, kept: set[int], grace_s: float, dry_run: bool) -> int:
    """Delete the rows (vectors and tombstones) of ``connection``'s collection born in write-sets
    outside ``kept`` and older than ``grace_s``; how many."""
    client, name, timeout_s = connection.client, connection.collection, connection.timeout_s
    with connection.calling("listing write-sets"):
        rows = all_rows(client, name, "", ["row", "born"], timeout_s)
    orphans = [r["row"] for r in rows if r["born"] not in kept and write_set_age(r["born"]) > grace_s]
    if orphans and not dry_run:
        with connection.calling(f"deleting {len(orphans)} rows"):
            client.delete(name, ids=orphans, timeout=timeout_s)
    return len(orphans)


def all_rows(client: MilvusClient, collection: str, expression: str, fields: list[str], timeout_s: float) -> list[dict]:
    rows = client.query_iterator(collection, batch_size=16384, filter=expression, output_fields=fields,
                                 timeout=timeout_s)
    found = []
    while batch := rows.next():
        found += batch
    rows.close()
    return sorted(found, key=lambda row: row["row"])


def references_in(directory: Path) -> list[dict]:
    """Every collection a saved retriever (whole or delta) under ``directory`` refers to, with the
    write-sets it lists there: what registration tags and ``fresh-registry gc`` keeps."""
    found = []
    for file in sorted(Path(directory).rglob("milvus*.json")):
        saved = json.loads(file.read_text())
        found.append({"uri": saved["uri"], "collection": saved["collection"], "write_sets": saved["write_sets"],
                      "token": saved.get("token"), "timeout_s": saved.get("timeout_s", 30.0)})
    return found


def point_alias(uri: str, collection: str, alias: str, token: str | None = None, timeout_s: float = 30.0) -> None:
    """Point the Milvus alias ``alias`` at ``collection`` in one step (created on first use): what a
    client reading Milvus directly follows when a deployment's champion moves to another lineage."""
    uri = resolve_uri(uri)
    client = _client(uri, token, timeout_s)
    connection = Connection(uri=uri, collection=collection, dimension=0, timeout_s=timeout_s, token=token)
    with connection.calling(f"pointing alias {alias!r} at it"):
        if alias in client.list_aliases(timeout=timeout_s).get("aliases", []):
            client.alter_alias(collection, alias, timeout=timeout_s)
        else:
            client.create_alias(collection, alias, timeout=timeout_s)
