"""fp8 (e4m3) weights on Hopper-class GPUs: W8A8 through `torch._scaled_mm`.

Weights are quantized per output channel, activations per token at run time (both scales in
fp32). `torch._scaled_mm` needs compute capability 8.9 or newer (Ada, Hopper); anywhere else the
setting is refused with a ConfigError before anything is quantized. The reference path reads
`weight`: the dequantized fp8 values in fp32, so verification measures the kernel's error
(including activation rounding to fp8), not the weights' quantization.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from runtime.errors import ConfigError
from runtime.models.quant import QuantizedLinear, QuantReport

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value


def check_fp8_device(device: torch.device) -> None:
    """Refuse fp8 where `torch._scaled_mm` cannot run it."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ConfigError(
            "quantization fp8 needs a CUDA device of compute capability >= 8.9 (Ada/Hopper); "
            "use int8 or int4 on this device",
            param="quantization",
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ConfigError(
            f"quantization fp8 needs compute capability >= 8.9; this GPU is {major}.{minor}",
            param="quantization",
        )


class Fp8Linear(QuantizedLinear):
    method = "fp8"
    codes_t: Tensor  # [in, out] e4m3, a column-major view as `torch._scaled_mm` wants it
    scales: Tensor  # [1, out] fp32

    def __init__(self, codes: Tensor, scales: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.register_buffer(
            "codes_t", codes.t(), persistent=False
        )  # [in, out] column-major view for _scaled_mm
        self.register_buffer("scales", scales.float().view(1, -1), persistent=False)  # [1, out]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = codes.shape
        self.group_size = self.in_features

    @classmethod
    def quantize(
        cls, name: str, weight: Tensor, bias: Tensor | None
    ) -> tuple[Fp8Linear, QuantReport]:
        check_fp8_device(weight.device)
        w = weight.float()
        scales = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX  # [out]
        codes = (w / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        layer = cls(codes, scales, bias)
        diff = w - layer.weight
        return layer, QuantReport(
            name=name,
            method="fp8",
            group_size=layer.group_size,
            weight_bytes=layer.weight_bytes,
            float_bytes=weight.nbytes,
            max_abs_error=float(diff.abs().max()),
            rel_rms_error=float(diff.norm() / w.norm().clamp(min=1e-12)),
        )

    @property
    def weight(self) -> Tensor:
        return (self.codes_t.float() * self.scales).t()

    @property
    def weight_bytes(self) -> int:
        return self.codes_t.nbytes + self.scales.nbytes

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX  # [T, 1]
        x8 = (x2 / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        y = torch._scaled_mm(
            x8, self.codes_t, scale_a=x_scale, scale_b=self.scales, out_dtype=torch.bfloat16
        ).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)
