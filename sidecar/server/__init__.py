"""The servers at the edge: the admin endpoints and the sidecar's own metrics."""
