"""The model layer: the paper's ViT (vit), the Table 1 registry (variants), weight layouts and files (weights),
pre-trained weights (pretrained) and the layer table (summary). It may import data and the ground modules,
never training, deployment or the command line."""
