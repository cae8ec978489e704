"""The data layer: where photos come from (sources), how a split is listed and checked (folders), how one
photo is decoded safely (photos) and preprocessed (preprocess), and, with PyTorch, data sets, augmentation and
loaders. It may import the ground modules (settings, files, seeds, markup, torchrun, errors) only."""
