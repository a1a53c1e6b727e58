"""fracgpu bench."""
