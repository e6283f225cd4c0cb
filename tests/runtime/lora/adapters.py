"""PEFT adapters for tests, made by `peft` itself (the reference nobody here wrote).

    path = make_adapter(base_dir, out_dir, rank=4, targets=("q_proj", "v_proj"), seed=1)

`lora_B` is random (PEFT initialises it to zero, which would make every adapter the base model),
so a test notices a dropped or misplaced delta.
"""

from __future__ import annotations

from pathlib import Path

import torch


def make_adapter(
    base: Path,
    out: Path,
    *,
    rank: int = 4,
    alpha: float = 8.0,
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    use_rslora: bool = False,
    seed: int = 1,
) -> Path:
    from peft import LoraConfig, get_peft_model

    from tests.runtime.models.builders import hf_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=use_rslora
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(hf_model(base), config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name or "lora_A" in name:
                    param.copy_(0.2 * torch.randn_like(param))
    model.save_pretrained(out, safe_serialization=True)
    return out


def peft_reference(base: Path, adapter: Path):
    """transformers + PeftModel.from_pretrained, fp32, eval."""
    from peft import PeftModel

    from tests.runtime.models.builders import hf_model

    return PeftModel.from_pretrained(hf_model(base), adapter).eval()
