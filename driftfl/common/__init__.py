"""What the server and the clients share: data, models, the wire protocol, config."""
