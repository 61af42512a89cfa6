"""The labels lanectl puts on what it creates, so that it finds its own images, containers and services again."""

LABEL_PREFIX = "io.lanectl."
# Labels on services; their containers get FLEET_* labels only, so the local lane code
# (which lists containers labelled io.lanectl.lane) never mistakes a Swarm task for a local lane.
FLEET_LABEL = LABEL_PREFIX + "fleet"
LEASE_LABEL = LABEL_PREFIX + "lease"
