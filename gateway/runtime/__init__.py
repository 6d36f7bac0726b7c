"""Processes: one serving process, the master of ``workers: N``, their listeners and pid file.

``server``: one serving process (listeners, pipeline, reload, drain); ``supervisor``: the master
that starts workers and owns the shared store; ``node``: what a node serves beside traffic (admin
API, metrics listener, bans, zone state), wired once for both; ``listeners``: client sockets and
how a reload changes them; ``pidfile``: where the running process is found; ``notify``: systemd's
readiness protocol (READY=1, RELOADING=1, STOPPING=1).
"""
