"""The `specserve` subcommands, one module each (``classifier`` and ``zoo`` hold their actions).

Each module's ``register(commands)`` adds its command's parser (its flags, help and defaults) and
the function that runs it; ``cluster/cli.py`` assembles them with the commands other packages
register under the ``specserve.commands`` entry point group (``specserve bench``, from bench/, the
layer above). ``common.py`` holds what several commands share.
"""
