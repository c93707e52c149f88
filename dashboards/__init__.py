"""Grafana dashboards for kv-sidecar, generated from code (see generate.py)."""
