"""The fast decode step (see `runtime.models.fast.build`)."""
