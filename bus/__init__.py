"""NATS plumbing shared by hub, spoke and burst: embedded server, connection, JetStream.

Keeps nats-py behind our own small surface (upstream is splitting the client into new packages).
"""
