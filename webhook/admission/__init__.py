"""The admission pipeline: a review in; allow, patch or deny out, over a StateBackend."""
