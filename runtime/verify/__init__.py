"""Sampled verification: the production result recomputed on the reference path.

verifier.py   the sampler and worker thread (off the hot path); emits VerificationResult
jobs.py       VerifyJob and verify_jobs: a batch of finished requests checked on the reference path
probes.py     per-op probes: fast op vs its reference on the same inputs
reference.py  whole-sequence forward in float32 with the `*_ref` ops
"""
