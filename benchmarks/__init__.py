"""Benchmarks: named configurations run on a BEIR directory, one JSON result per run."""
