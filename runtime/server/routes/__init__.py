"""The HTTP routes: openai.py (/v1), health.py (/health, /ready, /metrics), admin.py (/admin),
rollout.py (/admin/rollout), legacy.py (the seed's /predict)."""
