"""The durable scheduler: GroupWorkflow, the node registry, and the pure lock queue."""
