"""Shared code of the tests that is not itself a test (no test_ prefix: pytest collects none)."""
