"""A toy GRPO loop that checks time-slicing does not change training results."""
