"""ateworker: one worker process hosting many actor sandboxes (see substrate.services.workloads)."""
