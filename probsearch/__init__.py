"""Entry points above the three layers: the `probsearch` command, the demo, a background server."""
