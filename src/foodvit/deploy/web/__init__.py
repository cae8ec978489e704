"""The demo as a static web page (foodvit export-web): the model, its preprocessing and its overlay as
ONNX graphs run in the browser by ONNX Runtime Web. Imports deploy (export, space, page) and below."""
