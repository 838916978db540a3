"""retrax's applications: the `retrax` command (`cli`) and what it runs.

`jobs` (train, sample), `run_commands` (eval, sample of any run),
`hf_runs`/`trax_runs` (convert), `plot`, `bench`, and `trainer` (the runner
behind `python -m retrax.trainer`). They print and exit; the library they
call never does.
"""
