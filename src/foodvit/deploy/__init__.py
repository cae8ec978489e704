"""The deployment layer: every use of a trained model goes through the Predictor (PyTorch or ONNX Runtime);
evaluation and prediction (inference), export, the server and its page, the Space. It may import rundir, viz,
model, data and the ground modules, never training or the command line."""
