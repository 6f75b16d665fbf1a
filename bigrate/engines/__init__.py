"""Engines map work over shards or parameter points and reduce the results.

Dask and Ray are imported only when their engine is used:
``from bigrate.engines.dask import DaskEngine, fit_dask``.
"""
