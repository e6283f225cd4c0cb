"""BERT encoder (HF BertModel layout, post-LN) with sentence-transformers style embeddings:
mean pooling over the attention mask, then L2 normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runtime.models.config import ModelArgs

_ACTS = {
    "gelu": F.gelu,  # erf GELU
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h = args.hidden_size
        self.args = args
        self.qkv = nn.Linear(h, 3 * args.q_size)
        self.attn_out = nn.Linear(args.q_size, h)
        self.attn_norm = nn.LayerNorm(h, eps=args.norm_eps)
        self.inter = nn.Linear(h, args.intermediate_size)
        self.out = nn.Linear(args.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=args.norm_eps)
        self.act = _ACTS[args.hidden_act]

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        """x [B, S, H]; key_mask [B, 1, 1, S] bool (True = attend)."""
        batch, seq_len, _ = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.args.num_heads, self.args.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, heads, S, head_dim]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        attn = attn.transpose(1, 2).reshape(batch, seq_len, self.args.q_size)
        h = self.attn_norm(x + self.attn_out(attn))
        return self.out_norm(h + self.out(self.act(self.inter(h))))


class BertEncoder(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.embed_norm = nn.LayerNorm(args.hidden_size, eps=args.norm_eps)
        self.layers = nn.ModuleList(BertLayer(args) for _ in range(args.num_layers))

    @torch.no_grad()
    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """input_ids, attention_mask [B, S] -> last hidden state [B, S, H]."""
        seq_len = input_ids.shape[1]
        if seq_len > self.args.max_position_embeddings:
            raise ValueError(
                f"sequence of {seq_len} > {self.args.max_position_embeddings} positions"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(seq_len, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = self.embed_norm(x + self.position_embeddings(positions))
        key_mask = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_mask)
        return x

    @torch.no_grad()
    def embed(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """-> [B, H] float32: mean over unmasked tokens, L2-normalised."""
        hidden = self.forward(input_ids, attention_mask, token_type_ids).float()
        mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # [B, S, 1]
        summed = (hidden * mask).sum(dim=1)
        pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)
