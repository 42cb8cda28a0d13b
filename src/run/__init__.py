"""The run lifecycle, which every entry point shares and a user rarely needs to open: `build()` puts a run
together; preflight checks the config before anything heavy starts; the run record (run.json) says what
ran and how it ended; resume continues a named run; checkpoints are written atomically and checked before
they are loaded; the loggers and extras carry this template's fixes and conveniences."""
