"""The leaf: what every part of stallwatch uses and that imports nothing of the project."""
