"""The sweeps that say what runs on tpu: the OpInfo sweep (ops.py) and the model-zoo sweep
(models.py), judged by compare.py under the tolerances of tolerances.py, reported by
report.py, driven by `python -m torch_tpu validate` (cli.py).

This is the only package that imports torch.testing._internal (ops.op_db, lazily).
"""
