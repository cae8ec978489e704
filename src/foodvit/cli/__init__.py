"""The `foodvit` command on top of every layer: the subcommands (main) and the options generated from the
settings (options). Entry points set what is process-wide (warnings, signals, threads, seeds); the library does not."""
