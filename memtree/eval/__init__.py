"""Evaluation harnesses and benchmarks."""
