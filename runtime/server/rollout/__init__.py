"""Canary rollout's server side (the controller itself is runtime.serving.rollout).

wiring.py  a RolloutController per app: its events as metrics, alert rows and engine drains;
           RolloutSync with the peers
routes.py  /admin/rollout (status, set, promote, rollback) and /admin/rollout/sync
"""
