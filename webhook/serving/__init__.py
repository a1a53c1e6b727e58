"""The HTTPS edge: the app, TLS reloading, big-review screening, leader forwarding."""
