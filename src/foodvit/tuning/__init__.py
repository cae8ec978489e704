"""Choosing a recipe without the test split: k-fold cross-validation over the training photos
(cv.py; the photos' folds in folds.py, one fold's run in fold.py), a study's folder and what it is
(study.py), two finished studies paired photo by photo (compare.py) and a search over settings on
top of them (search.py, Optuna). A layer above training and deploy: a fold trains through the
trainer and is scored through the Predictor."""
