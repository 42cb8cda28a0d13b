"""The project package: LightningModules, LightningDataModules and the builder every entry point shares."""

from src.launch.resolvers import register_resolvers

register_resolvers()  # configs use ${project_root:}; registered on import so every entry point has it
