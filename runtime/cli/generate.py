"""`fastllm generate`: one completion from a local checkpoint, printed to stdout (and only it)."""

from __future__ import annotations

from pathlib import Path

import click

from runtime.cli.params import Bounded, Finite
from runtime.errors import InvalidRequestError

EPILOG = """\b
Examples:
  fastllm generate --model demo-models/llama-tiny "The cache stores"
  fastllm generate --model demo-models/llama-tiny --temperature 0.8 --top-p 0.9 --seed 1 "Hello"
  fastllm generate --model demo-models/llama-tiny --chat --stop "\\n" "What is decode?"
"""


@click.command("generate", epilog=EPILOG)
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="HuggingFace-layout model directory.",
)
@click.option(
    "--max-tokens",
    type=Bounded(1, 1 << 20),
    default=64,
    show_default=True,
    help="Completion tokens at most.",
)
@click.option(
    "--temperature", type=Finite(0.0, 2.0), default=0.0, show_default=True, help="0 = greedy."
)
@click.option(
    "--top-p",
    type=Finite(0.0, 1.0, min_open=True),
    default=1.0,
    show_default=True,
    help="Nucleus sampling mass.",
)
@click.option(
    "--top-k",
    type=Bounded(0, 1 << 20),
    default=0,
    show_default=True,
    help="Keep the k most likely (0 = off).",
)
@click.option(
    "--seed", type=Bounded(0, 2**63 - 1), default=None, help="Seed for a repeatable sample."
)
@click.option("--stop", multiple=True, help="Stop string (repeatable); not printed.")
@click.option("--ignore-eos", is_flag=True, help="Keep going past the end-of-sequence token.")
@click.option("--chat", is_flag=True, help="Wrap PROMPT as a user message (chat template).")
@click.option("--dtype", default="float32", show_default=True, help="float32|bfloat16|float16")
@click.option("--device", default="auto", show_default=True, help="auto|cpu|cuda[:N]")
@click.argument("prompt")
def command(
    model_dir: Path,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool,
    chat: bool,
    dtype: str,
    device: str,
    prompt: str,
) -> None:
    """Generate a completion of PROMPT with the model in --model (greedy by default)."""
    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model

    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=stop,
        ignore_eos=ignore_eos,
    )

    loaded = load_model(model_dir, dtype=dtype, device=device)
    if loaded.tokenizer is None:  # pragma: no cover - load_model loads it by default
        raise InvalidRequestError(f"{model_dir} has no tokenizer")
    text = (
        loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        if chat
        else prompt
    )
    (result,) = generate(loaded, [text], params)
    click.echo(result.text)
