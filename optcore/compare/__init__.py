"""``optcore compare``, ``optcore train`` and ``optcore memory``: which optimizer, for your model.

One module per role:

- :mod:`.defaults`: the default line-up as data, and the line of ``--help`` that names it
- :mod:`.lineup`: the default line-up, and entries from names or a compare file
- :mod:`.tasks`: the task protocol and the built-in tasks (``char-lm``, ``hf-llama``, ``vision``)
- :mod:`.train`: one training run of one config on one task (the measurements)
- :mod:`.probes`: optimizer-state bytes and peak-memory probes
- :mod:`.runner`: a run in a fresh process (spawn isolation)
- :mod:`.sweep`: seeds x learning rates, the time budget, and the per-config summary
- :mod:`.tuning`: equal tuning budgets (quasi-random points, median of the studies' bests, re-seeding)
- :mod:`.study`: Optuna as the engine: every run a trial in a storage that workers share
- :mod:`.report`: the rich table, the PNG plots and ``results.json``
- :mod:`.scoring`: time to target, targets, performance profiles and the score (pure functions)
- :mod:`.scoreboard`: ``--target`` and ``--task a,b,c``: the scores of a comparison, their table and plot
- :mod:`.memory`: the ``optcore memory`` prediction (optimizer built on the meta device)
- :mod:`.commands`: the argparse subcommands

Importing this package, :mod:`.lineup` or :mod:`.commands` is cheap (no torch,
rich, matplotlib or optuna): the CLI imports them to add its subcommands.
"""
