"""Embeddings for encoder (BERT) models: one padded batch, mean-pooled and L2-normalised.

Encoders have no KV cache and no step loop; the forward runs on the caller's thread, one at a
time (`embed_lock`), and the request's stats go to the sink like a generation's do.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.engine.stats import FinishReason, RequestEvent, RequestStats, StatsSink
from runtime.errors import InvalidRequestError
from runtime.models.bert import BertEncoder

if TYPE_CHECKING:
    from runtime.engine.build import EngineParts


@dataclass
class EmbeddingResult:
    embeddings: list[list[float]]  # one L2-normalised vector per input text
    prompt_tokens: list[int]  # tokens per input text (special tokens included)

    @property
    def total_prompt_tokens(self) -> int:
        return sum(self.prompt_tokens)


def embed_texts(
    parts: EngineParts,
    texts: list[str],
    *,
    request_id: str | None = None,
    sink: StatsSink | None = None,
) -> EmbeddingResult:
    loaded = parts.loaded
    if not isinstance(loaded.model, BertEncoder):
        raise InvalidRequestError(
            f"{loaded.path.name} is a generative model; embeddings need an encoder model",
            param="model",
        )
    if not texts:
        raise InvalidRequestError("input is empty", param="input")
    ids = [parts.tokenizer.encode(text) for text in texts]
    context = loaded.args.max_position_embeddings
    for i, row in enumerate(ids):
        if not row:
            raise InvalidRequestError(f"input[{i}] is empty", param="input")
        if len(row) > context:
            raise InvalidRequestError(
                f"input[{i}] is {len(row)} tokens; this model's context is {context}",
                param="input",
            )
    stats = RequestStats(
        request_id=request_id or f"embd-{uuid.uuid4().hex}",
        model=parts.core.config.model_name,
        version=parts.core.config.model_version,
        queued_ts=time.time(),
        prompt_tokens=sum(len(row) for row in ids),
        operation="embeddings",
        batch_size=len(ids),
    )
    pad_id = parts.tokenizer.pad_token_id or 0
    width = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)  # [B, S]
    mask = torch.zeros((len(ids), width), dtype=torch.long)  # [B, S]; 1 = real token
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    with parts.embed_lock, torch.inference_mode():
        stats.events.append((RequestEvent.SCHEDULED, time.time()))
        stats.scheduled_ts = stats.events[-1][1]
        vectors = loaded.model.embed(input_ids.to(loaded.device), mask.to(loaded.device))  # [B, H]
        embeddings = vectors.float().cpu().tolist()
        del vectors, input_ids, mask
        # encoder requests never pass the engine loop, where the heap is trimmed between steps:
        # trim here (rate-limited), or RSS stays at the fragmented high-water mark of the
        # largest batches (the embeddings soak saw it swing by 11% over 500 requests)
        parts.core.trimmer.maybe_trim(time.monotonic())
    stats.finished_ts = time.time()
    stats.events.append((RequestEvent.FINISHED, stats.finished_ts))
    stats.finished_reason = FinishReason.STOP
    if sink is not None:
        sink.record(finished=[stats])
    return EmbeddingResult(embeddings=embeddings, prompt_tokens=[len(row) for row in ids])
