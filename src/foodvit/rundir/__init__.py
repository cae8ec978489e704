"""A run directory, the one place that creates, locks, reads and compares runs (directory, compare); training
writes it, deployment and the command line read it. It may import viz, model, data and the ground modules."""
