"""atelet: the node agent (restores, checkpoints, uploads; drives the node's workers)."""
