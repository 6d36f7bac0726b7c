"""The gateway started through its CLI, real upstreams over real sockets: what a user sees."""
