"""The adaptive batch policy.

controller.py   the control law and the controller that owns the batch-size limit
throughput.py   its input: the share of saturation throughput delivered (busy x tokens/s ÷ best)
step_model.py   the online model of step time against the work in a step
buckets.py      one bucket of it: a measured knot and the within-bucket covariances
curve.py        the fitted curve: knots moved to a mix, the best throughput, the share
fit.py          the least-squares helpers (non-negative slopes)
warmup.py       the load-time sweep of batch sizes that seeds the model
utilization.py  the source protocols, the busy-fraction tracker, a fake source for tests
(batch_goal, the trade-off as one word mapped to a band, is in runtime.settings.engine)
"""
