"""The training layer: a run built and fitted (trainer), the model-agnostic loop (engine), optimisation,
auxiliary losses (drloc, masked, guidance, distill, contrast; wired in auxiliary.py), self-supervised pre-training, processes (distributed), TensorBoard and the report. It may import rundir,
viz, model, data and the ground modules, never deployment or the command line."""
