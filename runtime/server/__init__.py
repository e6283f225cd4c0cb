"""The OpenAI-compatible HTTP server (FastAPI on uvicorn), one package per feature.

app.py        create_app(settings | state) and the lifespan (start parts, load, stop)
wiring.py     settings -> engines, router, metrics, traces, storage, alerts (ServerState)
state.py      ServerState: what one app instance holds
auth.py       API keys (/v1) and the admin token (/admin); the one comparison of secrets
errors.py     the error body and handlers; failure records for the metrics
preflight.py  settings checked before anything is built (`fastllm serve` exits 2 on a bad one)
lifecycle.py  graceful drain on SIGTERM, run_server()
offload.py    heavy request work off the event loop: a small pool, large JSON in pieces
prompts.py    a prompt rendered and tokenized off the loop, its length bound checked first
routes/       /health, /ready, /metrics; /admin; the legacy /predict
edge/         admission: the ASGI guard (key, readiness, drain, body limits, UTF-8, catch-all
              500) and the connection bounds below the app
openai/       the API: /v1/*, /tokenize, its schemas, generation, streaming, logprobs, choices,
              structured output, tool calling, the prefix cache's tenants
status/       the status page at / and its read-only data (/status/api/*, /api/v1/query*), its
              panel catalogue, facts, access rule and static files
rollout/      canary rollout's server side: the controller's wiring and /admin/rollout
"""

from runtime.server.app import create_app
from runtime.server.lifecycle import run_server

__all__ = ["create_app", "run_server"]
