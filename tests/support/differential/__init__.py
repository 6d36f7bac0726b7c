"""The nginx differential: scenarios, a model of nginx's limit_req / limit_conn, and the harness
that replays each scenario against nginx and the gateway and compares them with the model."""
