"""The adaptive batch policy.

controller.py   the control law and the controller that owns the batch-size limit
throughput.py   its input: the share of saturation throughput delivered (busy x (1 - a/T))
step_model.py   the online model of step time against the work in a step
fit.py          the non-negative weighted least squares the model uses
warmup.py       the load-time sweep of batch sizes that seeds the model
utilization.py  the source protocols, the busy-fraction tracker, a fake source for tests
"""
