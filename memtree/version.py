"""The memtree-llm version: ``memtree.__version__``, and written into every backup."""

__version__ = "0.1.0"
