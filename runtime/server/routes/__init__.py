"""The HTTP routes that belong to no feature package: health.py (/health, /ready, /metrics),
admin.py (/admin), legacy.py (the seed's /predict). The API's routes are in
runtime.server.openai, the status page's in runtime.server.status, rollout's in
runtime.server.rollout."""
