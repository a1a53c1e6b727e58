"""fracgpu certs."""
