"""The parity checks on a CUDA device (`pytest -m cuda`): our model in fp32/fp16/bf16 on the GPU
against transformers in fp32 on the CPU. Half precision gets a tolerance scaled to its mantissa."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.models import BertEncoder, CausalLM, load_model
from tests.runtime.models.builders import hf_model
from tests.runtime.models.test_bert import TEXTS, hf_mean_pooled, minilm_dir
from tests.runtime.models.test_parity import (
    BUILDERS,
    check_packed_batch,
    check_prefill_then_decode,
    check_single_sequence,
)

pytestmark = pytest.mark.cuda

TOLERANCES = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}  # logits have std ~0.16


@pytest.fixture(params=sorted(BUILDERS), scope="module")
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return BUILDERS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("dtype", sorted(TOLERANCES))
def test_causal_lm_parity_on_cuda(checkpoint: Path, dtype: str) -> None:
    loaded = load_model(checkpoint, dtype=dtype, device="auto", load_tokenizer=False)
    assert loaded.device.type == "cuda"
    assert isinstance(loaded.model, CausalLM)
    hf = hf_model(checkpoint)
    tol = TOLERANCES[dtype]
    check_single_sequence(loaded.model, hf, tol)
    check_packed_batch(loaded.model, hf, tol)
    check_prefill_then_decode(loaded.model, hf, tol)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_minilm_embeddings_on_cuda(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer, BertModel

    loaded = load_model(minilm_dir(), dtype=dtype, device="cuda", load_tokenizer=False)
    assert isinstance(loaded.model, BertEncoder)
    batch = AutoTokenizer.from_pretrained(minilm_dir())(TEXTS, padding=True, return_tensors="pt")
    hf = BertModel.from_pretrained(minilm_dir(), dtype=torch.float32).eval()
    ref = hf_mean_pooled(hf, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    cuda = {k: v.cuda() for k, v in batch.items()}
    got = loaded.model.embed(cuda["input_ids"], cuda["attention_mask"], cuda["token_type_ids"])
    cosine = (got.cpu() * ref).sum(dim=1)
    assert cosine.min().item() >= (0.9999 if dtype == "float32" else 0.999), cosine
