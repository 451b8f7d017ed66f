"""`retrievers/neural.py`: retriever versions of one lineage share one loaded encoder (a freshness-loop run loads three
versions), an encoder saved again is loaded again, and one nothing holds is freed."""

import gc
import os
import shutil
import weakref

import numpy as np

from model_code.retrievers.neural import EncoderHandle

SETTINGS = {"pooling": "mean", "max_query_length": 16, "max_passage_length": 32, "batch_size": 4,
            "shared_encoder": True}


def test_handles_on_one_saved_encoder_share_it_until_it_is_saved_again_or_released(tmp_path, tiny_model_dir):
    directory = tmp_path / "encoder"
    shutil.copytree(tiny_model_dir, directory)
    first, second = EncoderHandle(directory, SETTINGS), EncoderHandle(tmp_path / "." / "encoder", SETTINGS)
    assert first.model is second.model
    vectors = first.embed_texts(["a comet crossed the nebula"])

    weights = next(directory.glob("*.safetensors"))
    stamp = weights.stat().st_mtime_ns + 1_000_000_000
    os.utime(weights, ns=(stamp, stamp))  # saved again
    third = EncoderHandle(directory, SETTINGS)
    assert third.model is not first.model
    np.testing.assert_allclose(third.embed_texts(["a comet crossed the nebula"]), vectors, rtol=1e-5, atol=1e-6)

    released = weakref.ref(first.model)
    del first, second
    gc.collect()
    assert released() is None  # nothing holds the older load: freed
