"""The training layer: a run built and fitted (trainer), the model-agnostic loop (engine), optimisation,
the training objectives beside the classes (objectives/: one module each and their registry), the CNN
teacher they may read (teacher), self-supervised pre-training, processes (distributed), TensorBoard and
the report. It may import rundir,
viz, model, data and the ground modules, never deployment or the command line."""
