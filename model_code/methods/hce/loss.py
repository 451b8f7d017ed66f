"""The Hierarchical Corpus Encoder loss (HCE paper Eq. 5-6, App. A), computed from embeddings.

Levels of the corpus tree are numbered 1..L, level L being the documents themselves. For a
query q with positive document d+ whose root-to-leaf path is (n_1, ..., n_{L-1}, d+):

* levels t = 1..M (hierarchy loss, Eq. 5): softmax over the children of n_{t-1} (the positive
  node and its siblings) using *trainable* centroid vectors c, initialised from clustering
  (paper §5.2 "Scalability") and discarded at indexing time:

      L_H^(t) = -log softmax_{u in children(n_{t-1})}( <q, c_u> / tau )[n_t]

* levels t = M+1..L (contrastive loss with sampled negatives, Eq. 6): the bidirectional
  in-batch loss where each query additionally sees n_NS documents sampled from the subtree of
  n_{t-1} (documents sharing the positive's prefix: hard, nearby negatives):

      L_C^(t) = CE_q->d([S_batch | S_ns^(t)] / tau) + CE_d->q(S_batch^T / tau)      (Eq. 8)

  S_batch = Q D^T over the (global) batch, S_ns^(t) = <q_i, ns_{i,k}>, padded samples masked.

Total: L = w_H * sum_{t<=M} L_H^(t) + w_C * sum_{t>M} L_C^(t). With M = 0 and no sampled
negatives every level's term is the same bidirectional in-batch loss, so the total is L times it
(the "+CT" baseline's loss up to that constant factor; its tests assert exactly this).

Args:
    tree: the corpus tree (centroids, document paths).
    levels_trained: M, the number of centroid levels kept as parameters (0 <= M <= L-1).
    temperature: tau (HCE default 0.01).
    n_negatives: n_NS documents sampled per contrastive level (HCE default 4).

References: Chen et al., "Hierarchical Corpus Encoder: Fusing Generative Retrieval and Dense
Indices" (2025), Eq. 5-8 and Algorithm 3.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import CorpusTree
from model_code.losses.contrastive import bidirectional_infonce


class TreeLookup:
    """Tensors derived from a ``CorpusTree`` for batched child/sibling/subtree lookups.

    They stay on the CPU whatever device the loss runs on: sampling draws from a CPU generator,
    and the indices they produce are moved to the embeddings' device where they meet them."""

    def __init__(self, tree: CorpusTree):
        self.cluster_levels = tree.depth  # L - 1
        self.doc_path = torch.as_tensor(tree.doc_path, dtype=torch.long)
        if (self.doc_path < 0).any():
            raise ValueError("the HCE loss needs an equal-depth tree: use hierarchy.builder=agglomerative")
        self.children, self.child_rank = [], []
        for parent in tree.parents:
            n_parents = int(parent.max()) + 1 if len(parent) else 1
            counts = np.bincount(parent, minlength=n_parents)
            table = np.full((n_parents, counts.max()), -1, dtype=np.int64)
            rank = np.zeros(len(parent), dtype=np.int64)
            fill = np.zeros(n_parents, dtype=np.int64)
            for node, p in enumerate(parent):
                table[p, fill[p]] = node
                rank[node] = fill[p]
                fill[p] += 1
            self.children.append(torch.as_tensor(table))
            self.child_rank.append(torch.as_tensor(rank))
        # documents grouped by their node at every level (level 0 = the root = everything)
        n_docs = len(self.doc_path)
        self.members, self.offsets, self.position = [], [], []
        for level in range(self.cluster_levels + 1):
            key = np.zeros(n_docs, dtype=np.int64) if level == 0 else tree.doc_path[:, level - 1]
            order = np.argsort(key, kind="stable")
            counts = np.bincount(key)
            position = np.empty(n_docs, dtype=np.int64)
            position[order] = np.arange(n_docs)
            self.members.append(torch.as_tensor(order))
            self.offsets.append(torch.as_tensor(np.concatenate([[0], np.cumsum(counts)])))
            self.position.append(torch.as_tensor(position))

    def node(self, doc_index: torch.Tensor, level: int) -> torch.Tensor:
        """Node id at ``level`` (1..L-1) on each document's path; level 0 is the root (0)."""
        if level == 0:
            return torch.zeros_like(doc_index)
        return self.doc_path[doc_index, level - 1]

    def sample_subtree(
        self, doc_index: torch.Tensor, level: int, count: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` distinct documents from the subtree of each document's node at ``level``, never
        the document itself (drawn without replacement). Returns (indices, valid mask); a subtree
        with fewer than ``count`` other documents gives all of them and masked padding."""
        node = self.node(doc_index, level)
        start, end = self.offsets[level][node], self.offsets[level][node + 1]
        others = (end - start - 1).clamp(min=0)
        width = max(int(others.max()) if len(doc_index) else 0, count)
        # a random key per candidate position; the `count` smallest keys are a uniform draw without
        # replacement among the row's `others` positions (positions past them sort last, masked)
        keys = torch.rand(len(doc_index), width, generator=generator)
        outside = torch.arange(width).unsqueeze(0) >= others.unsqueeze(1)
        draw = keys.masked_fill(outside, 2.0).topk(count, dim=1, largest=False).indices
        valid = draw < others.unsqueeze(1)
        own = self.position[level][doc_index].unsqueeze(1) - start.unsqueeze(1)
        draw = draw + (draw >= own).long()  # skip over the positive itself
        picked = self.members[level][(start.unsqueeze(1) + draw).clamp(max=len(self.doc_path) - 1)]
        return picked, valid


class HCELoss(torch.nn.Module):
    def __init__(
        self,
        tree: CorpusTree,
        levels_trained: int,
        temperature: float = 0.01,
        n_negatives: int = 4,
        hierarchy_weight: float = 1.0,
        contrastive_weight: float = 1.0,
    ):
        super().__init__()
        self.lookup = TreeLookup(tree)
        if not 0 <= levels_trained <= self.lookup.cluster_levels:
            raise ValueError(f"levels_trained must be in [0, {self.lookup.cluster_levels}], got {levels_trained}")
        self.levels_trained = levels_trained
        self.centroids = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.as_tensor(c).clone()) for c in tree.centroids[:levels_trained]]
        )
        self.temperature = temperature
        self.n_negatives = n_negatives
        self.hierarchy_weight = hierarchy_weight
        self.contrastive_weight = contrastive_weight

    @property
    def contrastive_levels(self) -> list[int]:
        """Levels M+1..L, each named by the level whose subtree supplies its negatives (t-1)."""
        return list(range(self.levels_trained, self.lookup.cluster_levels + 1))

    def sample_negatives(
        self, doc_index: torch.Tensor, generator: torch.Generator, positives: Sequence[Collection[int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices (B, n_levels, n_NS) and mask of sampled negatives for the contrastive levels.

        ``positives`` (per row, the document indices relevant to its query) masks samples that
        are another relevant document of the same query: nearby subtrees are where those live."""
        if self.n_negatives == 0:
            empty = torch.zeros(len(doc_index), len(self.contrastive_levels), 0, dtype=torch.long)
            return empty, empty.bool()
        samples = [self.lookup.sample_subtree(doc_index, lvl, self.n_negatives, generator) for lvl in self.contrastive_levels]
        index, mask = torch.stack([s[0] for s in samples], 1), torch.stack([s[1] for s in samples], 1)
        if positives is not None:
            flat = index.reshape(len(doc_index), -1).tolist()
            known = torch.tensor([[n in relevant for n in row] for row, relevant in zip(flat, positives)], dtype=torch.bool)
            mask = mask & ~known.reshape(index.shape)
        return index, mask

    def level_losses(self, queries: torch.Tensor, doc_index: torch.Tensor) -> list[torch.Tensor]:
        """Eq. 5 for levels 1..M: sibling softmax against trainable centroids."""
        losses = []
        for level, centroids in enumerate(self.centroids, start=1):
            parent = self.lookup.node(doc_index, level - 1)
            siblings = self.lookup.children[level - 1][parent]  # (B, max_children)
            target = self.lookup.child_rank[level - 1][self.lookup.node(doc_index, level)]
            vectors = F.normalize(centroids, dim=-1)[siblings.clamp(min=0)]
            logits = torch.einsum("bd,bkd->bk", queries, vectors) / self.temperature
            logits = logits.masked_fill((siblings < 0).to(logits.device), float("-inf"))
            losses.append(F.cross_entropy(logits, target.to(logits.device)))
        return losses

    def forward(
        self,
        queries: torch.Tensor,
        passages: torch.Tensor,
        doc_index: torch.Tensor,
        negatives: torch.Tensor,
        negative_mask: torch.Tensor,
        all_queries: torch.Tensor | None = None,
        all_passages: torch.Tensor | None = None,
        offset: int = 0,
        false_negatives: torch.Tensor | None = None,
        hard_negatives: torch.Tensor | None = None,
        hard_excluded: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Total HCE loss for this rank's rows and its per-level parts (for logging).

        ``negatives`` (B, n_contrastive_levels, n_NS, d) are the embeddings of the documents from
        ``sample_negatives``; ``all_queries``/``all_passages``/``offset`` as in
        ``bidirectional_infonce`` when the batch is spread over several processes, and
        ``false_negatives`` its in-batch mask of other relevant passages; ``hard_negatives`` and
        ``hard_excluded`` the global batch's mined negatives, candidates at every contrastive level."""
        hierarchy = self.level_losses(queries, doc_index)
        contrastive = [
            bidirectional_infonce(
                queries, passages, self.temperature, all_queries, all_passages, offset,
                extra=negatives[:, i], extra_mask=negative_mask[:, i], false_negatives=false_negatives,
                hard_negatives=hard_negatives, hard_excluded=hard_excluded,
            )
            for i in range(len(self.contrastive_levels))
        ]
        total = self.contrastive_weight * torch.stack(contrastive).sum()
        if hierarchy:
            total = total + self.hierarchy_weight * torch.stack(hierarchy).sum()
        parts = {f"level_{t}": loss.item() for t, loss in enumerate(hierarchy + contrastive, start=1)}
        return total, parts
