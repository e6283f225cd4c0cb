"""What is built around the model's one forward at load: compiled halves, CUDA graphs per
batch bucket (see `runtime.models.fast.build`)."""
