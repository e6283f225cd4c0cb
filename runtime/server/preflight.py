"""Checks `fastllm serve` runs before building anything, so a setting that cannot work is one line
naming the setting, its variable and what was expected (the CLI exits 2), not a traceback from
deep inside the wiring. A database that is merely down is no startup error: the writer retries
(and spools at shutdown)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from runtime.config import Settings
from runtime.errors import ConfigError


def _invalid(name: str, problem: str, expected: str) -> ConfigError:
    return ConfigError(
        f"invalid setting {name} (FASTLLM_{name.upper()}, --config YAML or flag): {problem}; "
        f"expected {expected}",
        param=name,
    )


def preflight(settings: Settings) -> None:
    if settings.loras:
        _check_loras(settings)
    if settings.storage_enabled:
        _check_storage(settings)
    _check_device(settings.device)
    _check_quantization(settings)


def _check_storage(settings: Settings) -> None:
    # imported here: the storage package pulls in SQLAlchemy and Alembic (~0.8 s of CPU), which a
    # server with storage off never needs
    from storage.db import make_engine
    from storage.errors import StorageError
    from storage.spool import default_spool_path

    expected = "sqlite:///PATH (a writable directory) or postgresql+psycopg://USER@HOST/DB"
    try:
        engine = make_engine(settings.database_url)  # parses, loads the driver, makes the dir
    except StorageError as exc:
        raise _invalid("database_url", exc.message, expected) from None
    database = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    engine.dispose()
    if database and database != ":memory:" and not database.startswith("file:"):
        problem = _unwritable(Path(database).expanduser().parent)
        if problem:
            raise _invalid("database_url", problem, expected)
    spool = settings.log_spool_path or default_spool_path(settings.database_url)
    if spool is not None:
        problem = _unwritable(Path(spool).expanduser().parent)
        if problem:
            raise _invalid("log_spool_path", problem, "a file path in a writable directory")


def _unwritable(directory: Path) -> str | None:
    """Why files cannot be created in `directory` (created if missing), or None."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return f"cannot create files in {directory} ({exc.strerror or exc})"
    return None


def _check_device(device: str) -> None:
    import torch

    expected = "auto, cpu, or a device this machine has"
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            found = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise _invalid("device", f"{device!r} requested but this machine has {found}", expected)
    if device == "mps" and not torch.backends.mps.is_available():
        raise _invalid("device", "'mps' requested but MPS is not available", expected)


def _check_quantization(settings: Settings) -> None:
    """fp8 runs only on CUDA of compute capability 8.9+; int4's group must be a kernel's."""
    import torch

    from runtime.models.quant import INT4_GROUP_SIZES

    if settings.quantization == "fp8":
        from runtime.models.quant_fp8 import check_fp8_device

        device = settings.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            check_fp8_device(torch.device(device))
        except ConfigError as exc:
            raise _invalid("quantization", exc.message, "none, int8 or int4 here") from None
    if settings.quantization == "int4" and settings.quant_group_size not in INT4_GROUP_SIZES:
        raise _invalid(
            "quant_group_size",
            f"{settings.quant_group_size} is not a group size torch's int4 kernel takes",
            ", ".join(map(str, INT4_GROUP_SIZES)),
        )


def _check_loras(settings: Settings) -> None:
    """Each `--lora` read and validated against the model's config now: a bad adapter is one
    line and exit 2, not a model that fails to load later."""
    from runtime.models.loader import read_args
    from runtime.models.lora import LoraAdapterError, read_adapter
    from runtime.models.lora.peft import resolve_adapter_path

    model = Path(settings.model_path)
    args = read_args(model) if (model / "config.json").is_file() else None  # GGUF: at load
    for name, path in settings.lora_modules().items():
        try:
            resolved = resolve_adapter_path(path, settings.lora_dir)
            if args is not None:
                read_adapter(resolved, args, max_rank=settings.max_lora_rank)
        except LoraAdapterError as exc:
            raise ConfigError(f"invalid setting loras (--lora {name}): {exc.message}") from None
