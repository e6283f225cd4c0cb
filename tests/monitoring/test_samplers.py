from __future__ import annotations

import psutil
import pytest
from prometheus_client import CollectorRegistry

from monitoring.samplers import MemoryCollector, gpu_memory_source
from runtime.engine.stats import AllocatorStats
from tests.monitoring import synthetic as syn


def memory(registry: CollectorRegistry, name: str, kind: str) -> float | None:
    return registry.get_sample_value(name, {"type": kind})


def test_cpu_memory_is_process_rss_and_machine_total() -> None:
    registry = CollectorRegistry()
    registry.register(MemoryCollector())
    before = psutil.Process().memory_info().rss
    rss = memory(registry, "fastllm_memory_usage", "cpu")
    after = psutil.Process().memory_info().rss
    assert rss is not None and min(before, after) * 0.9 <= rss <= max(before, after) * 1.1
    assert memory(registry, "fastllm_memory_total", "cpu") == psutil.virtual_memory().total


def test_allocator_memory_is_read_at_scrape_time() -> None:
    current: list[AllocatorStats] = [syn.allocator_stats(1)]
    registry = CollectorRegistry()
    registry.register(
        MemoryCollector(allocator_stats=lambda: current[0], allocator_total_bytes=1 << 20)
    )
    assert memory(registry, "fastllm_memory_usage", "allocator") == 1024 * (1 + 2 + 3)
    current[0] = syn.allocator_stats(5)
    assert memory(registry, "fastllm_memory_usage", "allocator") == 5 * 1024 * (1 + 2 + 3)
    assert memory(registry, "fastllm_memory_total", "allocator") == 1 << 20


def test_gpu_type_absent_on_cpu_present_with_a_source() -> None:
    assert gpu_memory_source("cpu") is None
    registry = CollectorRegistry()
    registry.register(MemoryCollector(gpu=gpu_memory_source("cpu")))
    assert memory(registry, "fastllm_memory_usage", "gpu") is None
    assert memory(registry, "fastllm_memory_total", "gpu") is None

    registry = CollectorRegistry()
    registry.register(MemoryCollector(gpu=lambda: (3 << 30, 80 << 30)))
    assert memory(registry, "fastllm_memory_usage", "gpu") == 3 << 30
    assert memory(registry, "fastllm_memory_total", "gpu") == 80 << 30


def test_a_failing_source_does_not_break_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> AllocatorStats:
        raise RuntimeError("allocator gone")

    registry = CollectorRegistry()
    registry.register(MemoryCollector(allocator_stats=broken, allocator_total_bytes=1))
    assert memory(registry, "fastllm_memory_usage", "allocator") is None
    assert memory(registry, "fastllm_memory_usage", "cpu") is not None
    assert "allocator stats unavailable" in caplog.text


@pytest.mark.cuda
def test_gpu_memory_on_cuda_matches_torch() -> None:
    import torch

    torch.cuda.init()
    read = gpu_memory_source("cuda:0")
    assert read is not None
    used, total = read()
    free, torch_total = torch.cuda.mem_get_info(0)
    assert total == torch_total
    assert 0 < used <= total
    assert abs(used - (torch_total - free)) < 0.05 * total
