"""LoRA parity on the real model (SmolLM2-135M-Instruct, converted to fp32 safetensors): a
random-initialised PEFT adapter (A, B != 0) on all seven projections, our logits against
transformers + `PeftModel.from_pretrained` on the same checkpoint, beside a base row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.models import CausalLM, load_model
from runtime.models.lora import pack_adapter, read_adapter
from runtime.models.lora.weights import cpu_buffer
from tests.runtime.lora.adapters import make_adapter, peft_reference
from tests.runtime.lora.conftest import ALL
from tests.runtime.lora.test_parity import _reference, _step
from tests.runtime.models.builders import hf_model
from tests.runtime.models.paged import Pages

pytestmark = pytest.mark.real_model
# fp32 both sides: only summation order differs; 135M parameters, 30 layers, vocabulary 49,152
# (the base alone: 1e-3 in tests/runtime/models/test_gguf_real.py; measured here 5e-5 for both
# the base and the adapted rows, with B at 0.02 std: an adapter's effect of ~2.5 on the logits)
TOL = 1e-4


def test_smollm2_adapter_matches_peft(smollm2_dir: Path, tmp_path: Path) -> None:
    ours = load_model(smollm2_dir, device="cpu", dtype="float32", load_tokenizer=False).model
    assert isinstance(ours, CausalLM)
    path = make_adapter(
        smollm2_dir, tmp_path / "adapter", rank=8, alpha=16, targets=ALL, init_std=0.02
    )
    adapter = read_adapter(path, ours.args, max_rank=16)
    weights = pack_adapter(adapter, ours.args, cpu_buffer(adapter, ours.args, torch.float32))
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, ours.args.vocab_size, (12,), generator=gen).tolist()
    pages = Pages(ours, num_pages=8, page_size=16)
    base_got, got = _step(
        ours, pages, [(pages.new(), tokens), (pages.new(), tokens)], [None, weights]
    )
    want = _reference(peft_reference(smollm2_dir, path), tokens)
    base_want = _reference(hf_model(smollm2_dir), tokens)
    torch.testing.assert_close(base_got, base_want, atol=1e-3, rtol=0)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert (want - base_want).abs().max() > 1e-2  # the adapter matters
