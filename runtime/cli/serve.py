"""`fastllm serve`: the OpenAI-compatible HTTP server on one model directory."""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path

import click

from runtime.cli.params import Bounded
from runtime.config import load_settings
from runtime.errors import ConfigError, ModelLoadError
from runtime.memory.host_malloc import (
    INSTALL_HINT,
    MallocUnavailable,
    ensure_malloc,
)


@click.command("serve")
@click.option(
    "--model",
    "model_path",
    type=click.Path(path_type=Path),
    help="checkpoint dir, or a .gguf file (served as the file name without .gguf)",
)
@click.option("--host", default=None, help="bind address (default 127.0.0.1)")
@click.option("--port", type=Bounded(0, 65535), default=None, help="port (default 8000)")
@click.option(
    "--config", "config_file", type=click.Path(exists=True, path_type=Path), help="YAML settings"
)
@click.option("--api-key", "api_keys", multiple=True, help="accepted API key (repeatable)")
@click.option("--admin-token", default=None, help="token for the /admin endpoints")
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--compile",
    "compile_mode",
    type=click.Choice(["auto", "on", "off"]),
    default=None,
    help="torch.compile the layers at load (on); default auto: nowhere",
)
@click.option(
    "--cuda-graphs",
    type=click.Choice(["auto", "on", "off"]),
    default=None,
    help="capture the decode step per batch bucket on CUDA; default auto",
)
@click.option(
    "--quantization",
    type=click.Choice(["none", "int8", "int4", "fp8"]),
    default=None,
    help="weight-only quantization of the decoder linears at load (fp8: CUDA >= 8.9)",
)
@click.option(
    "--quantize-lm-head",
    is_flag=True,
    default=None,
    help="with int8/int4: the LM head in int8 too (faster decode, lower agreement with fp32)",
)
@click.option(
    "--num-threads",
    type=Bounded(0, 1024),
    default=None,
    help="most intra-op threads for model ops (0: the physical cores); on CPU each step size "
    "runs on one or on all, whichever measured faster",
)
@click.option(
    "--batch-goal",
    type=click.Choice(["latency", "balanced", "throughput"]),
    default=None,
    help="the batch policy's trade-off, replacing min_util/max_util: latency (band 0.5-0.7), "
    "balanced (0.6-0.8, the default band) or throughput (0.9-1.0: within 10% of the best "
    "batch's tokens/s, longer steps)",
)
@click.option(
    "--enable-request-metrics",
    is_flag=True,
    default=None,
    help="a `metrics` object (queue/prefill/decode seconds, TTFT, inter-token latency, tokens/s) "
    "in every response and final stream event",
)
@click.option(
    "--scheduling-policy",
    type=click.Choice(["fcfs", "priority"]),
    default=None,
    help="priority: a request's `priority` (lower first) orders the queue and preemption",
)
@click.option(
    "--speculative-method",
    default=None,
    help="speculative decoding: ngram (prompt lookup) | self_draft | off (default off)",
)
@click.option(
    "--num-speculative-tokens",
    type=Bounded(1, 16),
    default=None,
    help="tokens drafted per decode step, 1-16 (default 4)",
)
@click.option(
    "--lora",
    "loras",
    multiple=True,
    metavar="NAME=PATH",
    help="a PEFT LoRA adapter served as model NAME (repeatable; docs/lora.md)",
)
@click.option(
    "--tensor-parallel-size",
    type=Bounded(1, 64),
    default=None,
    help="split the model over N ranks (this process and N-1 spawned workers; gloo on CPU, "
    "NCCL on CUDA); default 1",
)
def command(
    model_path: Path | None,
    host: str | None,
    port: int | None,
    config_file: Path | None,
    api_keys: tuple[str, ...],
    admin_token: str | None,
    log_level: str,
    compile_mode: str | None,
    cuda_graphs: str | None,
    quantization: str | None,
    quantize_lm_head: bool | None,
    num_threads: int | None,
    batch_goal: str | None,
    enable_request_metrics: bool | None,
    scheduling_policy: str | None,
    speculative_method: str | None = None,
    num_speculative_tokens: int | None = None,
    loras: tuple[str, ...] = (),
    tensor_parallel_size: int | None = None,
) -> None:
    """Serve a model over the OpenAI-compatible API until SIGTERM (then drain and exit 0).

    Settings: flags > FASTLLM_* environment > --config YAML > defaults.

    \b
    Example:
      fastllm serve --model demo-models/llama-tiny --port 8000
      fastllm serve --model SmolLM2-135M-Instruct.Q4_1.gguf   # a llama.cpp file, as is
      curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "llama-tiny", "prompt": "Hello", "max_tokens": 8}'
    """
    from runtime.models.gguf_io import check_gguf, is_gguf
    from runtime.server import create_app, run_server
    from runtime.server.app import freeze_startup_heap, warm_grammar_workers
    from runtime.server.edge.connections import ConnectionLimits
    from runtime.server.preflight import preflight

    settings = load_settings(
        config_file,
        model_path=model_path,
        host=host,
        port=port,
        api_keys=list(api_keys) or None,
        admin_token=admin_token,
        compile=compile_mode,
        cuda_graphs=cuda_graphs,
        quantization=quantization,
        quantize_lm_head=quantize_lm_head,
        num_threads=num_threads,
        batch_goal=batch_goal,
        enable_request_metrics=enable_request_metrics,
        scheduling_policy=scheduling_policy,
        speculative_method=speculative_method,
        num_speculative_tokens=num_speculative_tokens,
        loras=list(loras) or None,
        tensor_parallel_size=tensor_parallel_size,
    )
    allocator = _ensure_malloc(settings.malloc)  # may re-execute this process on jemalloc
    if "model_path" not in settings.model_fields_set:  # bare: the packaged real model if any
        from runtime.cli.bare_model import bare_model_path

        real = bare_model_path(lambda line: click.echo(line, err=True))
        settings = settings.model_copy(update={"model_path": real})
    for path in (settings.model_path, settings.canary_model_path, settings.embedding_model_path):
        if path is not None and is_gguf(Path(path)):
            check_gguf(Path(path))  # a bad file: one line and exit 2 before the server starts
            continue
        if path is not None and not (Path(path) / "config.json").is_file():
            raise ModelLoadError(
                f"{path} has no config.json (build the demo with `fastllm make-demo-model {path}`)"
            )
        if path is not None and (Path(path) / "tokenizer.json").is_file():
            from runtime.models.tokenizer import Tokenizer

            Tokenizer.from_dir(Path(path))  # its vocabulary and chat template: refused here
    preflight(settings)  # a setting that cannot work: one line and exit 2, not a traceback
    if settings.tensor_parallel_size > 1:  # sizes that do not divide the model: one line too
        from runtime.engine.config import EngineConfig
        from runtime.engine.tp.build import check as check_tensor_parallel

        check_tensor_parallel(EngineConfig.from_settings(settings))
    configure_logging(log_level)
    if allocator != "jemalloc" and settings.malloc == "auto":
        logging.getLogger("fastllm.server").info(
            "malloc: glibc (RSS swings with the heap's high-water mark; %s to run on jemalloc)",
            INSTALL_HINT,
        )
    app = create_app(settings)
    app.state.fastllm.after_load.append(freeze_startup_heap)
    if settings.grammar_warm:
        app.state.fastllm.after_load.append(partial(warm_grammar_workers, app.state.fastllm))
    base = f"http://{settings.host}:{settings.port}"
    click.echo(
        f"serving {settings.served_model_name} on {base}/v1 "
        f"(status page: {base}/, metrics: {base}/metrics; malloc: {allocator})",
        err=True,
    )
    rc = run_server(
        app,
        host=settings.host,
        port=settings.port,
        grace_s=settings.drain_grace_s,
        unready_s=settings.drain_unready_s,
        log_level=log_level,
        access_log=settings.access_log,
        limits=ConnectionLimits.from_settings(settings),
    )
    if rc:
        sys.exit(rc)


def _ensure_malloc(mode: str) -> str:
    try:
        return ensure_malloc(mode)
    except MallocUnavailable as exc:
        raise ConfigError(str(exc), param="malloc") from exc


# Libraries that log routine chatter at INFO: alembic (a line per plugin at every migration run)
# and APScheduler (two lines per evaluator tick, forever). At INFO an operator sees one line per
# startup phase and the access log; `--log-level debug` shows the libraries' lines again.
QUIET_AT_INFO = ("alembic", "apscheduler")


def configure_logging(log_level: str) -> None:
    level = logging.getLevelName(log_level.upper())
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for name in QUIET_AT_INFO:
        logging.getLogger(name).setLevel(logging.WARNING if level > logging.DEBUG else level)
