"""The settings layer: what a run and its model are set to, as plain data (frozen dataclasses) that config.json,
study.json and the recipes hold. fields (a field's help, flag, range and choices; the ranges), model (ViTConfig,
and VitSettings generated from it), objectives (each training objective's section, and the one table of them), run
(RunConfig: the sections), overrides (a setting by its name, "section.name"), layout (the flat layout's names).
It imports the ground modules only, and never PyTorch (a contract): the command line's help and the ONNX path stay
fast without it."""
