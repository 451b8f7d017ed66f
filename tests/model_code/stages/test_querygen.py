"""Pseudo-queries (``model_code/stages/querygen.py``): inverse cloze task spans are contiguous, seeded and sized."""

import numpy as np

from model_code.stages.querygen import ict_spans


def test_ict_spans_are_contiguous_seeded_and_sized():
    text = " ".join(f"w{i}" for i in range(100))
    spans = ict_spans(text, 10, 3, np.random.default_rng(1))
    assert spans == ict_spans(text, 10, 3, np.random.default_rng(1))
    for span in spans:
        words = span.split()
        start = int(words[0][1:])
        assert words == [f"w{i}" for i in range(start, start + 10)]
    assert ict_spans("short text", 10, 2, np.random.default_rng(1)) == ["short text", "short text"]
