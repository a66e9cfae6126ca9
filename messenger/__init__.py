"""Messenger: wire protocol, broker, dealer client, worker loop. Uses zmq + pyarrow only."""
