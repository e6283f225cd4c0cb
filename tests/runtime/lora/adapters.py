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
    init_std: float = 0.2,
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
                    param.copy_(init_std * torch.randn_like(param))
    model.save_pretrained(out, safe_serialization=True)
    return out


def peft_reference(base: Path, adapter: Path):
    """transformers + PeftModel.from_pretrained, fp32, eval."""
    from peft import PeftModel

    from tests.runtime.models.builders import hf_model

    return PeftModel.from_pretrained(hf_model(base), adapter).eval()


def bad_adapters(good: Path, root: Path) -> dict[str, Path]:
    """Broken copies of a good adapter, by what is wrong with them."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    config = json.loads((good / "adapter_config.json").read_text())
    tensors = load_file(good / "adapter_model.safetensors")
    out: dict[str, Path] = {}

    def make(name: str, cfg: dict | None, state: dict | None, pickle: bool = False) -> None:
        path = root / name
        path.mkdir(parents=True)
        if cfg is not None:
            (path / "adapter_config.json").write_text(json.dumps(cfg))
        if state is not None and pickle:
            torch.save(state, path / "adapter_model.bin")
        elif state is not None:
            save_file(state, path / "adapter_model.safetensors")
        out[name] = path

    make("missing_weights", config, None)
    make("missing_config", None, tensors)
    make("pickle", config, tensors, pickle=True)
    make("rank_above_bound", {**config, "r": 64}, tensors)
    wrong = dict(tensors)
    first_a = next(k for k in wrong if k.endswith("lora_A.weight"))
    wrong[first_a] = torch.zeros(wrong[first_a].shape[0], wrong[first_a].shape[1] + 1)
    make("wrong_shape", config, wrong)
    make("dora", {**config, "use_dora": True}, tensors)
    (root / "not_json").mkdir()
    shutil.copy(good / "adapter_model.safetensors", root / "not_json")
    (root / "not_json" / "adapter_config.json").write_text("{r: 4")
    out["not_json"] = root / "not_json"
    out["nowhere"] = root / "does-not-exist"
    return out
