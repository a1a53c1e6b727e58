"""Suite-wide plugins: the real control plane's fixtures, shared by every directory."""

pytest_plugins = ["tests.e2e.fixtures"]
