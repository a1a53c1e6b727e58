"""``fracgpu-bench guard``: CI's performance guard against a committed baseline."""
