"""MLR under torchrun: two gloo ranks, each encoding its half of the global batch (its documents'
layer vectors and its rows' mined hard negatives, gathered with gradients), give the one-process
loss and gradients of the whole batch, for the self-contrastive and the scalar-mix poolings. (The
one-process loss is checked against hand computations in tests/model_code/methods/mlr/test_training.py.)"""

import itertools

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model_code.methods.mlr.layer_mix import ScalarMix
from model_code.methods.mlr.objective import MLRObjective
from model_code.models.encoder import Encoder
from model_code.training.distributed import average_gradients
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import Stream
from model_code.training.pairs import with_positives

LAYERS = [2, 1]  # the tiny model's two layers, last first


def _global_batch() -> pd.DataFrame:
    """Four pairs; rows 0 and 2 share a query relevant to two documents that land on different ranks."""
    docs = ["astronomy-1", "cooking-2", "finance-3", "music-4"]
    queries = ["about astronomy-1", "about cooking-2", "about astronomy-1", "about music-4"]
    return with_positives(pd.DataFrame({"query": queries, "doc_id": docs}))


# mined pools: the shared query's pool holds one of its own relevant documents (never a negative of it)
MINED = pd.DataFrame({
    "query": ["about astronomy-1"] * 3 + ["about cooking-2"] * 2 + ["about music-4"] * 2,
    "doc_id": ["finance-3", "cooking-9", "astronomy-1", "music-7", "astronomy-5", "finance-8", "cooking-2"],
})


def _objective(model_dir, pooling: str):
    torch.manual_seed(0)
    encoder = Encoder(str(model_dir))
    encoder.eval()  # no dropout: every run must compute the same function
    mix = ScalarMix(LAYERS) if pooling == "scalar_mix" else None
    if mix is not None:
        with torch.no_grad():
            mix.logits.copy_(torch.tensor([0.3, -0.2]))  # away from uniform: the weights matter
    stream = Stream("supervised", itertools.repeat(_global_batch()), 1.0)
    objective = MLRObjective(encoder, [stream], lambda d: f"document text of {d}", 0.05, 16, 16, LAYERS, pooling,
                             reg_weight=0.5, mix=mix, hard_negatives=HardNegatives(MINED, 2, seed=3))
    params = [*encoder.parameters(), *(mix.parameters() if mix is not None else [])]
    return params, objective


def _worker(rank, world, store, model_dir, pooling, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    params, objective = _objective(model_dir, pooling)
    loss, _ = objective()
    loss.backward()
    average_gradients(params)  # what DDP does for the encoder, and the trainer for the mix weights
    total = loss.detach().clone()
    dist.all_reduce(total)
    torch.save({"loss": total / world, "grads": [p.grad for p in params]}, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


# both poolings share the gradient averaging under test; scalar_mix's extra weights are in the slow tier
@pytest.mark.parametrize("pooling", ["self_contrastive", pytest.param("scalar_mix", marks=pytest.mark.slow)])
def test_two_rank_gloo_matches_one_process(tmp_path, tiny_model_dir, pooling):
    params, objective = _objective(tiny_model_dir, pooling)
    loss, _ = objective()
    loss.backward()
    reference = [p.grad for p in params]
    assert reference[0] is not None  # the word embeddings get gradient (the pooler, unused, does not)
    if pooling == "scalar_mix":
        assert reference[-1] is not None and reference[-1].abs().sum() > 0  # the mix weights learn

    mp.spawn(_worker, args=(2, tmp_path / "store", tiny_model_dir, pooling, tmp_path), nprocs=2, join=True)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(result["loss"], loss.detach(), atol=1e-5)
        for got, want in zip(result["grads"], reference, strict=True):
            if want is None:
                assert got is None
            else:
                assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
