"""Design-decision sweeps: one YAML spec -> jobs -> local runner / cluster scripts -> report.

  spec.py    the spec format, its validation and its expansion into jobs (one MODEL_DIR each)
  runner.py  `sweep run`: jobs as `prompt-jax train` subprocesses, a status file, resume
  emit.py    `sweep emit`: TPU-VM, SLURM and plain bash scripts
  report.py  `sweep report`: metrics from each MODEL_DIR -> report.csv, report.md, PNG figures
  sweep.py   the `prompt-jax sweep` command line

Floor 4: imports train/-level helpers and below; only cli.py imports it.
"""
