"""The AVX2 int4/int8 kernels (runtime.models.cpu_kernels) against the dequantized fp32 reference,
and the layers' choice of them: every call where enabled, torch's kernels elsewhere."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.errors import ConfigError
from runtime.models import cpu_kernels, ops
from runtime.models.batch_plan import BatchPlan, SeqSlice
from runtime.models.fast import precompiled
from runtime.models.loader import load_model
from runtime.models.quant import Int4Linear, Int8Linear
from runtime.models.quantize import weight_bytes_by_format
from tests.runtime.models.paged import Pages

# the activations are rounded to int8 in blocks of 32 (llama.cpp's trade, module doc): a layer's
# output stays within 2% of its largest entry against fp32 on the same dequantized weights
KERNEL_REL_TOL = 2e-2


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels on (FASTLLM_CPU_KERNELS=on), built; a skip only where they cannot run here."""
    if not cpu_kernels.cpu_supports():
        pytest.skip("the CPU has no AVX2")
    monkeypatch.setenv("FASTLLM_CPU_KERNELS", "on")
    if not cpu_kernels.enabled():
        message = f"the AVX2 kernels did not build: {cpu_kernels.build_error()}"
        if os.environ.get("FASTLLM_REQUIRE_BINARIES") == "1":
            pytest.fail(message)
        pytest.skip(message)


def _weights(out_f: int, in_f: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_f, in_f, generator=g), torch.randn(out_f, generator=g)


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool((got - expected).abs().max() <= KERNEL_REL_TOL * expected.abs().max())


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 3, 70])
@pytest.mark.parametrize("shape", [(144, 128), (1536, 576), (576, 1536)])
def test_int4_kernel_matches_the_dequantized_weight(
    kernels: None, group_size: int, rows: int, shape: tuple[int, int]
) -> None:
    """70 rows run the many-row order, across its chunks of 64 rows."""
    if shape[1] % group_size:
        group_size = 32  # 576 = 18 x 32: 64 and 128 do not divide it
    weight, bias = _weights(*shape)
    layer = Int4Linear.quantize(weight, bias, group_size)
    assert layer.gemv, "an int4 layer on CPU packs for the kernels when they are on"
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(1))
    got = cpu_kernels.int4_mm(x, layer.gemv)
    assert got.dtype == torch.float32 and got.shape == (rows, shape[0])
    assert _close(got, x @ layer.weight.t())
    # the codes read back from the kernel's layout are the layer's (its reference weight)
    assert torch.equal(cpu_kernels.unpack_int4(layer.gemv[0]), layer.codes())


def test_int4_kernel_on_codes_made_here(kernels: None) -> None:
    """Codes, scales and zeros made here, not by the layer (132 rows: 33 tiles of four; 130 do
    not tile and are refused): w = (q - 8) s + z per group of 32."""
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (132, 96), generator=g, dtype=torch.int32)
    scales = torch.rand(132, 3, generator=g) * 0.1 + 0.01
    zeros = torch.randn(132, 3, generator=g) * 0.1
    packed = cpu_kernels.pack_int4(codes, scales, zeros, 32)
    assert torch.equal(cpu_kernels.unpack_int4(packed[0]), codes)
    weight = (codes.float().view(132, 3, 32) - 8) * scales[..., None] + zeros[..., None]
    x = torch.randn(2, 96, generator=g)
    assert _close(cpu_kernels.int4_mm(x, packed), x @ weight.view(132, 96).t())
    assert cpu_kernels.pack_int4(codes[:130], scales[:130], zeros[:130], 32) == ()


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("shape", [(49152 // 64, 576), (131, 64)])
def test_int8_kernel_matches_the_dequantized_weight(
    kernels: None, rows: int, shape: tuple[int, int]
) -> None:
    weight, bias = _weights(*shape)
    layer = Int8Linear.quantize(weight, bias)
    assert layer.gemv and layer.gemv[0].data_ptr() == layer.codes.data_ptr()  # shared codes
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(2))
    assert _close(cpu_kernels.int8_mm(x, layer.gemv), x @ layer.weight.t())


@pytest.mark.parametrize("rows", [70, 5])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_every_call_runs_the_kernel_each_row_as_alone(
    kernels: None, method: str, rows: int
) -> None:
    """A call of many rows (a prefill) runs the kernel with its loops turned round (each tile of
    weights serves every row): each row's result is bit for bit its one-row call's, across the
    chunks of 64 rows, int4's groups of 8 rows (70 = 64 + 6; 5: fewer than a group) and an int8
    layer's last, partial tile of 3 rows included."""
    out_f = 195 if method == "int8" else 192
    weight, bias = _weights(out_f, 576)
    layer = (
        Int8Linear.quantize(weight, bias) if method == "int8" else Int4Linear.quantize(weight, bias)
    )
    mm = cpu_kernels.int8_mm if method == "int8" else cpu_kernels.int4_mm
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(3))
    one = layer(x[:1])
    assert torch.equal(one, mm(x[:1], layer.gemv) + bias)  # this kernel, then the bias
    assert torch.equal(layer(x[:1].view(1, 1, -1)).view(1, -1), one)  # 1 x 1 rows: one row
    many = layer(x)
    assert torch.equal(many, mm(x, layer.gemv) + bias)
    alone = torch.cat([mm(x[i : i + 1], layer.gemv) for i in range(len(x))]) + bias
    assert torch.equal(many, alone)
    expected = F.linear(x, layer.weight, bias)
    assert _close(one, expected[:1]) and _close(many, expected)


def test_shapes_the_layout_cannot_hold_stay_on_torchs_kernel(kernels: None) -> None:
    weight, _ = _weights(64, 48)  # in_features not a multiple of 32
    assert Int8Linear.quantize(weight, None).gemv == ()
    codes = torch.zeros(8, 64, dtype=torch.int32)
    huge = torch.full((8, 2), 1e6)  # beyond float16's range
    assert cpu_kernels.pack_int4(codes, huge, torch.zeros(8, 2), 32) == ()
    layer = Int4Linear.quantize(*_weights(64, 64))
    with pytest.raises(RuntimeError, match="x's K must match"):
        cpu_kernels.int4_mm(torch.randn(1, 32), layer.gemv)
    with pytest.raises(RuntimeError, match=r"codes: uint8 \[N, K/2\]"):
        cpu_kernels.int4_mm(torch.randn(1, 64), (layer.gemv[0].flatten(), *layer.gemv[1:]))


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLLM_CPU_KERNELS", "off")
    assert not cpu_kernels.enabled()
    assert Int4Linear.quantize(*_weights(64, 64)).gemv == ()
    monkeypatch.setenv("FASTLLM_CPU_KERNELS", "sometimes")
    with pytest.raises(ConfigError, match="FASTLLM_CPU_KERNELS must be one of auto, on, off"):
        cpu_kernels.enabled()
    # auto: not where torch's kernels have their AVX-512 paths
    monkeypatch.setenv("FASTLLM_CPU_KERNELS", "auto")
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)
    assert not cpu_kernels.enabled()


def test_a_quantized_model_decodes_a_token_on_the_kernels_as_on_torchs(
    kernels: None, demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny llama, int4 with an int8 head: a one-token forward's logits on the kernels
    against the same model on torch's kernels (FASTLLM_CPU_KERNELS=off at load)."""
    path = demo_model_dir("llama")
    ours = load_model(path, device="cpu", quantization="int4", quantize_lm_head=True)
    monkeypatch.setenv("FASTLLM_CPU_KERNELS", "off")
    theirs = load_model(path, device="cpu", quantization="int4", quantize_lm_head=True)
    quantized = (Int4Linear, Int8Linear)
    assert all(not m.gemv for m in theirs.model.modules() if isinstance(m, quantized))
    layers = [m for m in ours.model.modules() if isinstance(m, Int4Linear | Int8Linear)]
    # every layer the layout holds packs (the tiny llama's down_proj, 176 inputs, does not)
    assert layers and all(bool(m.gemv) == (m.in_features % 32 == 0) for m in layers)
    logits = []
    for loaded in (ours, theirs):
        pages = Pages(loaded.model)
        kv = pages.new()
        with torch.inference_mode():
            pages.step([(kv, [5, 17, 3, 9])])  # 4 rows: the many-row order on ours
            (last,) = pages.step([(kv, [11])])  # one row: the AVX2 kernels on ours
        logits.append(last)
    assert not torch.equal(logits[0], logits[1])  # different kernels ran
    assert _close(logits[0], logits[1])
    # a compiled step saved with the kernels in its graph is not loaded for a model without
    assert precompiled.layout_key(ours.model) != precompiled.layout_key(theirs.model)
    # the kernels' copy of the int4 codes replaces the layer's own (never a third copy)
    assert (
        weight_bytes_by_format(ours.model)["int4"]
        <= 1.3 * weight_bytes_by_format(theirs.model)["int4"]
    )


def test_decode_attention_writes_the_pool_and_matches_sdpa(kernels: None) -> None:
    """One token of a sequence whose page table is 6, 2, 4 (not one run: a prefix shared from
    the cache sits where it was first written), 9 tokens before it (page size 4): the pool gets
    its K/V at page 4, slot 1, and every query head attends to its KV head's 10 positions as
    `ops.attention` does (fp32, another order of summation). A table that does not reach the
    token, or names a page outside the pool, is refused."""
    g = torch.Generator().manual_seed(6)
    num_heads, num_kv_heads, head_dim, pages, size = 9, 3, 64, 8, 4
    pool = torch.randn(2, num_kv_heads, pages, size, head_dim, generator=g)
    qkv = torch.randn(1, num_heads + 2 * num_kv_heads, head_dim, generator=g)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)  # views, as the model's
    table, past = [6, 2, 4], 9
    expected_pool = pool.clone()
    expected_pool[0, :, 4, 1], expected_pool[1, :, 4, 1] = k[0], v[0]
    run = expected_pool[:, :, table].reshape(2, num_kv_heads, len(table) * size, head_dim)
    run = run[:, :, : past + 1]
    expected = ops.attention(q.transpose(0, 1), run[0], run[1], causal_offset=past)
    got = torch.ops.fastllm_cpu.decode_attend(q, k, v, pool, table, past)
    assert torch.equal(pool, expected_pool)
    assert got.shape == (1, num_heads, head_dim)
    torch.testing.assert_close(got, expected.transpose(0, 1), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.fastllm_cpu.decode_attend(q, k, v, pool, [pages - 1], size)
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.fastllm_cpu.decode_attend(q, k, v, pool, [6, pages], size)
    assert torch.equal(pool, expected_pool)


def test_decode_attention_of_many_rows_is_each_rows_lone_call(kernels: None) -> None:
    """A decode step of four sequences in one call (decode_attend_rows): rows 0 and 1 share a
    prefix page (3), row 2 starts at position 0, row 3's table is out of order. Each row's
    output and K/V write are bit for bit its own decode_attend call's. Bad input (a table that
    does not reach the token, a page outside the pool, two rows writing one slot, starts that
    disagree with the rows) is refused with nothing written."""
    g = torch.Generator().manual_seed(7)
    num_heads, num_kv_heads, head_dim, num_pages, size = 9, 3, 64, 12, 4
    pool = torch.randn(2, num_kv_heads, num_pages, size, head_dim, generator=g)
    tables = [[3, 5], [3, 7, 8], [1], [10, 0, 6]]
    pasts = [5, 9, 0, 11]
    rows = len(tables)
    qkv = torch.randn(rows, num_heads + 2 * num_kv_heads, head_dim, generator=g)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    flat = [page for table in tables for page in table]
    starts = [0, 2, 5, 6, 9]
    expected_pool = pool.clone()
    expected = [
        torch.ops.fastllm_cpu.decode_attend(
            q[r : r + 1], k[r : r + 1], v[r : r + 1], expected_pool, tables[r], pasts[r]
        )
        for r in range(rows)
    ]
    before = pool.clone()
    got = torch.ops.fastllm_cpu.decode_attend_rows(q, k, v, pool, flat, starts, pasts)
    assert got.shape == (rows, num_heads, head_dim)
    assert torch.equal(got, torch.cat(expected))
    assert torch.equal(pool, expected_pool)
    assert not torch.equal(pool, before)
    bad = [
        ("outside the pool", (flat, starts, [5, 9, 0, 12])),  # row 3's table ends at 11
        ("outside the pool", ([*flat[:-1], num_pages], starts, pasts)),
        ("the same slot", ([3, 5, 3, 5, 8, 1, 10, 0, 6], starts, [5, 5, 0, 11])),
        ("disagree on the rows", (flat, starts[:-1], pasts)),
        ("from 0 to the tables' length", (flat, [0, 2, 5, 6, 8], pasts)),
    ]
    after = pool.clone()
    for message, (pages, row_starts, row_pasts) in bad:
        with pytest.raises(RuntimeError, match=message):
            torch.ops.fastllm_cpu.decode_attend_rows(q, k, v, pool, pages, row_starts, row_pasts)
    assert torch.equal(pool, after)


def test_a_decode_step_of_several_sequences_runs_the_fused_attention(
    kernels: None, demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny llama in fp32 decoding three sequences of different lengths together: a model
    loaded with the kernels on plans its decode steps as one call for every row (fused_rows)
    and a step with a prompt beside the decodes as before; its logits agree with one loaded
    with the kernels off."""
    plans: list[BatchPlan] = []
    build = BatchPlan.build.__func__  # type: ignore[attr-defined]

    def spy(cls: type[BatchPlan], *args: object, **kwargs: bool) -> BatchPlan:
        plans.append(build(cls, *args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(BatchPlan, "build", classmethod(spy))
    logits: dict[str, list[torch.Tensor]] = {}
    for mode in ("on", "off"):
        monkeypatch.setenv("FASTLLM_CPU_KERNELS", mode)
        model = load_model(demo_model_dir("llama"), device="cpu").model
        pages = Pages(model, page_size=4)
        a, b, c = pages.new(), pages.new(), pages.new()
        out: list[torch.Tensor] = []
        with torch.inference_mode():
            pages.step([(a, [5, 17, 3, 9, 4, 8, 2]), (b, [6, 1])])
            for t in (11, 12):
                out += pages.step([(a, [t]), (b, [t + 1])])
            out += pages.step([(a, [13]), (b, [14]), (c, [7, 8, 9])])  # a prompt beside them
            for t in (15, 16):
                out += pages.step([(a, [t]), (b, [t + 1]), (c, [t + 2])])
        logits[mode] = out
    fused = [p.fused_rows is not None for p in plans]
    assert fused == [False, True, True, False, True, True] + [False] * 6
    assert plans[1].fused_rows is not None and plans[1].key_groups == []
    for x, y in zip(logits["on"], logits["off"], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_a_lone_decode_step_runs_the_fused_attention(
    kernels: None, demo_model_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny llama in fp32 decoding one sequence: a model loaded with the kernels on takes
    the fused attention for its one-token steps (decided at load), and its logits agree with
    one loaded with them off."""
    fused: list[bool] = []
    build = BatchPlan.build.__func__  # type: ignore[attr-defined]

    def spy(cls: type[BatchPlan], *args: object, **kwargs: bool) -> BatchPlan:
        plan = build(cls, *args, **kwargs)
        fused.append(plan.fused_decode)
        return plan

    monkeypatch.setattr(BatchPlan, "build", classmethod(spy))
    logits: dict[str, list[torch.Tensor]] = {}
    for mode in ("on", "off"):
        monkeypatch.setenv("FASTLLM_CPU_KERNELS", mode)
        model = load_model(demo_model_dir("llama"), device="cpu").model
        assert model.fused_decode == (mode == "on")
        pages = Pages(model, page_size=4)
        kv = pages.new()
        with torch.inference_mode():
            pages.step([(kv, [5, 17, 3, 9, 4, 8, 2])])
            logits[mode] = [pages.step([(kv, [t])])[0] for t in (11, 12, 13)]
    assert fused == [False, True, True, True, False, False, False, False]
    for a, b in zip(logits["on"], logits["off"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def stack_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama with an intermediate size of 192: every projection divides by 32, so the
    whole stack packs (the preset's 176 leaves down_proj on torch's kernel)."""
    from runtime.models.demo import make_demo_model

    return make_demo_model(
        tmp_path_factory.mktemp("stack-llama"), overrides={"intermediate_size": 192}
    )


def _decode(
    model: torch.nn.Module, decode_threads: int | None = None, scattered: bool = False
) -> tuple:
    """A 7-token prompt, then one token a step (on `decode_threads` when given): the decode
    steps' logits and the sequence's K/V in the pool after. `scattered`: another sequence takes
    the page after the prompt's, so the decode steps' table is pages 0, 1, 3 (not one run)."""
    pages = Pages(model, page_size=4)
    kv = pages.new()
    before = torch.get_num_threads()
    with torch.inference_mode():
        pages.step([(kv, [5, 17, 3, 9, 4, 8, 2])])
        if scattered:
            assert pages.cache.ensure(pages.new(), 4)
        try:
            torch.set_num_threads(decode_threads or before)
            logits = [pages.step([(kv, [t])])[0] for t in (11, 12, 13, 14)]
        finally:
            torch.set_num_threads(before)
    # the sequence's tokens only: the rest of the pool was never written (torch.empty: whatever
    # the allocator's recycled memory held, NaN included)
    data = pages.cache.pool.data[:, :, :, kv.page_ids]  # [layers, 2, Hkv, pages, size, D]
    return logits, data.flatten(3, 4)[:, :, :, : kv.num_tokens].clone()


def test_a_lone_decode_step_runs_the_whole_stack_in_one_call(
    kernels: None, stack_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4 with an int8 head: the one-token steps go through stack.cpp (one call, every layer)
    and give the logits and the K/V the layers give on the same kernels; against torch's
    kernels (FASTLLM_CPU_KERNELS=off) within the kernels' tolerance."""
    from runtime.models.cpu_kernels.stack import FusedStack

    loaded = load_model(stack_llama_dir, device="cpu", quantization="int4", quantize_lm_head=True)
    model = loaded.model
    stack = model.fused_stack
    assert stack is not None and stack.counts == [3, 3, 3, 3] * model.args.num_layers
    calls = []
    run = FusedStack.run
    monkeypatch.setattr(FusedStack, "run", lambda self, *a: calls.append(1) or run(self, *a))
    fused_logits, fused_pool = _decode(model)
    assert len(calls) == 4  # the decode steps, not the prompt
    model.fused_stack = None  # the same model and kernels, layer by layer
    layer_logits, layer_pool = _decode(model)
    assert len(calls) == 4
    for a, b in zip(fused_logits, layer_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused_pool, layer_pool, rtol=1e-5, atol=1e-5)
    # pages that are not one run (a prefix from the cache): the stack still, the same logits
    model.fused_stack = stack
    scattered_logits, _ = _decode(model, scattered=True)
    assert len(calls) == 8
    for a, b in zip(scattered_logits, fused_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("FASTLLM_CPU_KERNELS", "off")
    theirs = load_model(stack_llama_dir, device="cpu", quantization="int4", quantize_lm_head=True)
    assert theirs.model.fused_stack is None
    for a, b in zip(fused_logits, _decode(theirs.model)[0], strict=True):
        assert _close(a, b)


def test_a_gguf_model_quantized_at_load_gets_the_stack(
    kernels: None, stack_llama_dir: Path, tmp_path: Path
) -> None:
    """A GGUF file is read to float first and quantized after: the stack is decided after the
    quantization."""
    from tests.runtime.models.gguf_files import write_gguf

    path = write_gguf(stack_llama_dir, tmp_path / "m.gguf")
    loaded = load_model(path, device="cpu", quantization="int4", load_tokenizer=False)
    assert loaded.model.fused_stack is not None


def test_which_models_take_the_stack(
    kernels: None, stack_llama_dir: Path, demo_model_dir: Callable[[str], Path]
) -> None:
    """Only a llama-family model whose every projection is on the kernels, none replaced on the
    instance: never a float model (a patched op of `ops` still runs there), not gemma (its
    (1 + w) norm and GeGLU), not a layer the layout cannot hold, not tensor parallelism's
    wrapped projections."""
    from runtime.models.cpu_kernels import stack
    from runtime.models.parallel.comm import make_row_parallel

    assert load_model(stack_llama_dir, device="cpu").model.fused_stack is None  # fp32
    gemma = load_model(demo_model_dir("gemma"), device="cpu", quantization="int4")
    assert gemma.model.fused_stack is None
    preset = load_model(demo_model_dir("llama"), device="cpu", quantization="int4")
    assert preset.model.fused_stack is None  # down_proj's 176 inputs
    model = load_model(stack_llama_dir, device="cpu", quantization="int8").model
    assert model.fused_stack is not None and set(model.fused_stack.counts) == {2}
    knobs = {"norm_offset": model.norm_offset, "mlp_act": model.mlp_act}
    assert stack.pack(model.layers, model.args, **knobs) is not None
    make_row_parallel(model.layers[1].mlp.down_proj)
    assert stack.pack(model.layers, model.args, **knobs) is None


def test_the_stack_refuses_a_bad_pack_before_touching_anything(
    kernels: None, stack_llama_dir: Path
) -> None:
    """Counts that disagree with the tensors, a projection of the wrong shape, a slot outside
    the pool: a clear error, and neither x nor the pool changed (every layer is checked first)."""
    model = load_model(stack_llama_dir, device="cpu", quantization="int4").model
    stack = model.fused_stack
    assert stack is not None
    a = model.args
    pool = torch.zeros(a.num_layers, 2, a.num_kv_heads, 4, 4, a.head_dim)
    cos, sin = model.rope_table().lookup(torch.tensor([3]))
    x = torch.randn(1, a.hidden_size)
    before = x.clone()
    op = torch.ops.fastllm_cpu.decode_stack
    common = (a.num_heads, a.intermediate_size, a.norm_eps)
    with pytest.raises(RuntimeError, match="fewer tensors than counts say"):
        op(x, stack.weights[:-1], stack.counts, cos, sin, pool, [2], 3, *common)
    swapped = list(stack.weights)
    swapped[1:4], swapped[4:7] = stack.weights[4:7], stack.weights[1:4]  # qkv <-> o: wrong shapes
    with pytest.raises(RuntimeError, match="qkv: expected"):
        op(x, swapped, stack.counts, cos, sin, pool, [2], 3, *common)
    with pytest.raises(RuntimeError, match="outside the pool"):
        op(x, stack.weights, stack.counts, cos, sin, pool, [3], 4, *common)  # one page, 5 tokens
    with pytest.raises(RuntimeError, match="outside the pool"):
        op(x, stack.weights, stack.counts, cos, sin, pool, [4], 3, *common)  # pages 0..3
    assert torch.equal(x, before) and not pool.any()
    op(x, stack.weights, stack.counts, cos.reshape(-1), sin.reshape(-1), pool, [2], 3, *common)
    assert not torch.equal(x, before) and pool[:, :, :, 2, 3].any()  # the token's K/V stored
    assert not pool[:, :, :, [0, 1, 3]].any()


def test_a_compiled_step_takes_the_stack_for_a_lone_token(
    kernels: None, stack_llama_dir: Path
) -> None:
    """The compiled step hands a lone token's step to the stack, nothing compiled for it, and
    gives the eager forward's logits."""
    from runtime.models.fast.cpu_step import CompiledStep

    model = load_model(stack_llama_dir, device="cpu", quantization="int4").model
    expected, _ = _decode(model)
    step = CompiledStep(model)
    pages = Pages(model, page_size=4)
    kv = pages.new()
    got = []
    with torch.inference_mode():
        pages.step([(kv, [5, 17, 3, 9, 4, 8, 2])])  # the prompt on the eager forward
        for token in (11, 12, 13, 14):
            assert pages.cache.ensure(kv, 1)
            ids = torch.tensor([token])
            hidden = step(ids, [SeqSlice(0, 1, kv)])
            got.append(model.compute_logits(hidden))
            kv.advance(1)
    assert step.num_compiled_steps == 0 and not step.graphs and step.is_compiled
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_stack_gives_the_same_bits_on_one_thread_and_two(
    kernels: None, stack_llama_dir: Path
) -> None:
    """Every output of the stack's kernels is summed by one thread in one order, so the
    per-step choice of threads (runtime.engine.threads) never changes a decode step's logits."""
    model = load_model(stack_llama_dir, device="cpu", quantization="int4").model
    one, one_pool = _decode(model, decode_threads=1)
    two, two_pool = _decode(model, decode_threads=2)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    assert torch.equal(one_pool, two_pool)
