"""Logit parity of our LoRA forward with transformers + peft (`PeftModel.from_pretrained`), fp32,
on the tiny llama with random-initialised adapters (A and B != 0): one sequence alone, and a
packed batch mixing two adapters and base rows over paged KV (prefill then decode)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.models import CausalLM, SeqSlice, load_model
from runtime.models.lora import LoraGroup, lora_forward, pack_adapter, read_adapter
from runtime.models.lora.weights import cpu_buffer
from tests.runtime.lora.adapters import make_adapter, peft_reference
from tests.runtime.models.builders import build_llama, hf_model
from tests.runtime.models.paged import Pages

TOL = 1e-4
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("base"), tokenizer=False)


@pytest.fixture(scope="module")
def ours(base: Path) -> CausalLM:
    model = load_model(base, device="cpu", load_tokenizer=False).model
    assert isinstance(model, CausalLM)
    return model


def _weights(model: CausalLM, path: Path):
    adapter = read_adapter(path, model.args, max_rank=16)
    return pack_adapter(adapter, model.args, cpu_buffer(adapter, model.args, torch.float32))


def _step(model: CausalLM, pages: Pages, chunks, adapters) -> list[torch.Tensor]:
    """One packed forward; `adapters[i]` the weights of chunk i (None: base). Chunks must come
    grouped by adapter, as the engine orders them."""
    seqs, ids, groups = [], [], []
    for (kv, tokens), weights in zip(chunks, adapters, strict=True):
        assert pages.cache.ensure(kv, len(tokens))
        start = len(ids)
        seqs.append(SeqSlice(start, start + len(tokens), kv))
        ids += tokens
        if weights is not None:
            if groups and groups[-1].weights is weights:
                groups[-1] = LoraGroup(groups[-1].start, len(ids), weights)
            else:
                groups.append(LoraGroup(start, len(ids), weights))
    hidden = lora_forward(model, torch.tensor(ids), seqs, groups)
    logits = model.compute_logits(hidden)
    for seq in seqs:
        seq.kv.advance(seq.end - seq.start)
    return [logits[s.start : s.end] for s in seqs]


def _reference(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize(
    ("targets", "rslora"), [(ALL, False), (("q_proj", "v_proj"), True), (("down_proj",), False)]
)
def test_one_adapter_matches_peft(ours, base, tmp_path, targets, rslora) -> None:
    path = make_adapter(base, tmp_path / "a", targets=targets, use_rslora=rslora)
    weights = _weights(ours, path)
    reference = peft_reference(base, path)
    tokens = torch.randint(
        0, ours.args.vocab_size, (9,), generator=torch.Generator().manual_seed(3)
    )
    pages = Pages(ours)
    (got,) = _step(ours, pages, [(pages.new(), tokens.tolist())], [weights])
    want = _reference(reference, tokens.tolist())
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    # the adapter changes the model (B != 0), so parity is not the base model's by accident
    assert (want - _reference(hf_model(base), tokens.tolist())).abs().max() > 1e-2


def test_mixed_batch_two_adapters_and_base(ours, base, tmp_path) -> None:
    """Rows of adapter 1, adapter 2 and the base in one forward, prefill then two decodes:
    each row's logits are its own model's (PEFT for the adapters, transformers for the base)."""
    p1 = make_adapter(base, tmp_path / "a1", targets=ALL, seed=1)
    p2 = make_adapter(base, tmp_path / "a2", rank=8, targets=("q_proj", "up_proj"), seed=2)
    w1, w2 = _weights(ours, p1), _weights(ours, p2)
    refs = [hf_model(base), peft_reference(base, p1), peft_reference(base, p2)]
    gen = torch.Generator().manual_seed(5)
    prompts = [
        torch.randint(0, ours.args.vocab_size, (n,), generator=gen).tolist() for n in (5, 7, 3, 6)
    ]
    owners = [0, 1, 1, 2]  # base, a1, a1, a2 (grouped by adapter)
    weights = [None, w1, w1, w2]
    pages = Pages(ours)
    kvs = [pages.new() for _ in prompts]
    tokens = [list(p) for p in prompts]
    got = _step(ours, pages, list(zip(kvs, tokens, strict=True)), weights)
    for _ in range(2):
        for i, logits in enumerate(got):
            want = _reference(refs[owners[i]], tokens[i])
            torch.testing.assert_close(logits, want[-logits.shape[0] :], atol=TOL, rtol=0)
        nxt = [int(logits[-1].argmax()) for logits in got]
        for t, n in zip(tokens, nxt, strict=True):
            t.append(n)
        got = _step(ours, pages, [(kv, [n]) for kv, n in zip(kvs, nxt, strict=True)], weights)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_base_matches_peft_on_the_dequantized_weights(base, tmp_path, method) -> None:
    """Quantized base weights: the delta is added in the activation dtype beside the quantized
    GEMM. Reference: transformers + PEFT on a model holding the dequantized values of the same
    quantized weights (as runtime.verify's reference does for the base). The quantized kernels
    run their GEMM in bf16, so the base alone is off the reference by its own kernel error; the
    adapter must add nothing to it (the delta itself is computed in fp32)."""
    ours = load_model(base, device="cpu", load_tokenizer=False, quantization=method).model
    assert isinstance(ours, CausalLM)
    path = make_adapter(base, tmp_path / "a", targets=ALL)
    hf = hf_model(base)
    a = ours.args
    with torch.no_grad():
        for ours_layer, hf_layer in zip(ours.layers, hf.model.layers, strict=True):
            qkv = ours_layer.attn.qkv_proj.weight.float()
            q, k, v = qkv.split([a.q_size, a.kv_size, a.kv_size])
            attn = hf_layer.self_attn
            for module, w in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v)):
                module.weight.copy_(w)
            attn.o_proj.weight.copy_(ours_layer.attn.o_proj.weight.float())
            gate, up = ours_layer.mlp.gate_up_proj.weight.float().split(a.intermediate_size)
            hf_layer.mlp.gate_proj.weight.copy_(gate)
            hf_layer.mlp.up_proj.weight.copy_(up)
            hf_layer.mlp.down_proj.weight.copy_(ours_layer.mlp.down_proj.weight.float())
    from peft import PeftModel

    tokens = torch.randint(0, a.vocab_size, (8,), generator=torch.Generator().manual_seed(4))
    base_want = _reference(hf, tokens.tolist())
    reference = PeftModel.from_pretrained(hf, path).eval()
    want = _reference(reference, tokens.tolist())
    pages = Pages(ours)
    base_got, got = _step(
        ours, pages, [(pages.new(), tokens.tolist()), (pages.new(), tokens.tolist())],
        [None, _weights(ours, path)],
    )  # fmt: skip
    kernel_error = (base_got - base_want).abs().max()
    assert kernel_error <= 1e-2 * base_want.abs().max()  # tests/runtime/models/test_quant.py
    assert (got - want).abs().max() <= 2 * kernel_error + TOL
    assert (want - base_want).abs().max() > 20 * kernel_error  # the adapter does matter
