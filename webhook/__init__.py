"""fracgpu webhook."""
