"""Native PyTorch models (llama, gemma, bert), their ops, and the safetensors loader.

`load_model(path)` is the entry point; `CausalLM.forward(input_ids, seqs)` runs a packed batch.
"""

from runtime.models.base import CausalLM, SeqSlice
from runtime.models.bert import BertEncoder
from runtime.models.config import ARCHITECTURES, ModelArgs
from runtime.models.loader import LoadedModel, load_model

__all__ = [
    "ARCHITECTURES",
    "BertEncoder",
    "CausalLM",
    "LoadedModel",
    "ModelArgs",
    "SeqSlice",
    "load_model",
]
