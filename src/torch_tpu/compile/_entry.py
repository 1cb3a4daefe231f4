"""The target of torch_tpu's `torch_dynamo_backends` entry point (`tpu`).

Dynamo imports this module the first time a program asks for backend="tpu", before it
traces anything: the import readies dynamo for tpu (compile.setup_dynamo), which must
happen before the first trace, not at the first backend call.
"""
from . import backend, setup_dynamo

setup_dynamo()

__all__ = ["backend"]
