"""``gateway import-nginx``: read an nginx configuration and write a gateway one."""
