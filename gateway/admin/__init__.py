"""The admin API (``admin.listen``) for operators and the CLI, and the status page.

``api``: the routes; ``guard``: checks that keep web pages away; ``token``: the generated token;
``config_view``: the configuration in force as JSON; ``statuspage/``: the page's files.
"""
