"""The eager execution modes; each is a small executor behind one interface."""
