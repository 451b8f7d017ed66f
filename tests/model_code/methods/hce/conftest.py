"""The small case of the HCE loss and objective tests."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import CorpusTree


@pytest.fixture
def small():
    """Six documents in two leaf clusters {0,1,2}, {3,4,5} under one root; a batch of three pairs
    whose positives are documents 0, 3 and 4, each with two sampled negatives (one masked)."""
    g = torch.Generator().manual_seed(0)
    tree = CorpusTree(doc_ids=[f"d{i}" for i in range(6)], doc_path=np.array([[0], [0], [0], [1], [1], [1]]),
                      centroids=[np.array([[1.0, 0.5, 0.0], [-0.5, 1.0, 2.0]], dtype=np.float32)],
                      parents=[np.array([0, 0])])
    q = F.normalize(torch.randn(3, 3, generator=g, dtype=torch.float64), dim=-1)
    p = F.normalize(torch.randn(3, 3, generator=g, dtype=torch.float64), dim=-1)
    negatives = F.normalize(torch.randn(3, 2, 2, 3, generator=g, dtype=torch.float64), dim=-1)  # (B, levels, k, d)
    mask = torch.tensor([[[True, True], [True, False]], [[False, True], [True, True]], [[True, True], [True, True]]])
    return tree, q, p, torch.tensor([0, 3, 4]), negatives, mask
