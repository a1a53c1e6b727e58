"""``kubectl fracgpu``: views of fracgpu's allocation state for people (see kubectl_plugin)."""
