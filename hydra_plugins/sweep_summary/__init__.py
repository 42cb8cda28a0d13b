"""The sweep summary, a Hydra callback: callback.py (what each job writes, and when the summary is rebuilt)
and summary.py (summary.csv and variants.csv, also the report's)."""
