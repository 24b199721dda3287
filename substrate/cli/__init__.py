"""``ate``: the command line of substrate, over the client SDK (verb-noun, like kubectl).

``ate up`` starts a local stack (:mod:`substrate.cli.stack`), the other verbs talk to it
through :mod:`substrate.client`. The entry point is :func:`substrate.cli.main.main`.
"""
