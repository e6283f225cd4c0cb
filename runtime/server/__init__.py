"""The OpenAI-compatible HTTP server (FastAPI on uvicorn).

app.py            create_app(settings | state) and the lifespan (start parts, load, stop)
wiring.py         settings -> engines, router, metrics, traces, storage, alerts (ServerState)
state.py          ServerState: what one app instance holds
guard.py          ASGI admission: readiness / drain 503, body limit 413, UTF-8, catch-all 500
auth.py           API keys (/v1) and the admin token (/admin)
schemas.py        pydantic request / response models (what /openapi.json documents)
errors.py         the error body and handlers; failure records for the metrics
routes/openai.py  /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models
generate.py       submit / join / usage helpers shared by the generation routes
streaming.py      server-sent events; a disconnect cancels the request
routes/health.py  /health, /ready, /metrics
routes/admin.py   /admin/batch-policy, /admin/memory
routes/status.py  the status page at / and its read-only data: /status/api/*, /api/v1/query(_range)
status_*.py       its panel catalogue (the dashboards' PromQL), query API, facts and access rule
static/           the page's HTML, scripts and stylesheet (package data, no build step)
lifecycle.py      graceful drain on SIGTERM, run_server()
"""

from runtime.server.app import create_app
from runtime.server.lifecycle import run_server

__all__ = ["create_app", "run_server"]
