"""Weight-only quantized linear layers: int8 (per output channel) and int4 (group-wise, asymmetric).

The kernels are torch's own CPU/CUDA weight-only GEMMs (`torch._weight_int8pack_mm`,
`torch._weight_int4pack_mm_for_cpu` / `torch._weight_int4pack_mm`); docs/quantization.md has the
figures that chose them over a bf16 or f32 dense GEMM on this project's CPU. Both kernels take
bf16 activations on CPU (their f32 variants are 7-20x slower than the f32 dense GEMM, measured),
so the layer casts its input to bf16 for the kernel and its output back to the serving dtype.

Verification stays honest (DESIGN.md "Quantized weights"): `weight` is the dequantized [out, in]
matrix of the *same* codes and scales the kernel reads, in fp32, so the reference path computes
with identical weights and an anomaly measures kernel error, not quantization error. Scales are
rounded to bf16 when quantizing, so the kernel's bf16 scales and the reference's fp32 ones are the
same numbers.

The layers' tensors are non-persistent buffers: the kernels' packed forms differ per device and
torch release, so they are derived at load from the stored codes (runtime.models.quant_checkpoint)
and never appear in a state dict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from runtime.errors import ConfigError, ModelLoadError
from runtime.models import cpu_kernels

__all__ = [
    "INT4_GROUP_SIZES",
    "METHODS",
    "Int4Linear",
    "Int8Linear",
    "QuantReport",
]

METHODS = ("int8", "int4", "fp8")
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4 kernels accept
_PACK_BLOCK_N = 64  # torch's CPU int4 layout packs 64 output rows per block (checked at pack time)


@dataclass
class QuantReport:
    """One quantized layer: its name, format and the error quantization itself made."""

    name: str
    method: str  # int8 | int4 | fp8
    group_size: int  # input features per scale (int8: in_features, i.e. per output channel)
    weight_bytes: int  # bytes the layer's weights now occupy (codes + scales + zeros)
    float_bytes: int  # bytes the same weights took in the serving dtype
    max_abs_error: float  # max |W - dequantized W| over the layer
    rel_rms_error: float  # ||W - deq W|| / ||W||


class QuantizedLinear(nn.Module):
    """What every quantized projection offers beside `forward` and `weight` (the dequantized
    fp32 matrix): the residual add the decoder layer folds into its float GEMMs."""

    in_features: int
    out_features: int
    bias: nn.Parameter | None
    # a dense bf16 copy of the weight, run for calls of at least `dense_min_rows` rows
    # (runtime.models.dense_batch); None: every call runs the quantized kernel
    dense: Tensor | None

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("dense", None, persistent=False)
        self.dense_min_rows = 0
        # the weights as runtime.models.cpu_kernels's AVX2 kernels read them (every call without
        # the dense copy runs them); () where those kernels are not used
        self.gemv: tuple[Tensor, ...] = ()

    def attach_dense(self, dense: Tensor, min_rows: int) -> None:
        if dense.shape != (self.out_features, self.in_features) or min_rows < 1:
            raise ValueError(f"a dense copy of [{self.out_features}, {self.in_features}] rows")
        self.dense, self.dense_min_rows = dense, min_rows

    @property
    def packed_device(self) -> torch.device:
        """Where the layer's kernel runs."""
        return next(iter(self.buffers())).device

    def quantized_forward(self, x2: Tensor) -> Tensor:
        """[rows, in] bf16 -> [rows, out] through the quantized kernel (no bias)."""
        raise NotImplementedError

    def gemv_forward(self, x2: Tensor) -> Tensor:
        """[rows, in] -> [rows, out] fp32 through runtime.models.cpu_kernels's kernel."""
        raise NotImplementedError

    def kernel_forward(self, x2: Tensor) -> Tensor:
        """[rows, in] -> [rows, out] through the layer's quantized kernel: the AVX2 kernels where
        packed, else torch's (bf16 activations)."""
        if self.gemv:
            return self.gemv_forward(x2)
        return self.quantized_forward(x2.to(torch.bfloat16))

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        dense = self.dense
        if dense is not None and x2.shape[0] >= self.dense_min_rows:
            y = nn.functional.linear(x2.to(dense.dtype), dense)
        else:
            y = self.kernel_forward(x2)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def add_to_(self, out: Tensor, x: Tensor) -> Tensor:
        """out [T, out_features] += self(x), in place (the kernels cannot accumulate)."""
        return out.add_(self(x))

    def weight_rows(self, index: Tensor) -> Tensor:
        """Rows `index` of the dequantized fp32 weight (the logit probe reads a few rows of the
        LM head; a layer with a cheaper gather overrides this)."""
        weight = self.weight
        assert isinstance(weight, Tensor)
        return weight[index]


# torch's CPU int8 weight-only GEMM loads its operands with aligned AVX-512 moves and kills the
# process with a general protection fault where they are not (measured, torch 2.13 on a
# Sapphire Rapids CPU): codes starting 1 byte off, or rows of K codes with K not a multiple of
# 16 (a tensor-parallel shard of a small model), once a call has 4 rows or more; an input
# starting 16 bytes off at any row count. safetensors hands out mmap views at whatever offset
# the file's layout gives, and torch's allocator aligns to 64 bytes.
_KERNEL_ALIGNMENT = 64
_KERNEL_K_MULTIPLE = 16


def _kernel_aligned(t: Tensor) -> Tensor:
    """`t` contiguous and starting on a 64-byte boundary: itself when it is, else a copy."""
    t = t.contiguous()
    if t.device.type != "cpu" or t.data_ptr() % _KERNEL_ALIGNMENT == 0:
        return t
    return t.clone()


def _bf16_exact(t: Tensor) -> Tensor:
    """fp32 values that bf16 represents exactly (the kernel's scale dtype)."""
    return t.to(torch.bfloat16).float()


class Int8Linear(QuantizedLinear):
    """y = x (s ⊙ Q)^T (+ b): Q int8 [out, in], one scale per output row."""

    method = "int8"
    codes: Tensor  # [out, in] int8
    kernel_codes: Tensor  # `codes`, or on CPU with in % 16 != 0 a copy with zero columns added
    scales: Tensor  # [out] fp32, bf16-exact (the reference's copy)
    scales_bf16: Tensor  # [out] the kernel's copy

    def __init__(self, codes: Tensor, scales: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if codes.dtype != torch.int8 or codes.dim() != 2 or scales.shape != codes.shape[:1]:
            raise ModelLoadError(
                f"int8 weights need int8 codes [out, in] and scales [out]; got codes "
                f"{codes.dtype} {list(codes.shape)}, scales {list(scales.shape)}"
            )
        codes = _kernel_aligned(codes)
        self.register_buffer("codes", codes, persistent=False)  # [out, in]
        # zero columns change no product; the input gets the same zeros in `forward`
        self.pad = -codes.shape[1] % _KERNEL_K_MULTIPLE if codes.device.type == "cpu" else 0
        kernel_codes = nn.functional.pad(codes, (0, self.pad)) if self.pad else codes
        self.register_buffer("kernel_codes", kernel_codes, persistent=False)
        self.register_buffer("scales", _bf16_exact(scales.float()), persistent=False)  # [out]
        self.register_buffer("scales_bf16", self.scales.to(torch.bfloat16), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.in_features = codes.shape[1]
        self.out_features = codes.shape[0]
        self.group_size = self.in_features
        if codes.device.type == "cpu" and cpu_kernels.enabled():
            self.gemv = cpu_kernels.pack_int8(self.codes, self.scales)  # shares the codes

    @classmethod
    def quantize(cls, weight: Tensor, bias: Tensor | None) -> Int8Linear:
        """Symmetric per-row quantization of an [out, in] float weight."""
        w = weight.float()
        scales = _bf16_exact(w.abs().amax(dim=1).clamp(min=1e-8) / 127.0)
        codes = torch.round(w / scales[:, None]).clamp(-128, 127).to(torch.int8)
        return cls(codes, scales, bias)

    @property
    def weight(self) -> Tensor:
        """The dequantized [out, in] weight in fp32 (what the reference path computes with)."""
        return self.codes.float() * self.scales[:, None]

    def weight_rows(self, index: Tensor) -> Tensor:
        return self.codes[index].float() * self.scales[index, None]

    @property
    def weight_bytes(self) -> int:
        return self.codes.nbytes + self.scales_bf16.nbytes

    def gemv_forward(self, x2: Tensor) -> Tensor:
        return cpu_kernels.int8_mm(x2, self.gemv)

    def quantized_forward(self, x2: Tensor) -> Tensor:
        if self.pad:  # a fresh, aligned copy
            x2 = nn.functional.pad(x2, (0, self.pad))
        elif not torch.compiler.is_compiling():  # a compiled graph's buffers are its own
            x2 = _kernel_aligned(x2)  # a bf16 input is not copied by `.to`: it may be a view
        return torch._weight_int8pack_mm(x2, self.kernel_codes, self.scales_bf16)


class Int4Linear(QuantizedLinear):
    """y = x W^T (+ b) with W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n], g = k // group.

    `q` are 4-bit codes in torch's packed layout for its int4 kernel; `scales_zeros` is
    [in / group, out, 2] (scale, zero). GGUF's Q4_1 (w = d * q + m) is this with scale = d and
    zero = m + 8 d; Q4_0 (w = d * (q - 8)) with zero = 0."""

    method = "int4"
    packed: Tensor  # the kernel's packed codes
    own_codes: Tensor  # two codes a byte, only where `packed` is not read back (else empty)
    scales_zeros: Tensor  # [in / group, out, 2] fp32, bf16-exact (the reference's copy)
    scales_zeros_bf16: Tensor  # the kernel's copy

    def __init__(
        self, codes: Tensor, scales: Tensor, zeros: Tensor, group_size: int, bias: Tensor | None
    ) -> None:
        """codes int [out, in] in 0..15; scales, zeros [out, in / group_size]."""
        super().__init__()
        out_f, in_f = codes.shape
        if group_size not in INT4_GROUP_SIZES or in_f % group_size:
            raise ModelLoadError(
                f"int4 group size {group_size} unsupported for in_features {in_f} (need one of "
                f"{list(INT4_GROUP_SIZES)} dividing it)"
            )
        groups = in_f // group_size
        if scales.shape != (out_f, groups) or zeros.shape != (out_f, groups):
            raise ModelLoadError(
                f"int4 scales/zeros must be [{out_f}, {groups}]; got {list(scales.shape)} and "
                f"{list(zeros.shape)}"
            )
        codes32 = codes.to(torch.int32).contiguous()
        if codes32.min() < 0 or codes32.max() > 15:
            raise ModelLoadError("int4 codes must lie in 0..15")
        self.is_cuda = codes32.is_cuda
        if self.is_cuda:  # torch's CUDA kernel takes two codes a byte, then its own tiling
            pairs = (codes32[:, ::2] << 4 | codes32[:, 1::2]).to(torch.uint8)
            packed = torch._convert_weight_to_int4pack(pairs, 8)
            self._own_codes = True
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(codes32, 1)
            # keep our own copy of the codes only when torch's layout is not one we can read
            self._own_codes = not torch.equal(_unpack_cpu_int4(packed, out_f, in_f), codes32)
        self.register_buffer("packed", packed, persistent=False)
        if not self.is_cuda and cpu_kernels.enabled():  # a layout of its own: a second copy
            exact = _bf16_exact(scales.float()), _bf16_exact(zeros.float())
            self.gemv = cpu_kernels.pack_int4(codes32, *exact, group_size)
        # the AVX2 kernels' copy, where there is one, is read back instead of a copy of our own
        self._own_codes = self._own_codes and not self.gemv
        own = _pack_nibbles(codes32) if self._own_codes else torch.empty(0, dtype=torch.uint8)
        self.register_buffer("own_codes", own, persistent=False)
        sz = torch.stack([_bf16_exact(scales.float()).t(), _bf16_exact(zeros.float()).t()], -1)
        self.register_buffer(
            "scales_zeros", sz.contiguous(), persistent=False
        )  # [groups, out, 2] fp32
        self.register_buffer(
            "scales_zeros_bf16", sz.to(torch.bfloat16).contiguous(), persistent=False
        )
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features, self.group_size = in_f, out_f, group_size

    @classmethod
    def quantize(cls, weight: Tensor, bias: Tensor | None, group_size: int = 32) -> Int4Linear:
        """Asymmetric group-wise quantization (min/max per group) of an [out, in] weight."""
        out_f, in_f = weight.shape
        if group_size not in INT4_GROUP_SIZES or in_f % group_size:
            raise ConfigError(
                f"int4 group size {group_size} does not divide in_features {in_f}",
                param="quantization",
            )
        w = weight.float().view(out_f, in_f // group_size, group_size)
        lo, hi = w.amin(-1), w.amax(-1)
        scales = _bf16_exact((hi - lo).clamp(min=1e-8) / 15.0)
        zeros = _bf16_exact(lo + 8.0 * scales)
        q = torch.round((w - (zeros - 8.0 * scales)[..., None]) / scales[..., None]).clamp(0, 15)
        return cls(q.view(out_f, in_f), scales, zeros, group_size, bias)

    def codes(self) -> Tensor:
        """The 4-bit codes [out, in] as int32."""
        if self.gemv:
            return cpu_kernels.unpack_int4(self.gemv[0])
        if self._own_codes:
            return _unpack_nibbles(self.own_codes, self.out_features, self.in_features)
        return _unpack_cpu_int4(self.packed, self.out_features, self.in_features)

    @property
    def weight(self) -> Tensor:
        """The dequantized [out, in] weight in fp32 (what the reference path computes with)."""
        groups = self.in_features // self.group_size
        q = self.codes().float().view(self.out_features, groups, self.group_size)
        scale = self.scales_zeros[..., 0].t()[..., None]  # [out, groups, 1]
        zero = self.scales_zeros[..., 1].t()[..., None]
        return ((q - 8.0) * scale + zero).view(self.out_features, self.in_features)

    @property
    def weight_bytes(self) -> int:
        gemv = sum(t.nbytes for t in self.gemv)  # the AVX2 kernels' own copy, where packed
        return self.packed.nbytes + self.own_codes.nbytes + self.scales_zeros_bf16.nbytes + gemv

    def gemv_forward(self, x2: Tensor) -> Tensor:
        return cpu_kernels.int4_mm(x2, self.gemv)

    def quantized_forward(self, x2: Tensor) -> Tensor:
        kernel = torch._weight_int4pack_mm if self.is_cuda else torch._weight_int4pack_mm_for_cpu
        return kernel(x2, self.packed, self.group_size, self.scales_zeros_bf16)


def _unpack_cpu_int4(packed: Tensor, out_f: int, in_f: int) -> Tensor:
    """torch's CPU int4 layout as observed: [out/64, in, 32] bytes, the low nibble of byte i for
    row 64 b + i and the high nibble for row 64 b + 32 + i. Checked against the codes at pack
    time; a torch whose layout differs makes the layer keep its own copy instead."""
    if out_f % _PACK_BLOCK_N or packed.numel() * 2 != out_f * in_f:
        return torch.full((out_f, in_f), -1, dtype=torch.int32)
    v = packed.view(out_f // _PACK_BLOCK_N, in_f, _PACK_BLOCK_N // 2)
    both = torch.cat([v & 0xF, v >> 4], dim=-1).to(torch.int32)  # [blocks, in, 64]
    return both.permute(0, 2, 1).reshape(out_f, in_f)


def _pack_nibbles(codes: Tensor) -> Tensor:
    flat = codes.to(torch.uint8).flatten()
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return (flat[0::2] | (flat[1::2] << 4)).contiguous()


def _unpack_nibbles(packed: Tensor, out_f: int, in_f: int) -> Tensor:
    both = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten()[: out_f * in_f]
    return both.to(torch.int32).view(out_f, in_f)


def report(name: str, weight: Tensor, layer: Int8Linear | Int4Linear) -> QuantReport:
    w = weight.float()
    diff = w - layer.weight
    return QuantReport(
        name=name,
        method=layer.method,
        group_size=layer.group_size,
        weight_bytes=layer.weight_bytes,
        float_bytes=weight.nbytes,
        max_abs_error=float(diff.abs().max()),
        rel_rms_error=float(diff.norm() / w.norm().clamp(min=1e-12)),
    )
