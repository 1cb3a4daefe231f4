"""The per-op layer under the executors: each overload's plan and cache (opcall), torch's
refusals the meta kernels skip (refusals), device-side asserts (asserts), and which
executor runs this thread's ops (current)."""
