"""The ways in from other tools: argparse flags from schemas (:mod:`.argparse`),
and the training stacks. Each module imports its library only when used."""
