"""The labels lanectl puts on what it creates, so that it finds its own images, containers and services again."""

LABEL_PREFIX = "io.lanectl."
# Labels on services; their containers get FLEET_* labels only, so the local lane code
# (which lists containers labelled io.lanectl.lane) never mistakes a Swarm task for a local lane.
FLEET_LABEL = LABEL_PREFIX + "fleet"
LEASE_LABEL = LABEL_PREFIX + "lease"
# On a node, one per service placed there: the mark of the service's spec when the node last passed its gate. A
# node label, not a service label: writing a service's labels is a service update, which would replace the
# PreviousSpec that Swarm's rollback goes back to.
GATED_LABEL_PREFIX = LABEL_PREFIX + "gated."
# Set on a container when lanectl creates it, never on an image: a container inherits its image's labels
# (recipe, lane, inputs), so those say only what it was made from. This one holds the name lanectl gave it,
# so a container lanectl did not create (a hand-run `docker run` of a lane image) has none, and one renamed
# since has another name than its own.
CREATED_AS_LABEL = LABEL_PREFIX + "container"
# Also set at creation: the digest of the container's whole spec, and the spec's fields it was made from
# (secret values only as keyed digests), so a plan can tell what changed in the recipe since.
SPEC_LABEL = LABEL_PREFIX + "spec"
SPEC_FIELDS_LABEL = LABEL_PREFIX + "spec-fields"
# Also set at creation: the state folder whose journal and state files count on the container (its real path). One
# engine has one state: a switch from another folder is refused rather than stopping or pruning what it counts on.
STATE_DIR_LABEL = LABEL_PREFIX + "state-dir"
