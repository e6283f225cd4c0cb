"""Serving above one engine: which version answers (router.py, rollout.py) and several replicas
behind one EngineClient fed by the work-stealing policy (replicas.py, work_queues.py)."""
