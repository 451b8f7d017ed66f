"""Every text encoded once: vectors an encoder already made, kept on disk by what made them.

A vector is keyed by the encoder's weights (a hash of its state, so a trained encoder, a copy of
one or the same model loaded from another path are told apart or matched by what they compute),
its pooling, the side (query or passage), the token length, the layers (MLR) and the text's hash.
The cluster, mining and index stages of a run, and a later run with the same encoder, then encode
each document once: an untrained pipeline used to encode the whole corpus two or three times.

On disk (``Layout.embedding_cache``): ``<encoder>/<side>-<length>[-layers]/`` holds chunks, each a
``.vectors.npy`` and a ``.keys.npy`` written to temporary names and renamed, keys last: a reader
uses only chunks whose keys exist, so a killed writer leaves nothing half-read (and what it finished: a pass
writes a chunk every ``WRITE_EVERY`` texts), and two writers
(two stages, two run workers) add chunks of their own (a text encoded by both is stored twice and
read once). A new encoder gets a new folder; delete the folder to reclaim the space.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from model_code.models.encoder import Encoder

_KEYS, _VECTORS = ".keys.npy", ".vectors.npy"
WRITE_EVERY = 2048  # texts per chunk written while a pass runs: a pass killed after the first chunks keeps them


def encoder_fingerprint(encoder: Encoder) -> str:
    """A hash of what ``encoder`` computes: every weight (both sides of an untied encoder), the
    pooling and the tokenizer's vocabulary size and class. Computed from the weights in memory,
    so it changes as training changes them."""
    digest = hashlib.sha256(f"{encoder.pooling}|{type(encoder.tokenizer).__name__}|{len(encoder.tokenizer)}".encode())
    for name, tensor in encoder.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    return digest.hexdigest()[:24]


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
        folder = self.root / encoder_fingerprint(encoder) / (
            f"{side}-{max_length}" + (f"-layers-{'-'.join(map(str, layers))}" if layers else ""))
        keys = [_text_key(text) for text in texts]
        stored = _read(folder)
        missing = list(dict.fromkeys(key for key in keys if key not in stored))  # first occurrence order
        if missing:
            first = {key: i for i, key in reversed(list(enumerate(keys)))}
            todo = [texts[first[key]] for key in missing]
            with tqdm(total=len(todo), desc=desc or "encoding", unit="doc",
                      disable=desc is None or len(todo) <= batch_size) as bar:
                for start in range(0, len(todo), WRITE_EVERY):  # a chunk on disk per part: a killed pass resumes
                    part = missing[start:start + WRITE_EVERY]
                    vectors = encoder.encode(todo[start:start + WRITE_EVERY], max_length, batch_size, layers=layers,
                                             side=side, progress=bar)
                    self.encoded += len(part)
                    _write(folder, part, vectors)
                    stored.update(zip(part, vectors))
        return np.stack([stored[key] for key in keys]).astype(np.float32, copy=False)


def _read(folder: Path) -> dict[bytes, np.ndarray]:
    """Every stored vector of ``folder``, by text key (memory-mapped: only rows used are read)."""
    stored: dict[bytes, np.ndarray] = {}
    if not folder.is_dir():
        return stored
    for keys_file in sorted(folder.glob(f"*{_KEYS}")):
        chunk = keys_file.name.removesuffix(_KEYS)
        vectors = np.load(folder / f"{chunk}{_VECTORS}", mmap_mode="r")
        for key, row in zip(np.load(keys_file), vectors):
            stored.setdefault(bytes(key), row)
    return stored


def _write(folder: Path, keys: list[bytes], vectors: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    chunk = f"chunk-{uuid.uuid4().hex}"
    for suffix, array in ((_VECTORS, np.ascontiguousarray(vectors, dtype=np.float32)),
                          (_KEYS, np.array(keys, dtype="S40"))):  # the keys file commits the chunk: written last
        temporary = folder / f".{chunk}{suffix}.part"
        with temporary.open("wb") as out:
            np.save(out, array)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, folder / f"{chunk}{suffix}")
