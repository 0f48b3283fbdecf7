"""The CLI's commands beside clustersim/cli.py, one module per group (calibration, catalogs, offload,
planning, testbed) and the shared output helpers (support): the top layer, which nothing imports."""
