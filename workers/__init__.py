"""The processes: Temporal dev server, scheduler, gateway, node agent, and `up`."""
