"""SVDR computed apart from the code under test (``tests/model_code/methods/svdr/``): a text's bag of
tokens from the tokenizer one document at a time, the sparse encoder's formula in NumPy, the loss term
ℓ(A, B) in NumPy, the top-k ∪ lexical mask by hand, and a tiny corpus with its queries."""

import numpy as np
import pandas as pd
import torch
from transformers import AutoModel, AutoTokenizer

START = 999  # BERT's first kept id; the tiny model uses MiniLM's (BERT's) vocabulary
TEXTS = ["stars planets galaxies telescope orbit", "a recipe", "recipe oven flour butter butter butter simmer"]


def token_set(tokenizer, text: str, max_length: int, start: int = START) -> set[int]:
    """Columns of a text's bag of tokens, one document at a time from the tokenizer's ids."""
    ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
    return {i - start for i in ids if i >= start and i not in tokenizer.all_special_ids}


def layer_norm(h: np.ndarray, weight=1.0, bias=0.0) -> np.ndarray:
    """The encoder's new LayerNorm over each token's hidden state (eps 1e-5), in NumPy."""
    return (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5) * weight + bias


def hand_vectors(model_dir, texts: list[str], max_length: int, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """ELU1p(LN(H) · E[999:]ᵀ) per token, max over tokens, in NumPy; one text at a time."""
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    words = model.get_input_embeddings().weight.detach().numpy()[START:]
    out = []
    with torch.no_grad():
        for text in texts:
            h = model(**tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")).last_hidden_state[0]
            x = layer_norm(h.numpy().astype(np.float64), weight, bias) @ words.T
            out.append(np.where(x >= 0, x + 1, np.exp(np.minimum(x, 0))).max(axis=0))
    return np.stack(out)


CORPUS = pd.DataFrame({
    "doc_id": [f"d{i}" for i in range(6)],
    "title": ["stars.", "oven.", "", "goal.", "melody.", "stars oven."],  # BEIR joins title and text by one space
    "text": ["planets telescope orbit comet", "recipe flour butter", "dose vaccine trial patient",
             "football league referee", "chord guitar tempo", "a comet seen while baking bread"],
})
QUERIES = ["comet telescope", "butter recipe", "guitar chord tempo"]
LENGTHS = {"max_query_length": 8, "max_passage_length": 12, "batch_size": 4}


def binary(tokenizer, texts, max_length) -> np.ndarray:
    out = np.zeros((len(texts), 30522 - START))
    for row, text in zip(out, texts):
        row[sorted(token_set(tokenizer, text, max_length))] = 1
    return out


def ell(a: np.ndarray, b: np.ndarray, rows=slice(None), excluded: np.ndarray | None = None) -> float:
    """ℓ(A, B) in NumPy: ½ [query -> every passage CE + positive passage -> every query CE]."""
    n = len(a)
    forward, backward = a @ b.T, b[:n] @ a.T
    if excluded is not None:
        forward[excluded], backward[excluded[:, :n].T] = -np.inf, -np.inf

    def ce(scores):
        return (np.log(np.exp(scores).sum(1)) - np.diag(scores[:, :n]))[rows].mean()

    return 0.5 * (ce(forward) + ce(backward))


def sparsified(v: np.ndarray, bags: np.ndarray, topk: int) -> np.ndarray:
    keep = bags.astype(bool)
    np.put_along_axis(keep, np.argsort(-v, axis=1)[:, :topk], True, axis=1)
    return v * keep
