"""What a server start does not import until a request needs it: torch._dynamo (a model built on
meta without parameter init, runtime.models.meta; compile=auto is uncompiled on CPU), XGrammar
with transformers (the first constraint, or the compile workers' warm-up once `serve` is ready),
and with storage off SQLAlchemy and Alembic. Each costs ~1-2 s of CPU per process. Checked in a
fresh interpreter: pytest's own imports would hide them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAZY = ("torch._dynamo", "torch._inductor", "xgrammar", "transformers", "sqlalchemy", "alembic")
CODE = """
import sys
from pathlib import Path
import runtime.cli.serve
from runtime.config import Settings
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.stats import FanOut
from runtime.server import create_app
from runtime.server.preflight import preflight
settings = Settings(
    model_path={path!r}, device="cpu", storage_enabled=False, alerts_enabled=False
)
preflight(settings)
create_app(settings)  # the wiring: telemetry, rollout, status page (engines not loaded)
config = EngineConfig(
    model_path=Path({path!r}), model_name="m", device="cpu", num_threads=1,
    compile="auto",  # serve's default
)
engine = Engine(config, sink=FanOut())
engine.load()
engine.shutdown()
print(sorted(m for m in {lazy!r} if m in sys.modules))
"""


def test_a_loaded_engine_has_not_imported_what_it_does_not_use(
    demo_model_dir: Callable[[str], Path],
) -> None:
    code = CODE.format(path=str(demo_model_dir("llama")), lazy=LAZY)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
