"""psctl's parameter-server engine: protocol, transports, roles, coordinator and recorder."""
