"""Choosing a recipe without the test split: k-fold cross-validation over the training photos
(cv.py) and a search over settings on top of it (search.py, Optuna). A layer above training and
deploy: a fold trains through the trainer and is scored through the Predictor."""
