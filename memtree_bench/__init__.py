"""memtree's evaluation harness: LoCoMo evidence recall against flat baselines and a
RAPTOR-style tree, LLM QA accuracy, and index scale. Run it with ``memtree bench``.

Not part of the memtree-llm wheel (users' installs carry no evaluation code): it
runs from a checkout of the repository installed with ``pip install -e ".[bench]"``.
"""
