"""The training layer: a run started or resumed (run), built, fitted and tested at its end (trainer) on its photos
(loading); the model-agnostic loop and its optimisation step (engine), optimisers and schedules (optim), the
training objectives beside the classes (objectives/: one module each and their registry), the stages trained before
a run's epochs (stages: the CNN teacher in teacher, self-supervised pre-training in pretrain), progressive resizing
(resizing), heads-only training (freezing), torch.compile (compiling), batch norms whose statistics must not count
(batchnorm), processes (distributed), TensorBoard (tracking) and the report. It may import rundir, viz, model, data
and the ground modules, never deployment or the command line."""
