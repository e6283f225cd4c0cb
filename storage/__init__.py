"""fastllm storage package."""
