"""LoRA adapters (PEFT format) applied per row group inside the one forward.

    adapter = read_adapter(path, args, max_rank=16)          # validated CPU tensors (peft.py)
    weights = pack_adapter(adapter, args, buffer)  # fused per layer, one buffer (weights.py)
    hidden  = lora_forward(model, input_ids, seqs, groups)   # groups of rows (forward.py)

Nothing here runs for a batch without adapters: the engine checks one count per step.
"""

from runtime.models.lora.errors import LoraAdapterError
from runtime.models.lora.forward import LoraGroup, lora_forward
from runtime.models.lora.peft import AdapterTensors, LoraConfig, read_adapter
from runtime.models.lora.weights import LayerLora, LoraWeights, pack_adapter, packed_numel

__all__ = [
    "AdapterTensors",
    "LayerLora",
    "LoraAdapterError",
    "LoraConfig",
    "LoraGroup",
    "LoraWeights",
    "lora_forward",
    "pack_adapter",
    "packed_numel",
    "read_adapter",
]
