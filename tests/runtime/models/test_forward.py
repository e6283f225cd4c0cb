"""The model's one forward (the fused decoder layer, prefill and decode alike) against
transformers, on the parity suite's checkpoints: several sequences at different positions
decoded in one step give transformers' greedy tokens and logits; a decode step writes the K/V a
prefill of the same tokens writes; the rope table and the rotary kernel bit-for-bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.memory.kv_pool import SequenceKV
from runtime.models import CausalLM, SeqSlice, load_model, ops
from runtime.models.base import RopeTable
from runtime.models.fast.graphs import batch_buckets
from tests.runtime.models.builders import hf_model
from tests.runtime.models.paged import Pages
from tests.runtime.models.test_parity import BUILDERS, TOL, prompts

NUM_DECODE = 6


@pytest.fixture(params=sorted(BUILDERS), scope="module")
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return BUILDERS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> CausalLM:
    loaded = load_model(checkpoint, device="cpu", load_tokenizer=False).model
    assert isinstance(loaded, CausalLM)
    return loaded


def greedy_decode(
    model: CausalLM, step, batch: list[list[int]]
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill every prompt (eager, one packed forward), then NUM_DECODE greedy steps of the
    whole batch through `step`; -> tokens per sequence, logits [batch, vocab] per step."""
    pages = Pages(model, num_pages=16 * len(batch))  # one pool: a forward reads one
    kvs = [pages.new(capacity=len(tokens) + NUM_DECODE) for tokens in batch]
    seqs, ids = [], []
    for kv, tokens in zip(kvs, batch, strict=True):
        seqs.append(SeqSlice(len(ids), len(ids) + len(tokens), kv))
        ids += tokens
    device = model.embed_tokens.weight.device
    hidden = model(torch.tensor(ids, device=device), seqs)
    for seq in seqs:
        seq.kv.advance(seq.end - seq.start)
    last = torch.tensor([s.end - 1 for s in seqs], device=device)
    logits = model.compute_logits(hidden.index_select(0, last))
    outputs, all_logits = [[] for _ in batch], []
    for _ in range(NUM_DECODE):
        next_ids = logits.argmax(-1)
        for out, token in zip(outputs, next_ids.tolist(), strict=True):
            out.append(token)
        hidden = step(next_ids, [SeqSlice(i, i + 1, kv) for i, kv in enumerate(kvs)])
        for kv in kvs:
            kv.advance(1)
        logits = model.compute_logits(hidden)
        all_logits.append(logits)
    return outputs, all_logits


def hf_greedy(hf, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation and its logits at each decoded position."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([tokens]),
            attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
            do_sample=False,
            max_new_tokens=NUM_DECODE + 1,
            min_new_tokens=NUM_DECODE + 1,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, len(tokens) :].tolist()
    return new[:NUM_DECODE], torch.stack([s[0] for s in out.logits[1:]]).float()


def test_batched_decode_matches_transformers(checkpoint: Path, model: CausalLM) -> None:
    batch = prompts(model.args.vocab_size)  # lengths 11, 1, 5, 17: different positions
    tokens, logits = greedy_decode(model, model, batch)
    hf = hf_model(checkpoint)
    for i in (0, 1):  # against transformers: a 11-token and a 1-token prompt (suite time)
        hf_tokens, hf_logits = hf_greedy(hf, batch[i])
        assert tokens[i] == hf_tokens
        ours = torch.stack([step[i] for step in logits])
        torch.testing.assert_close(ours, hf_logits, atol=TOL, rtol=0)
    # the other two rows of the batch decode as they would alone (rows do not leak)
    for i in (2, 3):
        alone_tokens, alone_logits = greedy_decode(model, model, [batch[i]])
        assert tokens[i] == alone_tokens[0]
        ours = torch.stack([step[i] for step in logits])
        torch.testing.assert_close(
            ours, torch.stack([s[0] for s in alone_logits]), atol=TOL, rtol=0
        )


def test_a_decode_step_writes_the_kv_a_prefill_writes(model: CausalLM) -> None:
    prompt = prompts(model.args.vocab_size)[0]
    a, weight = model.args, model.embed_tokens.weight
    caches = []
    for split in (len(prompt), len(prompt) + 1):  # prompt then one decode / all in one prefill
        kv = SequenceKV.empty(
            a.num_layers, a.num_kv_heads, a.head_dim, len(prompt) + 1, weight.dtype, page_size=4
        )
        tokens = [*prompt, 7]
        model(torch.tensor(tokens[:split]), [SeqSlice(0, split, kv)])
        kv.advance(split)
        if split == len(prompt):
            model(torch.tensor([7]), [SeqSlice(0, 1, kv)])
            assert kv.num_tokens == len(prompt)  # the forward does not advance the cursor
        caches.append(kv.data)  # a pool of its own: only this sequence's pages are written
    torch.testing.assert_close(caches[0], caches[1], atol=1e-5, rtol=0)


def test_rope_table_rows_equal_the_per_forward_tables(model: CausalLM) -> None:
    args = model.args
    table = RopeTable(args, torch.float32, torch.device("cpu"))
    positions = torch.tensor([0, 1, 17, 255, args.max_position_embeddings - 1])
    expected = ops.rope_cos_sin(positions, args.rope_theta, args.head_dim, torch.float32)
    got = table.lookup(positions)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    out = (torch.zeros(8, 1, args.head_dim), torch.zeros(8, 1, args.head_dim))
    into = table.lookup(positions, out=out)
    assert all(torch.equal(a, b) for a, b in zip(into, expected, strict=True))
    assert into[0].data_ptr() == out[0].data_ptr()  # written into the caller's buffer


def test_rotary_equals_hf_rotate_half() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 6, 16, generator=gen)
    positions = torch.tensor([0, 3, 9, 100, 2047])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))  # HF's tables
    emb = (positions.float()[:, None] * inv_freq).repeat(1, 2)[:, None, :]
    hf = x * emb.cos() + torch.cat((-x[..., 8:], x[..., :8]), dim=-1) * emb.sin()
    cos, sin = ops.rope_cos_sin(positions, 10000.0, 16, torch.float32)
    torch.testing.assert_close(ops.rotary(x, cos, sin), hf, atol=1e-6, rtol=0)


def test_a_kv_overflow_is_refused(model: CausalLM) -> None:
    a = model.args
    kv = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, 1, page_size=1)
    kv.advance(1)
    with pytest.raises(ValueError, match="KV overflow"):
        model(torch.tensor([1]), [SeqSlice(0, 1, kv)])


def test_batch_buckets_cover_every_batch_up_to_the_bound() -> None:
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 48, 64)
    assert batch_buckets(5) == (1, 2, 4, 5)
    for bound in (1, 3, 33, 100):
        sizes = batch_buckets(bound)
        assert sizes[-1] == bound and list(sizes) == sorted(set(sizes))
