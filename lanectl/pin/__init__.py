"""Moving the vLLM pin: what a release's own source says would break in each lane before the box boots it."""
