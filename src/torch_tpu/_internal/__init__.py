"""The reference TorchTPU system's module paths, for code written against it:
`torch_tpu._internal.pallas.jax_op` is `torch_tpu.jax_op`."""
