"""``tessera plan``: choose, validate and launch a parallelism strategy from the compiled
layer (model descriptions, the search, the validator, launch commands, the dry run)."""
