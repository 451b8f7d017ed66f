"""Documents as rows of a SciPy CSR matrix over the vocabulary, with their id map, searched by
inner product (SVDR §3.6: a sparse matrix, not an inverted index).

Two uses in kind ``svdr``: the *binary bag-of-tokens index* T(D), 1 where a token occurs in the
document (``bag_of_tokens``: the tokenizer alone, no model), and the sparse *embedding index* of
the encoder's document vectors. Rows are never renumbered: ``add`` appends rows, ``remove`` masks
them, so both are cheap and a removed document can come back as a new row. For the same reason a
change is small to store: ``save_delta`` writes the rows added and the rows removed since load,
``apply_delta`` replays them onto that starting index.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp
from tokenizers import Tokenizer
from tqdm.auto import tqdm

CHUNK = 4096  # texts per tokenizer call: the fast tokenizer spreads one call over every core


def bag_of_tokens(tokenizer, texts: list[str], max_length: int, vocab_start: int, vocab_size: int,
                  desc: str | None = None) -> sp.csr_matrix:
    """(len(texts), vocab_size) binary float32 CSR: T(x)[i] = 1 iff token ``vocab_start + i``
    occurs in ``x`` cut to ``max_length`` tokens as the encoder cuts it (special tokens and ids
    below ``vocab_start`` never count). Batched through the Rust tokenizer and NumPy; no Python
    loop per document beyond cutting each text to its first words (``word_prefixes``) and taking
    each text's id list."""
    backend = truncating_backend(tokenizer, max_length)
    special = np.array(tokenizer.all_special_ids)
    cut = cuts_at_words(tokenizer)
    rows, columns = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]

    def pairs(chunk: list[str], offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        token_lists = [encoding.ids for encoding in backend.encode_batch_fast(chunk)]
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        ids = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=int(lengths.sum()))
        documents = np.repeat(np.arange(len(chunk)), lengths)
        keep = (ids >= vocab_start) & (ids < vocab_start + vocab_size) & ~np.isin(ids, special)
        return offsets[documents[keep]], ids[keep] - vocab_start, lengths

    chunks = range(0, len(texts), CHUNK)
    for start in tqdm(chunks, desc=desc or "tokenising", unit="chunk", disable=desc is None):
        chunk = texts[start : start + CHUNK]
        offsets = np.arange(start, start + len(chunk))
        if not cut:
            found, tokens, _ = pairs(chunk, offsets)
            rows.append(found)
            columns.append(tokens)
            continue
        prefixes = word_prefixes(chunk, max_length)
        found, tokens, lengths = pairs(prefixes, offsets)
        # a cut text whose prefix did not fill max_length tokens may owe tokens to its later words
        redo = np.array([i for i, (a, b) in enumerate(zip(prefixes, chunk)) if len(a) < len(b) and lengths[i] < max_length],
                        dtype=np.int64)
        if len(redo):
            kept = ~np.isin(found, redo + start)
            found, tokens = found[kept], tokens[kept]
            again, again_tokens, _ = pairs([chunk[i] for i in redo], redo + start)
            found, tokens = np.concatenate([found, again]), np.concatenate([tokens, again_tokens])
        rows.append(found)
        columns.append(tokens)
    rows, columns = np.concatenate(rows), np.concatenate(columns)
    matrix = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, columns)), shape=(len(texts), vocab_size))
    matrix.data[:] = 1.0  # a repeated token was summed when the duplicates merged: binary, not term frequency
    return matrix


@functools.lru_cache(maxsize=8)
def truncating_backend(tokenizer, max_length: int):
    """A copy of ``tokenizer``'s Rust tokenizer that cuts at ``max_length`` tokens (special tokens
    included, as the encoder cuts) and pads nothing. Its batch encoding without offsets
    (``encode_batch_fast``), read straight into NumPy, is about 1.3x faster than the tokenizer's
    ``__call__`` with padded arrays; a copy, because the encoder's own calls reset the shared one."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(f"the binary token index needs a tokenizer with a Rust backend (a transformers fast "
                         f"tokenizer); {type(tokenizer).__name__} has none")
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.enable_truncation(max_length, direction=tokenizer.truncation_side)
    backend.no_padding()
    return backend


def cuts_at_words(tokenizer) -> bool:
    """Whether a text may be cut after whitespace before tokenising without changing its first
    tokens: BERT's normaliser and pre-tokeniser work character by character and split at
    whitespace, so the tokens of a text's first words are the first tokens of the text (truncated
    on the right). Other tokenizers are given whole texts."""
    backend = tokenizer.backend_tokenizer
    return (type(backend.pre_tokenizer).__name__ == "BertPreTokenizer"
            and type(backend.normalizer).__name__ == "BertNormalizer" and tokenizer.truncation_side == "right")


@functools.lru_cache(maxsize=8)
def _first_words(words: int) -> re.Pattern:
    # possessive: a text with fewer words fails at once instead of backtracking through every way of
    # splitting its whitespace runs
    return re.compile(rf"[ \t\n\r]*+(?:[^ \t\n\r]++[ \t\n\r]++){{{words}}}")


def word_prefixes(texts: list[str], max_length: int) -> list[str]:
    """Each text cut after its first ``max_length`` ASCII-whitespace-separated words (whole when
    shorter). Every word gives at least one token, save words the normaliser empties: those are
    the rare texts whose prefix falls short of ``max_length`` tokens, which ``bag_of_tokens``
    tokenises again whole. SciFact abstracts average 215 words: at 64 tokens this tokenises about a
    third of the text."""
    pattern = _first_words(max_length)
    out = []
    for text in texts:
        found = pattern.match(text)
        out.append(text[: found.end()] if found else text)
    return out


@dataclass
class SparseIndex:
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
    def build(cls, matrix: sp.csr_matrix, doc_ids: list[str]) -> SparseIndex:
        return cls(matrix.tocsr(), list(doc_ids), np.ones(len(doc_ids), dtype=bool))

    def live_ids(self) -> list[str]:
        return [d for d, alive in zip(self.doc_ids, self.live) if alive]

    def _live(self) -> dict[str, int]:
        """Live document id -> row: an addition or removal looks up its own ids only, not every row."""
        if self._live_rows is None:
            self._live_rows = {d: i for i, (d, alive) in enumerate(zip(self.doc_ids, self.live)) if alive}
        return self._live_rows

    def add(self, matrix: sp.csr_matrix, doc_ids: list[str]) -> None:
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

    def search(self, queries: sp.csr_matrix, k: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` inner products and row numbers per query row, best first (ties: lower row
        first), over live rows only; ``k`` is cut to the number of live rows."""
        k = min(k, int(self.live.sum()))
        scores, rows = np.empty((queries.shape[0], k), dtype=np.float32), np.empty((queries.shape[0], k), dtype=np.int64)
        for start in range(0, queries.shape[0], chunk):
            dense = (queries[start : start + chunk] @ self.matrix.T).toarray()
            dense[:, ~self.live] = -np.inf
            order = np.argsort(-dense, axis=1, kind="stable")[:, :k]
            rows[start : start + chunk] = order
            scores[start : start + chunk] = np.take_along_axis(dense, order, axis=1)
        return scores, rows

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        sp.save_npz(directory / "matrix.npz", self.matrix)
        pd.DataFrame({"doc_id": self.doc_ids, "live": self.live}).to_parquet(directory / "rows.parquet", index=False)

    @classmethod
    def load(cls, directory: Path) -> SparseIndex:
        rows = pd.read_parquet(directory / "rows.parquet")
        return cls(sp.load_npz(directory / "matrix.npz").tocsr(), rows["doc_id"].tolist(), rows["live"].to_numpy(bool))

    def save_delta(self, directory: Path) -> None:
        """The rows added since load (as an index of their own) and the earlier rows removed."""
        new = slice(self.loaded_rows, None)
        SparseIndex(self.matrix[new], self.doc_ids[new], self.live[new]).save(directory)
        (directory / "delta.json").write_text(json.dumps({"first_row": self.loaded_rows, "removed_rows": self._removed}))

    def apply_delta(self, directory: Path) -> None:
        """Replay a delta written by ``save_delta`` on the index it was made from."""
        delta, added = json.loads((directory / "delta.json").read_text()), SparseIndex.load(directory)
        if delta["first_row"] != len(self.doc_ids):
            raise ValueError(f"{directory}: the delta starts at row {delta['first_row']} but this index has "
                             f"{len(self.doc_ids)} rows; it was made from another version")
        self.matrix = sp.vstack([self.matrix, added.matrix], format="csr")
        self.doc_ids.extend(added.doc_ids)
        self.live = np.concatenate([self.live, added.live])
        self.live[delta["removed_rows"]] = False
        self.loaded_rows, self._removed, self._live_rows = len(self.doc_ids), [], None
