"""Real engines driven through the product: vLLM runs (one arm per process) and the vLLM demo."""
