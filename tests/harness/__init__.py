"""Harnesses shared by the tests and the benchmarks: the real vLLM server, the spike and the admission suite.

They live under ``tests/`` so that the tests never import ``bench/``; the benchmarks in ``bench/`` are thin
command lines over them (``python -m bench.spike``, ``python -m bench.admission_suite``).
"""
