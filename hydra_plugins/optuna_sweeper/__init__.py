"""This project's Optuna sweeper for Hydra (`hydra/sweeper=optuna`, configs/hydra/sweeper/optuna.yaml).

Hydra finds sweeper plugins only inside the `hydra_plugins` namespace package, hence this folder.
"""
