"""Hydra and launch plumbing: what torchrun, SLURM and Lightning's launcher tell a process (its rank, its
run dir's name), the config resolvers, and DDP under Hydra. Kept free of heavy imports where Hydra loads
it on every start (`--help` included)."""
