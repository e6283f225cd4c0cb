"""The adaptive batch policy: the controller that owns the batch-size limit (controller.py) and
where it reads utilization from (utilization.py)."""
