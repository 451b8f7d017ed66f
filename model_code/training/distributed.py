"""Multi-process helpers: the same trainer runs alone or under ``torchrun`` (DDP).

Under torchrun every rank draws the same global batch (same seed), encodes its slice, and
all-gathers embeddings *with gradients* so in-batch negatives span the global batch (HCE
footnote 3). ``torch.distributed.nn.functional.all_gather`` sums the gradients flowing back to
each rank's slice, and ``average_gradients`` all-reduces parameter gradients over ranks exactly as
DistributedDataParallel's reducer does, so the result equals the single-process gradient of the
global-batch loss. The reduction is explicit rather than a DDP wrapper because one step runs the
encoder several times (queries, passages, negatives) and covers the HCE centroids, which live
outside the encoder.

    torchrun --nproc-per-node 2 -m model_code.cli train      # gloo on CPU, nccl on CUDA
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup_from_env() -> None:
    """Join the process group when launched by torchrun (``WORLD_SIZE`` > 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_slice(size: int) -> slice:
    """This rank's rows of a global batch of ``size`` (which must divide evenly)."""
    rank, world = rank_and_world()
    if size % world:
        raise ValueError(f"global batch {size} does not split evenly over {world} ranks")
    per_rank = size // world
    return slice(rank * per_rank, (rank + 1) * per_rank)


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    _, world = rank_and_world()
    if world == 1:
        return local
    from torch.distributed.nn.functional import all_gather

    gathered = torch.cat(all_gather(local), dim=0)
    if gathered.requires_grad:
        # all_gather's backward is an all-to-all of the gradient's slices, which gloo computes wrongly
        # on non-contiguous tensors (an einsum's gradient for MLR's (N, m, d) layer vectors is one)
        gathered.register_hook(torch.Tensor.contiguous)
    return gathered


def from_rank0(value):
    """Rank 0's ``value`` (any picklable object) on every rank; ``value`` itself in one process.

    For decisions taken from data each rank computes on its own (the dev score, the re-clustered
    tree): GPU kernels and faiss need not be bitwise reproducible across processes, and ranks that
    disagreed would train against different trees."""
    _, world = rank_and_world()
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def average_gradients(parameters) -> None:
    """All-reduce (mean) the gradients of ``parameters`` across ranks; a no-op in one process."""
    _, world = rank_and_world()
    if world == 1:
        return
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
