"""The training layer: a run started or resumed (run), built and fitted (trainer) and tested at its end
(final), the model-agnostic loop (engine) and its optimisation step (step), optimisation, the training
objectives beside the classes (objectives/: one module each and their registry), the CNN teacher they may
read (teacher), self-supervised pre-training, processes (distributed), TensorBoard and the report. It may
import rundir, viz, model, data and the ground modules, never deployment or the command line."""
