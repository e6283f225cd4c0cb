"""Logit parity with transformers (fp32, CPU) on tiny random-weight checkpoints:
single sequence, a packed batch of different lengths, and prefill-then-decode over paged KV
(including a chunked prefill next to a decode in one forward, pages appended as tokens arrive)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.models import CausalLM, SeqSlice, load_model
from tests.runtime.models.builders import build_gemma, build_llama, build_qwen2, hf_model
from tests.runtime.models.paged import Pages

TOL = 1e-4
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "llama_gqa_theta500k": lambda p: build_llama(p, tokenizer=False),
    "llama_tied": lambda p: build_llama(p, tie_word_embeddings=True, tokenizer=False),
    "llama_biases": lambda p: build_llama(p, attention_bias=True, mlp_bias=True, tokenizer=False),
    "qwen2": lambda p: build_qwen2(p, tokenizer=False),
    "gemma_head_dim": lambda p: build_gemma(p, tokenizer=False),
}


@pytest.fixture(params=sorted(BUILDERS), scope="module")
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path = BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    ours = load_model(path, device="cpu", load_tokenizer=False).model
    assert isinstance(ours, CausalLM)
    return ours, hf_model(path)


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (11, 1, 5, 17)]


def reference(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def test_single_sequence(pair) -> None:
    ours, hf = pair
    check_single_sequence(ours, hf, TOL)


def check_single_sequence(ours: CausalLM, hf, tol: float) -> None:
    tokens = prompts(ours.args.vocab_size)[0]
    pages = Pages(ours)
    (logits,) = pages.step([(pages.new(), tokens)])
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference(hf, tokens), atol=tol, rtol=0)


def test_packed_batch_of_different_lengths(pair) -> None:
    ours, hf = pair
    check_packed_batch(ours, hf, TOL)


def check_packed_batch(ours: CausalLM, hf, tol: float) -> None:
    batch = prompts(ours.args.vocab_size)
    pages = Pages(ours)
    got = pages.step([(pages.new(), p) for p in batch])
    for tokens, logits in zip(batch, got, strict=True):
        torch.testing.assert_close(logits, reference(hf, tokens), atol=tol, rtol=0)


def test_prefill_then_decode_mixed_stages(pair) -> None:
    ours, hf = pair
    check_prefill_then_decode(ours, hf, TOL)


def check_prefill_then_decode(ours: CausalLM, hf, tol: float) -> None:
    """Seq A: prefill 6, then a 4-token chunk beside B's decodes, then decode; seq B: prefill 3,
    then decode one token per step. Each step's logits match HF's full-sequence logits."""
    a_tokens, _, _, b_tokens = prompts(ours.args.vocab_size)
    pages = Pages(ours)
    kv_a, kv_b = pages.new(), pages.new()
    got_a, got_b = pages.step([(kv_a, a_tokens[:6]), (kv_b, b_tokens[:3])])
    logits_a, logits_b = [got_a], [got_b]
    chunk_a, dec_b = pages.step([(kv_a, a_tokens[6:10]), (kv_b, b_tokens[3:4])])
    logits_a.append(chunk_a)
    logits_b.append(dec_b)
    for i in range(10, len(a_tokens)):
        dec_b, dec_a = pages.step([(kv_b, b_tokens[i - 6 : i - 5]), (kv_a, a_tokens[i : i + 1])])
        logits_a.append(dec_a)
        logits_b.append(dec_b)
    assert kv_a.num_tokens == len(a_tokens)
    torch.testing.assert_close(torch.cat(logits_a), reference(hf, a_tokens), atol=tol, rtol=0)
    b_seen = b_tokens[: kv_b.num_tokens]
    torch.testing.assert_close(torch.cat(logits_b), reference(hf, b_seen), atol=tol, rtol=0)


def test_kv_cursor_is_not_advanced_by_forward(pair) -> None:
    ours, _ = pair
    kv = Pages(ours).new(capacity=3)  # block size 4: one page
    ours(torch.tensor([1, 2, 3]), [SeqSlice(0, 3, kv)])
    assert kv.num_tokens == 0
    (page,) = kv.page_ids
    assert (
        kv.data[:, :, :, page, :3].abs().sum() > 0 and kv.data[:, :, :, page, 3:].abs().sum() == 0
    )


def test_kv_overflow_is_refused(pair) -> None:
    ours, _ = pair
    kv = Pages(ours, page_size=2).new(capacity=2)
    with pytest.raises(ValueError, match="KV overflow"):
        ours(torch.tensor([1, 2, 3]), [SeqSlice(0, 3, kv)])
