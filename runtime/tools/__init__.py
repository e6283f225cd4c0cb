"""Operator tools behind CLI verbs: weight conversion (convert.py) and `fastllm doctor`."""
