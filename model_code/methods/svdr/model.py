"""SVDR's sparse vocabulary encoder (VDR, as in SVDR §4.1 and the reference ``VDREncoder``).

A text becomes one non-negative vector over the tokenizer's vocabulary:

    V = max_t ELU1p( LN(H_t) · Eᵀ ),        ELU1p(x) = ELU(x) + 1 > 0

with H the transformer's last hidden states, LN a new LayerNorm (affine part initialised to the
identity, trained with the model), and E the model's *own input word-embedding matrix* (tied: no
MLM head, the projection trains the embeddings) without its first ``vocab_start`` rows. For the
BERT vocabulary, which MiniLM shares, the reference drops ids 0-998: [PAD], [unused*], [UNK],
[CLS], [SEP], [MASK]; a dimension is then a real word piece. Any special token at or above
``vocab_start`` (another vocabulary, a tiny test vocabulary) is still left out of every bag of
tokens.

Deviation from the reference: the max runs over real tokens only (the attention mask); the
reference code also takes it over padding positions, which makes a text's vector depend on the
longest text in its batch. ELU1p is strictly increasing, so it is applied after the max (the
same value) to avoid a second (batch, tokens, vocabulary) tensor.

Sparsification (``sparsify``) keeps the ``topk`` largest dimensions (768 in the paper), OR-ed with
the text's own bag of tokens where the reference does (queries, re-ranked passages, training).
Query and passage sides are one model (``shared``, the default here) or two (the reference's
fine-tuned setting), each with its own LayerNorm. ``save`` writes a Hugging Face model directory
(the query side, or the only one) with the LayerNorms in ``svdr_norms.pt`` and a separate passage
side in ``passage/``; loading that directory restores all of it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from model_code.models.encoder import DEFAULT_MODEL, autocast, best_device, resolve_model_path

BERT_VOCAB_START = 999  # first kept id of the BERT vocabulary: 0-998 are [PAD], [unused*] and the specials


def bag_of_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_start: int, vocab_size: int,
                  special_ids: torch.Tensor) -> torch.Tensor:
    """(batch, vocab_size) float: 1 where a kept token occurs in the text (padding, ids below
    ``vocab_start`` and special tokens never do)."""
    keep = attention_mask.bool() & (input_ids >= vocab_start) & ~torch.isin(input_ids, special_ids)
    columns = (input_ids - vocab_start).clamp(min=0)
    counts = torch.zeros(len(input_ids), vocab_size, device=input_ids.device)
    return counts.scatter_add_(1, columns, keep.float()).clamp_(max=1.0)


def sparsify(vectors: torch.Tensor, lexical: torch.Tensor | None, topk: int | None) -> torch.Tensor:
    """``vectors ⊙ (top-k(vectors) ∨ lexical)``: ``topk`` None keeps every dimension, 0 only the
    lexical ones; ``lexical`` None keeps the pure top-k (the reference's parametric index)."""
    if topk is None:
        return vectors
    mask = torch.zeros_like(vectors).scatter_(1, vectors.topk(min(topk, vectors.shape[1]), dim=1).indices, 1.0)
    if lexical is not None:
        mask = torch.maximum(mask, lexical)
    return vectors * mask


class VocabularyProjection(torch.nn.Module):
    """One side's encoder: transformer, new LayerNorm, tied projection onto the kept vocabulary,
    masked max over tokens."""

    def __init__(self, backbone: torch.nn.Module, vocab_start: int):
        super().__init__()
        self.backbone = backbone
        self.norm = torch.nn.LayerNorm(backbone.config.hidden_size)  # weight 1, bias 0: the identity affine map
        self.vocab_start = vocab_start

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.backbone(**batch).last_hidden_state
        words = self.backbone.get_input_embeddings().weight[self.vocab_start :]
        logits = self.norm(hidden) @ words.T
        padding = ~batch["attention_mask"].bool().unsqueeze(-1)
        return F.elu(logits.masked_fill(padding, float("-inf")).amax(dim=1).float()) + 1.0


class SparseEncoder(torch.nn.Module):
    """Args:
        model_name: ``minilm`` or a Hugging Face model path.
        vocab_start: first vocabulary id kept as a dimension (999 for BERT's vocabulary).
        shared: one model for queries and passages; otherwise the passage side is a second copy
            (loaded from ``<model>/passage`` when that exists).
    """

    PASSAGE_DIR = "passage"
    NORMS_FILE = "svdr_norms.pt"

    def __init__(self, model_name: str = DEFAULT_MODEL, vocab_start: int = BERT_VOCAB_START, shared: bool = True,
                 device: torch.device | None = None):
        super().__init__()
        path = resolve_model_path(model_name)
        local_only = os.environ.get("HF_HUB_OFFLINE", "0") == "1" or Path(path).exists()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        self.query = VocabularyProjection(AutoModel.from_pretrained(path, local_files_only=local_only), vocab_start)
        passage_path = Path(path) / self.PASSAGE_DIR
        self.passage = self.query if shared else VocabularyProjection(
            AutoModel.from_pretrained(passage_path if passage_path.is_dir() else path, local_files_only=local_only),
            vocab_start)
        norms = Path(path) / self.NORMS_FILE
        if norms.is_file():  # trained: the new LayerNorms were saved beside the model
            state = torch.load(norms, map_location="cpu")
            self.query.norm.load_state_dict(state["query"])
            self.passage.norm.load_state_dict(state.get("passage", state["query"]))
        self.vocab_start = vocab_start
        self.vocab_size = self.query.backbone.get_input_embeddings().weight.shape[0] - vocab_start
        if self.vocab_size <= 0:
            raise ValueError(f"vocab_start {vocab_start} leaves no dimension of a {vocab_start + self.vocab_size}-token vocabulary")
        self.register_buffer("special_ids", torch.tensor(self.tokenizer.all_special_ids), persistent=False)
        self.device = device or best_device()
        self.to(self.device)

    def tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}

    def lexical(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The batch's binary bags of tokens (the ``bin_q`` / ``bin_p`` of the loss)."""
        return bag_of_tokens(batch["input_ids"], batch["attention_mask"], self.vocab_start, self.vocab_size,
                             self.special_ids)

    def forward(self, batch: dict[str, torch.Tensor], side: str = "query") -> torch.Tensor:
        """(batch, vocab_size) pooled vectors before sparsification (with gradients; training)."""
        with autocast(self.device):
            return (self.query if side == "query" else self.passage)(batch)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.query.backbone.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        norms = {"query": self.query.norm.state_dict()}
        if self.passage is not self.query:
            self.passage.backbone.save_pretrained(directory / self.PASSAGE_DIR)
            norms["passage"] = self.passage.norm.state_dict()
        torch.save(norms, directory / self.NORMS_FILE)

    @torch.inference_mode()
    def encode(self, texts: list[str], side: str, max_length: int, topk: int | None, lexical: bool,
               batch_size: int = 64, desc: str | None = None) -> sp.csr_matrix:
        """Sparsified vectors of ``texts`` as float32 CSR rows (input order kept), batched by
        length to cut padding."""
        was_training = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts], kind="stable")
        parts = []
        batches = range(0, len(texts), batch_size)
        for start in tqdm(batches, desc=desc or "encoding", unit="batch", disable=desc is None or len(batches) < 2):
            batch = self.tokenize([texts[i] for i in order[start : start + batch_size]], max_length)
            vectors = sparsify(self(batch, side), self.lexical(batch) if lexical else None, topk)
            parts.append(sp.csr_matrix(vectors.cpu().numpy()))
        self.train(was_training)
        if not parts:
            return sp.csr_matrix((0, self.vocab_size), dtype=np.float32)
        return sp.vstack(parts, format="csr")[np.argsort(order)]
