"""Every text encoded once: vectors an encoder already made, kept on disk by what made them.

A vector is keyed by the encoder's weights (a hash of its state, so a trained encoder, a copy of
one or the same model loaded from another path are told apart or matched by what they compute),
its pooling, the precision it runs in (bf16 autocast on CUDA, fp32 elsewhere), the side (query or
passage), the token length, the layers (MLR) and the text's hash.
The cluster, mining and index stages of a run, and a later run with the same encoder, then encode
each document once: an untrained pipeline used to encode the whole corpus two or three times.

On disk (``Layout.embedding_cache``): ``<encoder>/<side>-<length>[-layers]/`` holds chunks, each a
``.vectors.npy`` and a ``.keys.npy`` written to temporary names and renamed, keys last: a reader
uses only chunks whose keys exist, so a killed writer leaves nothing half-read (and what it finished: a pass
writes a chunk every ``WRITE_EVERY`` texts), and two writers
(two stages, two run workers) add chunks of their own (a text encoded by both is stored twice and
read once). Two processes asking for the same texts at once (the cluster and mining stages, run in
parallel by Dagster) take turns: the second waits, then reads what the first stored. A new encoder gets a new folder: each full training writes the corpus's vectors again
(1.5 GB per million documents at 384 dimensions), so when an encoder's folder is made, the folders
of encoders unused (neither read nor written) for ``KEEP_UNUSED_DAYS`` are deleted. Deleting a
folder loses nothing but time: what it held is encoded again when asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from model_code.io import exclusive_lock
from model_code.models.encoder import Encoder, precision

log = logging.getLogger(__name__)

_KEYS, _VECTORS = ".keys.npy", ".vectors.npy"
_KEY_TYPE = "S40"  # a text's key: the hex SHA-1 of its UTF-8 bytes
WRITE_EVERY = 2048  # texts per chunk written while a pass runs: a pass killed after the first chunks keeps them
KEEP_UNUSED_DAYS = 30  # an encoder's vectors unused this long go when another encoder's folder is made


def encoder_fingerprint(encoder: Encoder) -> str:
    """A hash of what ``encoder`` computes: every weight (both sides of an untied encoder), the
    pooling and the tokenizer's vocabulary size and class. Computed from the weights in memory,
    so it changes as training changes them."""
    digest = hashlib.sha256(f"{encoder.pooling}|{type(encoder.tokenizer).__name__}|{len(encoder.tokenizer)}".encode())
    for name, tensor in encoder.state_dict().items():
        # float32 as before dtypes were named: an upgrade keeps every fingerprint, and so the vectors of its cache
        digest.update((name if tensor.dtype == torch.float32 else f"{name}|{tensor.dtype}").encode())
        # the raw bytes, whatever the dtype (NumPy has no bfloat16, in which many models are saved)
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


def encoder_key(encoder: Encoder) -> str:
    """The name of ``encoder``'s folder: its fingerprint, and the precision where it is not fp32
    (bf16 vectors differ from fp32 ones; fp32 keeps the bare fingerprint the cache had before)."""
    computed_in = precision(encoder.device)
    return encoder_fingerprint(encoder) + ("" if computed_in == "fp32" else f"-{computed_in}")


def _text_key(text: str) -> bytes:
    """Hex, not the raw digest: NumPy's bytes arrays drop trailing zero bytes."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest().encode()


class EmbeddingCache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.encoded = 0  # texts this object had the encoder encode (the rest came from disk)

    def encode(self, encoder: Encoder, texts: list[str], max_length: int, batch_size: int = 64,
               desc: str | None = None, layers: list[int] | None = None, side: str = "passage") -> np.ndarray:
        """``encoder.encode(texts, ...)``, reading the vectors of texts encoded before with the
        same encoder, side, length and layers, and storing the rest."""
        if not texts:
            return encoder.encode([], max_length, batch_size, layers=layers, side=side)
        encoder_folder = self.root / encoder_key(encoder)
        if encoder_folder.is_dir():
            with contextlib.suppress(OSError):  # a read-only cache is read all the same (and never pruned)
                os.utime(encoder_folder)  # used now: what prune_unused goes by
        else:
            encoder_folder.mkdir(parents=True, exist_ok=True)
            prune_unused(self.root, KEEP_UNUSED_DAYS)
        folder = encoder_folder / (f"{side}-{max_length}" + (f"-layers-{'-'.join(map(str, layers))}" if layers else ""))
        unique, inverse = np.unique(np.array([_text_key(text) for text in texts], dtype=_KEY_TYPE), return_inverse=True)
        vectors, found = _read(folder, unique)
        if found.all():
            return vectors[inverse]
        request = hashlib.sha1(unique.tobytes()).hexdigest()[:16]  # the same texts asked for elsewhere share the lock
        with exclusive_lock(folder / f".encoding-{request}.lock",
                            waiting=f"{desc or 'encoding'}: waiting for another process encoding the same texts"):
            vectors, found = _read(folder, unique)  # what that process stored meanwhile
            missing = np.flatnonzero(~found)
            first = np.full(len(unique), len(texts))
            np.minimum.at(first, inverse, np.arange(len(texts)))
            missing = missing[np.argsort(first[missing], kind="stable")]  # in the order the texts come
            with tqdm(total=len(missing), desc=desc or "encoding", unit="doc",
                      disable=desc is None or len(missing) <= batch_size) as bar:
                for start in range(0, len(missing), WRITE_EVERY):  # a chunk on disk per part: a killed pass resumes
                    part = missing[start:start + WRITE_EVERY]
                    encoded = encoder.encode([texts[i] for i in first[part]], max_length, batch_size, layers=layers,
                                             side=side, progress=bar)
                    self.encoded += len(part)
                    _write(folder, unique[part], encoded)
                    if vectors is None:
                        vectors = np.empty((len(unique), *encoded.shape[1:]), dtype=np.float32)
                    vectors[part] = encoded
        return vectors[inverse]


def prune_unused(root: Path, days: float) -> list[str]:
    """Delete the encoder folders under ``root`` unused for more than ``days``; their names."""
    cutoff, pruned = time.time() - days * 86400, []
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and folder.stat().st_mtime < cutoff:
            shutil.rmtree(folder, ignore_errors=True)
            pruned.append(folder.name)
    if pruned:
        log.info("embedding cache: deleted the vectors of %d encoder(s) unused for %g days: %s", len(pruned), days,
                 ", ".join(pruned))
    return pruned


def _read(folder: Path, wanted: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The stored vectors of the sorted, distinct text keys ``wanted`` (None when none is stored)
    and which were found. Each chunk's keys are looked up in ``wanted``, and only the rows found
    are read from its memory-mapped vectors: a call costs the keys of the folder and the vectors
    asked for, not every vector the folder holds."""
    vectors, found = None, np.zeros(len(wanted), dtype=bool)
    if not folder.is_dir():
        return vectors, found
    for keys_file in sorted(folder.glob(f"*{_KEYS}")):
        try:  # a file deleted meanwhile (an unused encoder's folder pruned) holds nothing
            keys = np.load(keys_file)
            at = np.minimum(np.searchsorted(wanted, keys), len(wanted) - 1)
            rows = np.flatnonzero((wanted[at] == keys) & ~found[at])  # a text stored by two writers: read once
            if not len(rows):
                continue
            stored = np.load(folder / f"{keys_file.name.removesuffix(_KEYS)}{_VECTORS}", mmap_mode="r")
        except FileNotFoundError:
            continue
        if vectors is None:
            vectors = np.empty((len(wanted), *stored.shape[1:]), dtype=np.float32)
        vectors[at[rows]] = stored[rows]
        found[at[rows]] = True
    return vectors, found


def _write(folder: Path, keys: np.ndarray, vectors: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    chunk = f"chunk-{uuid.uuid4().hex}"
    for suffix, array in ((_VECTORS, np.ascontiguousarray(vectors, dtype=np.float32)),
                          (_KEYS, np.asarray(keys, dtype=_KEY_TYPE))):  # the keys file commits the chunk: written last
        temporary = folder / f".{chunk}{suffix}.part"
        with temporary.open("wb") as out:
            np.save(out, array)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, folder / f"{chunk}{suffix}")
