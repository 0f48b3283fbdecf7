"""What-if sweeps: a base scenario and axes to vary, run on Dask, results written as rows finish."""
