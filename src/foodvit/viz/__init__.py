"""Seeing inside a model: the numbers (attention) and the pictures (figures, drawn with plotting's pyplot-free
figures). It may import model, data and the ground modules."""
