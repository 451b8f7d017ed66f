"""``models/embedding_cache.py``: vectors read back equal a fresh encoding, each text is encoded
once per encoder, side, length and layers, a changed encoder misses, a half-written chunk is
ignored; and an untrained pipeline encodes each document once (counted at the encoder)."""

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from model_code.data.ingested import load_ingested
from model_code.models.embedding_cache import EmbeddingCache, encoder_fingerprint
from model_code.models.encoder import Encoder
from tests.conftest import run_stages, tiny_params

TEXTS = ["a comet crossed the nebula", "simmer the butter", "a comet crossed the nebula", "stocks fell"]


@pytest.fixture
def encoder(tiny_model_dir):
    return Encoder(str(tiny_model_dir), device=torch.device("cpu"))


def test_read_back_vectors_equal_a_fresh_encoding_and_each_text_is_encoded_once(tmp_path, encoder):
    cache = EmbeddingCache(tmp_path)
    first = cache.encode(encoder, TEXTS, 16, 2)
    assert cache.encoded == 3  # the repeated text once
    np.testing.assert_allclose(first, encoder.encode(TEXTS, 16, 2), rtol=1e-5, atol=1e-6)

    again = EmbeddingCache(tmp_path)  # another process, later: everything read from disk
    np.testing.assert_array_equal(again.encode(encoder, TEXTS[::-1], 16, 2), first[::-1])
    assert again.encoded == 0
    again.encode(encoder, TEXTS + ["a new text"], 16, 2)
    assert again.encoded == 1

    for other in ({"max_length": 8}, {"side": "query"}, {"layers": [1, 2]}):  # each its own key
        fresh = EmbeddingCache(tmp_path)
        arguments = {"max_length": 16, **other}
        np.testing.assert_allclose(fresh.encode(encoder, TEXTS[:2], batch_size=2, **arguments),
                                   encoder.encode(TEXTS[:2], batch_size=2, **arguments), rtol=1e-5, atol=1e-6)
        assert fresh.encoded == 2


def test_a_changed_encoder_misses_and_a_chunk_without_keys_is_ignored(tmp_path, encoder):
    EmbeddingCache(tmp_path).encode(encoder, TEXTS, 16, 2)
    before = encoder_fingerprint(encoder)
    with torch.no_grad():
        next(encoder.parameters()).add_(0.01)  # a training step's worth of change
    assert encoder_fingerprint(encoder) != before
    changed = EmbeddingCache(tmp_path)
    np.testing.assert_allclose(changed.encode(encoder, TEXTS, 16, 2), encoder.encode(TEXTS, 16, 2), rtol=1e-5, atol=1e-6)
    assert changed.encoded == 3

    [folder] = (tmp_path / encoder_fingerprint(encoder)).iterdir()
    for keys in folder.glob("*.keys.npy"):
        keys.unlink()  # a writer killed between its two files
    reread = EmbeddingCache(tmp_path)
    reread.encode(encoder, TEXTS, 16, 2)
    assert reread.encoded == 3


def test_a_chunk_is_committed_by_its_keys_file_written_last(tmp_path, encoder, monkeypatch):
    """A writer killed between its two renames leaves vectors without keys, which no reader
    takes; keys without vectors would make every later read fail."""
    import model_code.models.embedding_cache as cache_module

    replace, renamed = os.replace, []

    def killed_after_the_first(source, target):
        if renamed:
            raise KeyboardInterrupt("killed")
        renamed.append(target)
        replace(source, target)

    monkeypatch.setattr(cache_module.os, "replace", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        EmbeddingCache(tmp_path).encode(encoder, TEXTS, 16, 2)
    monkeypatch.setattr(cache_module.os, "replace", replace)
    after = EmbeddingCache(tmp_path)
    np.testing.assert_allclose(after.encode(encoder, TEXTS, 16, 2), encoder.encode(TEXTS, 16, 2), rtol=1e-5, atol=1e-6)
    assert after.encoded == 3


def test_a_read_loads_only_the_chunks_holding_what_it_asks_for(tmp_path, encoder, monkeypatch):
    """A folder's vectors are never all read into memory: a corpus's cache is gigabytes."""
    EmbeddingCache(tmp_path).encode(encoder, TEXTS[:2], 16, 2)
    EmbeddingCache(tmp_path).encode(encoder, ["stocks fell"], 16, 2)
    load, opened = np.load, []

    def recording(file, *args, **kwargs):
        opened.append(Path(file).name.split(".")[1])
        return load(file, *args, **kwargs)

    monkeypatch.setattr(np, "load", recording)
    again = EmbeddingCache(tmp_path)
    np.testing.assert_allclose(again.encode(encoder, ["stocks fell"], 16, 2), encoder.encode(["stocks fell"], 16, 2),
                               rtol=1e-5, atol=1e-6)
    assert again.encoded == 0 and sorted(opened) == ["keys", "keys", "vectors"]


def test_a_bfloat16_encoder_has_a_fingerprint_of_its_own(tmp_path, encoder):
    """Before: hashing went through NumPy, which has no bfloat16, and every stage failed for a
    model saved in it. A float32 encoder keeps the fingerprint it had (hashed here as before), so
    an upgrade reads the cache it wrote instead of encoding the corpus again."""
    import hashlib

    before = encoder_fingerprint(encoder)
    digest = hashlib.sha256(f"{encoder.pooling}|{type(encoder.tokenizer).__name__}|{len(encoder.tokenizer)}".encode())
    for name, tensor in encoder.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    assert before == digest.hexdigest()[:24]
    encoder.to(torch.bfloat16)
    assert encoder_fingerprint(encoder) != before
    cache = EmbeddingCache(tmp_path)
    assert cache.encode(encoder, TEXTS, 16, 2).shape[0] == 4 and cache.encoded == 3


def test_vectors_computed_in_another_precision_are_never_served(tmp_path, encoder, monkeypatch):
    """On CUDA the encoder runs in bf16 autocast, whose vectors differ from fp32's in the third
    digit: a cache shared by a GPU and a CPU worker used to hand one's vectors to the other."""
    import model_code.models.embedding_cache as cache_module

    EmbeddingCache(tmp_path).encode(encoder, TEXTS, 16, 2)
    monkeypatch.setattr(cache_module, "precision", lambda device: "bf16-autocast")  # as on a CUDA device
    on_gpu = EmbeddingCache(tmp_path)
    on_gpu.encode(encoder, TEXTS, 16, 2)
    assert on_gpu.encoded == 3
    fingerprint = encoder_fingerprint(encoder)  # fp32 keeps the bare fingerprint: an upgrade keeps its cache
    assert sorted(p.name for p in tmp_path.iterdir()) == [fingerprint, f"{fingerprint}-bf16-autocast"]


def test_two_processes_asking_for_the_same_texts_at_once_encode_them_once(tmp_path, encoder, monkeypatch):
    """Dagster runs the cluster and mining stages side by side, and both encode the corpus with
    the base encoder: the second waits for the first and reads its vectors (counted at the encoder)."""
    import threading

    encode, calls, started = encoder.encode, [], threading.Event()

    def slow(texts, *args, **kwargs):
        calls.append(len(texts))
        started.set()
        time.sleep(0.5)  # the second asks while the first is encoding, before it stored anything
        return encode(texts, *args, **kwargs)

    monkeypatch.setattr(encoder, "encode", slow)
    caches, results = [EmbeddingCache(tmp_path), EmbeddingCache(tmp_path)], [None, None]

    def run(i):
        results[i] = caches[i].encode(encoder, TEXTS, 16, 2)

    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=run, args=(1,))
    second.start()
    first.join()
    second.join()
    assert calls == [3] and [cache.encoded for cache in caches] == [3, 0]
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_allclose(results[0], encode(TEXTS, 16, 2), rtol=1e-5, atol=1e-6)


def test_a_new_encoders_folder_deletes_those_of_encoders_unused_for_a_month(tmp_path, encoder):
    """Each full training writes the corpus's vectors again under its new encoder: without this
    the freshness loop's retrains filled the disk. A folder read again is in use, whatever its age."""
    EmbeddingCache(tmp_path).encode(encoder, TEXTS, 16, 2)
    old, recent = tmp_path / encoder_fingerprint(encoder), tmp_path / "recent"
    recent.mkdir()
    month_ago, days_ago = time.time() - 31 * 86400, time.time() - 10 * 86400
    os.utime(old, (month_ago, month_ago))
    os.utime(recent, (days_ago, days_ago))
    EmbeddingCache(tmp_path).encode(encoder, TEXTS[:1], 16, 2)  # read: in use again
    assert old.stat().st_mtime > time.time() - 60
    os.utime(old, (month_ago, month_ago))
    with torch.no_grad():
        next(encoder.parameters()).add_(0.01)  # a training's new encoder
    EmbeddingCache(tmp_path).encode(encoder, TEXTS, 16, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([encoder_fingerprint(encoder), "recent"])


@pytest.mark.parametrize("kind", ["dense", "incdsi"])
def test_an_untrained_pipeline_encodes_each_document_once(tmp_path, beir_dir, tiny_model_dir, monkeypatch, kind):
    """Cluster, dense hard-negative mining and index all need the corpus's vectors from the one
    base encoder (IncDSI's head build too): before the cache each encoded the whole corpus."""
    encoded: list[str] = []
    original = Encoder.encode

    def counting(self, texts, *args, side="passage", **kwargs):
        if side == "passage":
            encoded.extend(texts)
        return original(self, texts, *args, side=side, **kwargs)

    monkeypatch.setattr(Encoder, "encode", counting)
    params = tiny_params(beir_dir, tiny_model_dir, train={"enabled": False, "hard_negatives": 1,
                                                          "mining": {"source": "dense", "depth": 10}},
                         retriever={"kind": kind})
    layout = run_stages(tmp_path / "ws", params, "ingest", "querygen", "cluster", "mine-negatives", "train", "index")
    corpus = load_ingested(layout.ingested).passages()
    assert sorted(encoded) == sorted(corpus)  # every document's text, each once
    assert not pd.read_parquet(layout.hard_negatives / "negatives.parquet").empty  # mining did run on vectors
