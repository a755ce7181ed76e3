"""``python -m memtree`` runs the command line."""

from memtree.cli import main

main()
