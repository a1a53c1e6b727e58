"""fracgpu agent."""
