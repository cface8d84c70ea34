"""`mlxspec serve` in a subprocess, driven by real clients."""
