"""The bundled torchrun trainer shipped to every node: ``python -m trainer --steps N --out DIR``."""
