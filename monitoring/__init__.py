"""fastllm monitoring package."""
