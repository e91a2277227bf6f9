"""The shipped recipes (YAML) and accelerate / DeepSpeed configs, found by name through ``importlib.resources``."""
