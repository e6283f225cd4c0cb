"""Sentence embeddings from an encoder checkpoint without the engine (the `fastllm embed` verb):
one padded batch -> mean-pooled, L2-normalised vectors (sentence-transformers' recipe)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from runtime.errors import InvalidRequestError
from runtime.models.bert import BertEncoder

if TYPE_CHECKING:
    from runtime.models.loader import LoadedModel

__all__ = ["embed"]


def embed(loaded: LoadedModel, texts: Sequence[str]) -> list[list[float]]:
    """One float32 vector per text. Texts beyond the model's context are an error, not truncated."""
    if not isinstance(loaded.model, BertEncoder):
        raise InvalidRequestError(f"{loaded.path} is not an encoder (BERT) model", param="model")
    if loaded.tokenizer is None:
        raise InvalidRequestError(f"{loaded.path} was loaded without its tokenizer", param="model")
    if not texts:
        raise InvalidRequestError("no input texts", param="input")
    ids = [loaded.tokenizer.encode(text) for text in texts]
    context = loaded.args.max_position_embeddings
    for i, row in enumerate(ids):
        if len(row) > context:
            raise InvalidRequestError(
                f"input[{i}] is {len(row)} tokens; this model's context is {context} tokens",
                param="input",
            )
    width = max(len(row) for row in ids)
    pad_id = loaded.tokenizer.pad_token_id or 0
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)  # [B, S]
    mask = torch.zeros((len(ids), width), dtype=torch.long)  # [B, S]; 1 = real token
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    with torch.inference_mode():
        vectors = loaded.model.embed(input_ids.to(loaded.device), mask.to(loaded.device))  # [B, H]
    result: list[list[float]] = vectors.float().cpu().tolist()
    return result
